"""The shared-memory channel: a CPU tensor for a process of this host goes by reference, through a pooled segment.

The sender copies the tensor into a free segment of its pool (one copy, into
memory already faulted in: a reused segment), unless it lives in a
:class:`~actorch._base.channels.leases.Lease` already, and the message
carries the segment's name and the tensor's place in it. The receiver maps the
segment (once) and gets a tensor over those bytes: no copy, and no fresh
memory to fault in. It owns that tensor as any other it receives (it may
write to it and keep it, though it cannot resize it, as with torch's shared
tensors); the sender's segment stays lent until the receiver frees it. A
received tensor sent back to the node it came from (an echo, a stage that
works in place) goes back by reference too, with no copy at all: both nodes
then hold the same memory while both keep it, as a caller and a callee of one
process share what they pass. When
the pool has no room (receivers keep what they got, or ``/dev/shm`` is full),
the tensor goes by value on the transport's path, and the statistics count it;
so it does once one node holds ``per_peer`` bytes (the system's ``send_budget``)
lent to it and not let go, so that a node that keeps what it receives, or a
frozen one, never holds the whole pool.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from actorch._base.channels.base import Arrival, Channel, Outgoing
from actorch._base.channels.landing import Landing, Landings, chunk_for
from actorch._base.channels.metadata import checked_shape, dtype_named, name_of
from actorch._base.channels.route import TensorRoute
from actorch._base.channels.segments import (
    COPY_FAILED,
    HEADER,
    SLOTS,
    Segment,
    SegmentMaps,
    SegmentPool,
    host_identity,
    remove_files,
)
from actorch._base.devices import accelerator
from actorch._base.errors import SerializationError

__all__ = ["REACH_KEY", "SEGMENTS_KEY", "SharedMemoryChannel", "dense_strides", "extent_of"]

REACH_KEY = "shm"
"""The key of a node's ``reach`` under which its host's shared memory is named (``segments.host_identity``)."""

SEGMENTS_KEY = "shm_segments"
"""The key of a node's ``reach`` giving the prefix of its segments' names (removed when it is lost)."""

Warn = Callable[[str], None]


def dense_strides(tensor: torch.Tensor) -> list[int]:
    """``tensor``'s strides if its elements fill a block of memory without overlap (any order), else contiguous ones."""
    shape, strides = tensor.shape, tensor.stride()
    order = sorted(range(len(shape)), key=lambda axis: (strides[axis], shape[axis]))
    expected = 1
    dense = True
    for axis in order:
        if shape[axis] == 1:
            continue
        if strides[axis] != expected:
            dense = False
            break
        expected *= shape[axis]
    if dense:
        return list(strides)
    contiguous = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        contiguous[axis] = contiguous[axis + 1] * max(shape[axis + 1], 1)
    return contiguous


def extent_of(shape: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int], itemsize: int) -> int:
    """Bytes from a tensor's first element to the end of its last, for ``shape`` and ``strides`` (0: no elements)."""
    if any(size == 0 for size in shape):
        return 0
    return (1 + sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True))) * itemsize


class SharedMemoryChannel(Channel):
    """CPU tensors by reference in shared memory, between processes of one host (see the module's docstring)."""

    name = REACH_KEY

    def __init__(
        self,
        pool: SegmentPool,
        maps: SegmentMaps | None = None,
        *,
        per_peer: int = 256 << 20,
        warn: Warn | None = None,
    ) -> None:
        self.pool = pool
        self.maps = maps if maps is not None else SegmentMaps()
        self.per_peer = per_peer
        self._identity = host_identity()
        self._warn = warn
        self._warned = False
        self.landings = Landings()
        self.by_value = 0
        self.peer_full = 0
        self.leased_sent = 0
        self.handed_back = 0

    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether ``tensor`` is a plain CPU tensor needing no autograd, bound for a process of this host."""
        return tensor.is_cpu and type(tensor) is torch.Tensor and not tensor.requires_grad and self.reaches(route)

    def reaches(self, route: TensorRoute) -> bool:
        """Whether ``route.dest`` shares this process's shared memory (its host, ``/dev/shm`` and user)."""
        return self._identity is not None and route.reach.get(REACH_KEY) == self._identity

    def staged(self, tensor: torch.Tensor, dest: int) -> list[Any] | None:
        """A reference to a host copy of GPU ``tensor`` in a pinned segment, with its chunk size and count.

        For the staged channel on one host: the copy is queued in chunks and
        lent at once; each chunk is marked in the segment as it lands, and the
        receiver copies it to its device then (``landing``), with no socket in
        between. None: no room, or the accelerator cannot copy it this way (it
        is staged through the transport then).
        """
        if self.pool.lent_to(dest) + tensor.nbytes > self.per_peer:
            return None
        strides = dense_strides(tensor)
        extent = extent_of(tensor.shape, strides, tensor.element_size())
        placed = self.pool.place(extent, dest)
        if placed is None:
            return None
        segment, slot, generation = placed
        assert segment.data is not None
        segment.pin()
        chunk = chunk_for(extent)
        try:
            events = accelerator().copy_in_chunks(tensor.detach(), segment.data[:extent], strides, chunk)
        except (RuntimeError, NotImplementedError):  # what CUDA refused: the transport carries it
            segment.reclaim(dest)
            return None
        segment.copying(slot, generation, len(events))
        self.landings.watch(segment, slot, generation, events)
        reference = self._reference(segment.name, segment.size, 0, extent, tensor, strides, slot, generation)
        return [reference, chunk, len(events)]

    def arriving(self, payload: Any, *, pin: bool) -> tuple[torch.Tensor, torch.Tensor, Landing, int]:
        """A staged lend (what :meth:`staged` made) on arrival: its tensor, its bytes, its landing and chunk size.

        ``pin``: the bytes are copied to a GPU from here, so the mapping is
        pinned (once) for copies that overlap the chunks still landing.

        Raises:
            SerializationError: The reference is malformed or names what cannot be mapped.
        """
        try:
            reference, chunk, chunks = payload
            name, size, _, extent, _, _, _, slot, generation = reference
        except (TypeError, ValueError):
            raise SerializationError("a staged tensor arrived in shared memory with a malformed reference") from None
        if not all(isinstance(number, int) and number > 0 for number in (extent, chunk, chunks)) or not (
            chunks == -(-extent // chunk) and chunks < COPY_FAILED
        ):
            raise SerializationError(
                f"a staged tensor of {extent!r} bytes arrived in {chunks!r} chunks of {chunk!r} bytes"
            )
        raw, host = self._received(reference)
        segment = self.maps.segment(name, size)
        if pin:
            segment.pin()
        return host, raw, Landing(segment, slot, generation, chunks), chunk

    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> list[Any] | None:
        """The segment, the tensor's place in it, and the lend; None (by value) when the pool has no room."""
        if self.pool.lent_to(route.dest) + tensor.nbytes > self.per_peer:  # the node keeps what it got: by value
            self.peer_full += 1
            self.by_value += 1
            return None
        reference = self._as_it_lies(tensor, route, out.shared)
        return reference if reference is not None else self._copied(tensor, route.dest, out.shared)

    def _as_it_lies(self, tensor: torch.Tensor, route: TensorRoute, shared: dict[Any, Any] | None) -> list[Any] | None:
        """A reference to ``tensor`` where it lies, no copy: handed back, in a lease, or placed by this multicast."""
        if tensor.is_conj() or tensor.is_neg():  # its memory holds other values: it is copied, resolved
            return None
        storage = tensor.untyped_storage().data_ptr()
        return (
            self._handed_back(tensor, storage, route)
            or self._from_lease(tensor, storage, route.dest)
            or (None if shared is None else self._lent_again(tensor, route.dest, shared))
        )

    def _from_lease(self, tensor: torch.Tensor, storage: int, dest: int) -> list[Any] | None:
        """A reference to ``tensor`` in its lease, lent as it is (the zero-copy mode), if it lies in one."""
        segment = self.pool.leased_at(storage)
        if segment is None:
            return None
        strides = list(tensor.stride())
        extent = extent_of(tensor.shape, strides, tensor.element_size())
        placed = self.pool.lend(segment, dest, extent)
        if placed is None:
            return None
        self.leased_sent += 1
        assert segment.data is not None
        offset = tensor.data_ptr() - segment.data.data_ptr()
        _, slot, generation = placed
        return self._reference(segment.name, segment.size, offset, extent, tensor, strides, slot, generation)

    def _copied(self, tensor: torch.Tensor, dest: int, shared: dict[Any, Any] | None) -> list[Any] | None:
        """A reference to a copy of ``tensor`` in a free segment; None (by value) when the pool has none."""
        original = tensor
        if tensor.is_conj() or tensor.is_neg():  # the memory holds the values before the flip
            tensor = tensor.resolve_conj().resolve_neg()
        strides = dense_strides(tensor)
        extent = extent_of(tensor.shape, strides, tensor.element_size())
        placed = self.pool.place(extent, dest)
        if placed is None:
            self._went_by_value()
            return None
        segment, slot, generation = placed
        assert segment.data is not None
        if not _copy_into(segment.data, tensor, strides, extent):
            segment.reclaim(dest)
            self.by_value += 1
            return None
        if shared is not None:
            hold = self.pool.hold(segment)  # the segment stays this node's while the placement is kept
            kept = None if hold is None else _Hold(segment, *hold)
            shared[(self.name, id(original))] = (original, segment, extent, strides, kept)
        return self._reference(segment.name, segment.size, 0, extent, tensor, strides, slot, generation)

    def _lent_again(self, tensor: torch.Tensor, dest: int, shared: dict[Any, Any]) -> list[Any] | None:
        """A reference to ``tensor`` where this multicast placed it for another node already, lent to ``dest`` too."""
        earlier = shared.get((self.name, id(tensor)))
        if earlier is None or earlier[0] is not tensor:
            return None
        _, segment, extent, strides, _ = earlier
        again = self.pool.lend(segment, dest, extent)
        if again is None:
            return None
        _, slot, generation = again
        return self._reference(segment.name, segment.size, 0, extent, tensor, strides, slot, generation)

    def _handed_back(self, tensor: torch.Tensor, storage: int, route: TensorRoute) -> list[Any] | None:
        """A reference to ``tensor`` where it lies, if it lies in a segment of ``route.dest`` lent to this node.

        A tensor received by reference and sent back to its sender (an echo,
        a stage that works in place) needs no copy: its bytes are the sender's.
        """
        held = self.maps.held_at(storage)
        prefix = route.reach.get(SEGMENTS_KEY)
        if held is None or prefix is None:
            return None
        segment, slot, generation, offset = held
        if not segment.name.startswith(prefix + "-"):
            return None
        strides = list(tensor.stride())
        extent = extent_of(tensor.shape, strides, tensor.element_size())
        segment.hand_back(slot, generation)
        self.handed_back += 1
        start = offset + tensor.data_ptr() - storage
        reference = self._reference(segment.name, segment.size, start, extent, tensor, strides, slot, generation)
        reference.append(True)
        return reference

    @staticmethod
    def _reference(
        name: str,
        size: int,
        offset: int,
        extent: int,
        tensor: torch.Tensor,
        strides: list[int],
        slot: int,
        generation: int,
    ) -> list[Any]:
        return [name, size, offset, extent, name_of(tensor.dtype), list(tensor.shape), strides, slot, generation]

    def receive(self, payload: Any, arrival: Arrival) -> torch.Tensor:
        """A tensor over the lent bytes, mapped from the sender's segment."""
        return self._received(payload)[1]

    def _received(self, payload: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The lent bytes of reference ``payload`` and the tensor over them."""
        try:
            name, size, offset, extent, dtype_name, shape, strides, slot, generation, *back = payload
        except (TypeError, ValueError):
            raise SerializationError("a tensor arrived in shared memory with a malformed reference") from None
        dtype = dtype_named(dtype_name)
        sizes, steps = checked_shape(shape, strides)
        if extent != extent_of(sizes, steps, dtype.itemsize) or (isinstance(offset, int) and offset % dtype.itemsize):
            raise SerializationError(
                f"a tensor of shape {sizes} and strides {steps} arrived in shared memory as {extent!r} bytes "
                f"at offset {offset!r}"
            )
        lent = self._taken_back(name, offset, extent, slot, generation) if back else None
        if lent is None:
            lent = self.maps.held(name, size, offset, extent, slot, generation)
        raw = torch.frombuffer(lent, dtype=torch.uint8)
        return raw, raw.view(dtype).as_strided(sizes, steps, 0)

    def _taken_back(self, name: Any, offset: Any, extent: Any, slot: Any, generation: Any) -> memoryview | None:
        """The bytes of this node's own segment that a receiver handed back, lent anew to this node itself.

        Raises:
            SerializationError: The reference names no segment of this node's, or a place outside it.
        """
        segment = self.pool.segment(name)
        if segment is None or not isinstance(slot, int) or not 0 <= slot < SLOTS:
            raise SerializationError(f"a tensor came back in shared memory segment {name!r}, not one of this node's")
        if not all(isinstance(number, int) for number in (offset, extent)) or not (
            offset >= 0 and extent > 0 and offset + extent <= segment.size
        ):
            raise SerializationError(
                f"a tensor came back in segment {name} at a malformed place ({offset!r}, {extent!r})"
            )
        placed = self.pool.hold(segment)
        segment.taken_back(slot, generation)
        if placed is None:  # every slot is out: a copy of its own, and the segment is free for the sender again
            return memoryview(bytearray(segment.view[HEADER + offset : HEADER + offset + extent]))
        own_slot, own_generation = placed
        mine = segment.view[HEADER + offset : HEADER + offset + extent]
        segment.receive(own_slot, own_generation)
        weakref.finalize(mine, segment.release, own_slot, own_generation)
        return mine

    def on_way(self, rank: int) -> int:
        """Bytes lent to node ``rank`` that it has not received yet: on their way, as a transport's backlog is."""
        return self.pool.on_way_to(rank)

    def drop(self, payload: Any) -> None:
        """A message that carried ``payload`` was dropped unread: let go of its lend at once."""
        try:
            name, size, _, _, _, _, _, slot, generation, *back = payload
            own = self.pool.segment(name)
            if own is not None and back:  # handed back to this node, which will not take it
                own.taken_back(slot, generation)
            elif own is not None:  # a message this node made and never sent
                own.receive(slot, generation)
                own.release(slot, generation)
            elif back:  # this node handed it back and never sent it: the lend stays this node's own
                self.maps.let_go_hand_back(name, size, slot, generation)
            else:
                self.maps.let_go(name, size, slot, generation)
        except (TypeError, ValueError, SerializationError):
            pass  # a malformed reference lends nothing this node could give back

    def forget(self, rank: int, reach: Mapping[str, str]) -> None:
        """Take back the segments lent to node ``rank``; remove its files if it made them on this host."""
        self.pool.forget(rank)
        prefix = reach.get(SEGMENTS_KEY)
        if prefix and reach.get(REACH_KEY) == self._identity:
            self.maps.forget(prefix)
            remove_files(prefix)

    def close(self) -> None:
        """Wait for staged copies still landing, remove this process's segment files, drop the mappings of others'."""
        self.landings.close()
        self.pool.close()
        self.maps.clear()

    def statistics(self) -> dict[str, int]:
        """The pool's counts, the segments mapped, the tensors that went by value, and those sent from leases."""
        return {
            **self.pool.statistics(),
            "mapped": self.maps.mapped,
            "by_value": self.by_value,
            "peer_full": self.peer_full,
            "from_leases": self.leased_sent,
            "handed_back": self.handed_back,
            "staged_copies_failed": self.landings.failed,
        }

    def _went_by_value(self) -> None:
        self.by_value += 1
        if self._warn is not None and not self._warned and self.pool.refused:
            self._warned = True
            self._warn(
                f"tensors for this host go by value: {self.pool.refusal}; give /dev/shm more room "
                "(docker run --shm-size=1g), or run(channels=...) without 'shm'"
            )


class _Hold:
    """A segment's lend to its own maker, given back when the placement that keeps it is let go."""

    __slots__ = ("generation", "segment", "slot")

    def __init__(self, segment: Segment, slot: int, generation: int) -> None:
        self.segment, self.slot, self.generation = segment, slot, generation

    def __del__(self) -> None:
        self.segment.release(self.slot, self.generation)


def _copy_into(data: torch.Tensor, tensor: torch.Tensor, strides: list[int], extent: int) -> bool:
    """Copy ``tensor`` to the start of ``data`` (a segment's bytes) laid out with ``strides``; False if torch cannot."""
    if list(tensor.stride()) == strides:  # its elements fill one block: copy that block's bytes, whatever the dtype
        source = torch.empty(0, dtype=torch.uint8).set_(
            tensor.untyped_storage(), tensor.storage_offset() * tensor.element_size(), (extent,), (1,)
        )
        data[:extent].copy_(source)
        return True
    target = data[:extent].view(tensor.dtype).as_strided(tensor.shape, strides, 0)
    try:
        target.copy_(tensor)
    except (RuntimeError, NotImplementedError):  # a dtype without an elementwise copy on the CPU
        return False
    return True
