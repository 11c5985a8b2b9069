"""The CUDA IPC channel: a GPU tensor for a process of this host goes by handle, through a pooled device block.

The sender copies the tensor into a block of its pool on the same GPU (device
to device, on the current stream: what arrives is what was sent, whatever the
sender does next), records the block's interprocess event after the copy, and
sends the block's IPC handle, the tensor's place in it, the event's handle and
a *ledger slot*. The receiver opens the handle (once per block: it keeps an
anchor to every block it has opened, so later tensors from it cost no system
call), makes its stream wait for the event, and gets a tensor over the
sender's block: no copy when it lands on that same GPU. Where it lands
elsewhere (the device a map names, the receiving actor's other GPU, the CPU
of an actor without a device), it is copied there and the block let go at
once. The ledger is a small file of shared host memory holding one counter
per slot: the sender sets a slot to 1 when it lends, and torch's own deleter
of the receiver's storage waits for the receiver's stream and sets it back to
0, so the sender reuses a block only once no receiver holds any of it.

A block pool holds at most a quarter of each device's memory; past it, or for
a destination that does not see the tensor's GPU (``CUDA_VISIBLE_DEVICES``,
another host), the next channel takes the tensor (a device map, or staging).
Nothing here can fail a send: what CUDA refuses makes the channel step aside.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Mapping
from typing import Any

import torch

from actorch._base.channels.base import Arrival, Channel, Outgoing
from actorch._base.channels.metadata import checked_shape, dtype_named, name_of
from actorch._base.channels.route import TensorRoute
from actorch._base.channels.segments import host_identity, segment_size
from actorch._base.channels.shm import dense_strides, extent_of
from actorch._base.errors import SerializationError

__all__ = ["REACH_KEY", "CudaIpcChannel", "device_uuids", "reach"]

REACH_KEY = "cuda_ipc"
"""The key of a node's ``reach`` naming its host and the GPUs it sees (by UUID)."""

LEDGER_SLOTS = 10_000
"""Counters in a ledger: what torch's receiving deleter maps (``CUDA_IPC_REF_COUNTER_FILE_SIZE``)."""

ANCHOR_SLOT = 0
"""The ledger slot every receiver's anchors count on: the sender never waits for it."""

POOL_FRACTION = 4
"""A block pool holds at most 1/POOL_FRACTION of its device's memory."""


@functools.cache
def device_uuids() -> tuple[str, ...]:
    """The UUIDs of the GPUs this process sees, by index; empty without CUDA (or where CUDA will not say)."""
    if not torch.cuda.is_available():
        return ()
    try:
        return tuple(str(torch.cuda.get_device_properties(index).uuid) for index in range(torch.cuda.device_count()))
    except (RuntimeError, AssertionError, AttributeError):
        return ()


def reach() -> str | None:
    """What this process says of its CUDA IPC reach: its host, and the GPUs it sees; None without both."""
    identity, uuids = host_identity(), device_uuids()
    if identity is None or not uuids:
        return None
    return f"{identity}|{','.join(uuids)}"


class _Ledger:
    """A sender's counters in shared host memory, one per lend; torch's receiving deleter sets each back to 0."""

    def __init__(self) -> None:
        self.storage = torch.UntypedStorage._new_using_filename_cpu(8 * LEDGER_SLOTS)
        _, name, _ = self.storage._share_filename_cpu_()
        self.name: bytes = name if isinstance(name, bytes) else str(name).encode()
        self.counters = torch.empty(0, dtype=torch.int64).set_(self.storage, 0, (LEDGER_SLOTS,), (1,))
        self.counters.zero_()
        self._free = collections.deque(range(ANCHOR_SLOT + 1, LEDGER_SLOTS))

    def take(self) -> int | None:
        """A free slot set to 1 (lent), or None when every one is out."""
        if not self._free:
            return None
        slot = self._free.popleft()
        self.counters[slot] = 1
        return slot

    def held(self, slot: int) -> bool:
        """Whether the lend in ``slot`` is still held (its receiver has not freed its storage); a free one goes back."""
        if int(self.counters[slot]) > 0:
            return True
        self._free.append(slot)
        return False

    def give_back(self, slot: int) -> None:
        """Take the lend in ``slot`` back whatever its receiver does (it is gone)."""
        self.counters[slot] = 0


class _Hold:
    """A ledger slot a block's maker holds itself, given back when the placement that keeps it is let go."""

    __slots__ = ("ledger", "slot")

    def __init__(self, ledger: _Ledger, slot: int) -> None:
        self.ledger, self.slot = ledger, slot

    def __del__(self) -> None:
        self.ledger.give_back(self.slot)


class _Block:
    """A block of one GPU's memory a sender copies tensors into, with its IPC handle and interprocess event."""

    def __init__(self, device: torch.device, size: int, uuid: str) -> None:
        self.device = device
        self.size = size
        self.uuid = uuid
        self.data = torch.empty(size, dtype=torch.uint8, device=device)
        shared = self.data.untyped_storage()._share_cuda_()  # type: ignore[no-untyped-call]
        self.handle: bytes = shared[1]
        self.base_size: int = shared[2]
        self.base_offset: int = shared[3]
        # torch counts a receiver of its own for every share; the ledger counts ours: give torch's back now,
        # so that the block is freed (not kept for a receiver that never comes) once the pool drops it.
        torch.UntypedStorage._release_ipc_counter_cuda(shared[4], shared[5])
        self.event = torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]
        self.event.record(torch.cuda.current_stream(device))  # an event must be recorded before its handle is taken
        self.event_handle: bytes = self.event.ipc_handle()  # type: ignore[no-untyped-call]
        self.lends: dict[int, int] = {}  # ledger slot -> the rank it is lent to

    def busy(self, ledger: _Ledger) -> bool:
        """Whether a receiver still holds any of it (the ledger's counters are read for those lent)."""
        for slot in [slot for slot in self.lends if not ledger.held(slot)]:
            del self.lends[slot]
        return bool(self.lends)


class CudaIpcChannel(Channel):
    """GPU tensors by CUDA IPC handle, between processes of one host (see the module's docstring)."""

    name = REACH_KEY

    def __init__(self, *, keep: int = 64) -> None:
        self._reach = reach()
        self._uuids = device_uuids()
        self._ledger: _Ledger | None = None
        self._blocks: dict[torch.device, list[_Block]] = {}
        self._bytes: dict[torch.device, int] = {}
        self._anchors: collections.OrderedDict[tuple[str, bytes], Any] = collections.OrderedDict()
        self._events: dict[tuple[str, bytes], Any] = {}
        self._keep = keep
        self.stepped_aside = 0
        self.opened = 0
        self.copied_on_arrival = 0
        self.refusal: str | None = None

    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether ``tensor`` is a plain CUDA tensor, needing no autograd, for a process that sees its GPU."""
        if self._reach is None or not tensor.is_cuda or type(tensor) is not torch.Tensor or tensor.requires_grad:
            return False
        theirs = route.reach.get(REACH_KEY)
        if theirs is None:
            return False
        host, _, seen = theirs.partition("|")
        index = tensor.device.index or 0
        return host == self._reach.partition("|")[0] and index < len(self._uuids) and self._uuids[index] in seen

    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> list[Any] | None:
        """The block's handle, the tensor's place, the event and the ledger slot; None: the next channel takes it.

        In a multicast or a :class:`~actorch.Shared` value (``out.shared``), a
        tensor placed for one node is lent as it is to the others that see its
        GPU: one copy per GPU, shared read-only.
        """
        try:
            return self._send(tensor, route, out.shared)
        except (RuntimeError, OSError) as exc:  # what CUDA or the ledger refused: a map or staging carries it
            self.stepped_aside += 1
            self.refusal = str(exc)
            return None

    def _send(self, tensor: torch.Tensor, route: TensorRoute, shared: dict[Any, Any] | None) -> list[Any] | None:
        if self._ledger is None:
            self._ledger = _Ledger()
        ledger = self._ledger
        earlier = None if shared is None else shared.get((self.name, id(tensor)))
        if earlier is not None and earlier[0] is tensor:  # placed for another node of this multicast already
            _, block, extent, strides, _ = earlier
        else:
            original = tensor
            if tensor.is_conj() or tensor.is_neg():
                tensor = tensor.resolve_conj().resolve_neg()
            strides = dense_strides(tensor)
            extent = extent_of(tensor.shape, strides, tensor.element_size())
            block = self._block(tensor.device, extent)
            if block is None:
                self.stepped_aside += 1
                return None
            target = block.data[:extent].view(tensor.dtype).as_strided(tensor.shape, strides, 0)
            target.copy_(tensor)  # on the current stream, after whatever the sender queued before sending
            block.event.record(torch.cuda.current_stream(tensor.device))
            if shared is not None:
                kept = ledger.take()  # the block stays this node's while the placement is kept
                if kept is not None:
                    block.lends[kept] = -1
                hold = None if kept is None else _Hold(ledger, kept)
                shared[(self.name, id(original))] = (original, block, extent, strides, hold)
        slot = ledger.take()
        if slot is None:
            self.stepped_aside += 1
            return None
        block.lends[slot] = route.dest
        lands = route.direct.get(str(tensor.device))
        return [
            block.uuid,
            block.handle,
            block.base_size,
            block.base_offset,
            extent,
            name_of(tensor.dtype),
            list(tensor.shape),
            strides,
            ledger.name,
            slot,
            block.event_handle,
            lands,
        ]

    def _block(self, device: torch.device, nbytes: int) -> _Block | None:
        """A free block of ``device`` with room for ``nbytes``, made if the pool has room; None if not."""
        assert self._ledger is not None
        blocks = self._blocks.setdefault(device, [])
        for block in blocks:
            if nbytes <= block.size <= max(2 * nbytes, 1 << 20) and not block.busy(self._ledger):
                return block
        size = segment_size(nbytes)
        limit = torch.cuda.get_device_properties(device).total_memory // POOL_FRACTION
        used = self._bytes.get(device, 0)
        if used + size > limit:
            for block in [block for block in blocks if not block.busy(self._ledger)]:
                blocks.remove(block)
                used -= block.size
                if used + size <= limit:
                    break
            self._bytes[device] = used
            if used + size > limit:
                return None
        index = device.index or 0
        block = _Block(device, size, self._uuids[index])
        blocks.append(block)
        self._bytes[device] = used + size
        return block

    def receive(self, payload: Any, arrival: Arrival) -> torch.Tensor:
        """A tensor over the sender's block, or its copy on the device it lands on."""
        try:
            uuid, handle, base_size, base_offset, extent, dtype_name, shape, strides, ledger, slot, event, lands = (
                payload
            )
        except (TypeError, ValueError):
            raise SerializationError("a tensor arrived by CUDA IPC with a malformed reference") from None
        dtype = dtype_named(dtype_name)
        sizes, steps = checked_shape(shape, strides)
        if (
            extent != extent_of(sizes, steps, dtype.itemsize)
            or not isinstance(slot, int)
            or not 0 < slot < LEDGER_SLOTS
        ):
            raise SerializationError(f"a tensor arrived by CUDA IPC with a malformed place ({extent!r} bytes)")
        if uuid not in self._uuids:
            raise SerializationError(f"a tensor arrived by CUDA IPC on GPU {uuid}, which this process does not see")
        device = torch.device("cuda", self._uuids.index(uuid))
        try:
            self._anchor(uuid, device, handle, base_size, base_offset, ledger)
            storage = torch.UntypedStorage._new_shared_cuda(
                device.index, handle, base_size, base_offset, ledger, slot, b"", False
            )
            self._waited(uuid, device, event)
            tensor = torch.empty(0, dtype=dtype, device=device).set_(storage, 0, sizes, steps)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise SerializationError(f"a tensor sent by CUDA IPC on GPU {uuid} could not be opened: {exc}") from None
        target = _landing(lands, arrival.device)
        if target == device:
            return tensor
        self.copied_on_arrival += 1
        return tensor.to(target)  # the block is let go when ``tensor`` is freed, after the copy (torch waits)

    def _anchor(self, uuid: str, device: torch.device, handle: Any, size: Any, offset: Any, ledger: Any) -> None:
        """Keep the block's handle open in this process: later tensors from it open nothing (about 1 ms each)."""
        key = (uuid, handle)
        if key in self._anchors:
            self._anchors.move_to_end(key)
            return
        self._anchors[key] = torch.UntypedStorage._new_shared_cuda(
            device.index, handle, size, offset, ledger, ANCHOR_SLOT, b"", False
        )
        self.opened += 1
        while len(self._anchors) > self._keep:
            self._anchors.popitem(last=False)

    def _waited(self, uuid: str, device: torch.device, handle: Any) -> None:
        """Make this thread's current stream wait for the sender's copy into the block."""
        key = (uuid, handle)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = torch.cuda.Event.from_ipc_handle(device, handle)  # type: ignore[no-untyped-call]
        torch.cuda.current_stream(device).wait_event(event)

    def drop(self, payload: Any) -> None:
        """A message that carried ``payload`` was dropped unread: give its ledger slot back to the sender."""
        with contextlib.suppress(Exception):  # a malformed or stale reference lends nothing this node can give back
            uuid, *_, ledger, slot, _, _ = payload
            if uuid in self._uuids:
                torch.UntypedStorage._release_ipc_counter_cuda(ledger, slot)

    def forget(self, rank: int, reach: Mapping[str, str]) -> None:
        """Take back every block lent to node ``rank``, which is gone."""
        if self._ledger is None:
            return
        for blocks in self._blocks.values():
            for block in blocks:
                for slot in [slot for slot, holder in block.lends.items() if holder == rank]:
                    self._ledger.give_back(slot)

    def close(self) -> None:
        """Let go of the blocks, the ledger and the handles opened."""
        self._blocks.clear()
        self._bytes.clear()
        self._anchors.clear()
        self._events.clear()
        self._ledger = None

    def statistics(self) -> dict[str, int]:
        """Blocks kept and their bytes, blocks opened here, copies made on arrival, sends it stepped aside for."""
        return {
            "blocks": sum(len(blocks) for blocks in self._blocks.values()),
            "block_bytes": sum(self._bytes.values()),
            "opened": self.opened,
            "copied_on_arrival": self.copied_on_arrival,
            "stepped_aside": self.stepped_aside,
        }


def _landing(lands: Any, device: torch.device | None) -> torch.device:
    """Where a tensor lands: the device a map names, else the receiving actor's device, else the CPU."""
    if isinstance(lands, str):
        return torch.device(lands)
    return device if device is not None else torch.device("cpu")
