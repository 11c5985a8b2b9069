"""The replay buffer as an actor: uniform sampling, snapshots to a tensor file.

A buffer keeps transitions (dicts of tensors) in one preallocated tensor per
key, ``(capacity, *shape)``, written as a ring: the oldest transitions make
room for new ones. Writes, sampling and priority updates work on whole batches
with tensor operations, never one Python object per transition, so a buffer of
millions of transitions costs its tensors and nothing more. Sampled batches
travel as :class:`Sample`, natively, in strict mode too.

The storage lives on the buffer's device (``spawn(..., device="cuda:0")``), and
so does the sampling: transitions from any device are copied in, indices are
drawn there, and a sample leaves from there unless the caller names a device.

``sample_stream`` hands a learner batch after batch for as long as it reads,
waiting (not polling) while the buffer holds too little; ``extend`` and ``add``
run beside open streams and wake the ones that wait.

A buffer spawned with ``Restart(relocate=True)`` and ``snapshot_every=k``
saves itself (``Actor.save_snapshot``) every ``k`` transitions added: when its
node is lost, it starts again on another node holding what the last save held,
and with a snapshot directory a named one does so in a job started again too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from actorch._actors.actor import Actor
from actorch._base.codec import serializable
from actorch._base.errors import SnapshotError
from actorch._base.tensorfile import load_tensors, save_tensors
from actorch._stock.transfer import DeviceLike, as_device, to_device

__all__ = ["ReplayBuffer", "Sample"]

SNAPSHOT_FORMAT = "actorch.replay"
SNAPSHOT_VERSION = 1


@serializable()
@dataclass(frozen=True, eq=False, repr=False)
class Sample:
    """A batch drawn from a replay buffer.

    Equality is identity: comparing tensors element-wise has no single truth value.

    Attributes:
        data: One tensor per key, ``(batch_size, *shape)``: fresh tensors, never
            views of the buffer's storage, so they may be kept and mutated.
        indices: Where each item lies in the buffer (int64), to pass back to
            ``update_priorities``.
        weights: Importance-sampling weights (float32, at most 1), or None for
            a uniform buffer.
        probabilities: Each item's probability of being drawn, within the
            buffer that drew it (float64), or None for a uniform buffer.
        size: Transitions the buffer held when it was sampled.
        mass: The buffer's total priority mass then (its size, for a uniform buffer).
    """

    data: dict[str, Tensor]
    indices: Tensor
    weights: Tensor | None
    probabilities: Tensor | None
    size: int
    mass: float

    def __repr__(self) -> str:
        keys = ", ".join(self.data)
        kind = "prioritized" if self.weights is not None else "uniform"
        return f"<Sample {len(self.indices)} {kind} items of {self.size} ({keys})>"

    def to(self, device: DeviceLike) -> Sample:
        """This sample with its tensors on ``device``; itself when they are all there already.

        The copies are queued together, with one wait per GPU they leave.

        Raises:
            ValueError: ``device`` names no device.
        """
        target = as_device(device)
        tensors = {f"data/{key}": value for key, value in self.data.items()}
        tensors["indices"] = self.indices
        if self.weights is not None:
            tensors["weights"] = self.weights
        if self.probabilities is not None:
            tensors["probabilities"] = self.probabilities
        if all(tensor.device == target for tensor in tensors.values()):
            return self
        moved = to_device(tensors, target)
        data = {key: moved[f"data/{key}"] for key in self.data}
        return Sample(data, moved["indices"], moved.get("weights"), moved.get("probabilities"), self.size, self.mass)


class ReplayBuffer(Actor):
    """A replay buffer of fixed capacity, sampled uniformly with replacement.

    Transitions are dicts of tensors. The first ``extend`` fixes the layout
    (keys, dtypes and trailing shapes) and allocates ``(capacity, *shape)``
    tensors; later batches must match it. When full, new transitions overwrite
    the oldest (FIFO ring).

    The storage and the random generator live on the buffer's device
    (``self.device``, set by ``spawn(..., device=...)``): batches from any
    device are copied in, and sampling draws and gathers there.

    Args:
        capacity: The most transitions held at once.
        restore: A snapshot file (written by :meth:`snapshot` on this node's file
            system) to start from; it must be of the same kind and capacity.
        seed: Seeds this buffer's own random generator, for repeatable sampling.
        snapshot_every: For a buffer spawned with ``Restart(relocate=True)``:
            save the whole buffer to rank 0 (``Actor.save_snapshot``) each time
            this many more transitions were added, so that a relocation after
            its node is lost restores it, losing at most what came after that
            save; with a snapshot directory (``run(snapshots=DIR)``), so does
            a job started again after rank 0 was lost, for a named buffer
            spawned without ``restore``. Each save sends every transition
            held: the writer that triggers it waits for it, and so do writes
            and samples meanwhile. Without relocation, nothing is sent.

    Raises:
        ValueError: If ``capacity`` or ``snapshot_every`` is not a positive int.
        SnapshotError: If ``restore`` is corrupt, truncated, or of another kind,
            capacity or layout.
        OSError: If ``restore`` cannot be read.
    """

    kind: ClassVar[str] = "uniform"
    """What snapshots record, so a snapshot only restores into a buffer of its kind."""

    # A sample stream is one message for as long as its consumer reads, so writers
    # must run beside it. Handlers interleave only at awaits, and no handler awaits
    # in the middle of a state update: each waits (_settled) before it touches
    # anything, and then runs to its end without one. The one handler that awaits
    # with state in hand, snapshot, makes the others wait for it, as they did when
    # the buffer handled one message at a time.
    max_concurrency = 1 << 16

    def __init__(
        self, capacity: int, *, restore: str | None = None, seed: int | None = None, snapshot_every: int | None = None
    ) -> None:
        self.capacity = _check_capacity(capacity)
        self._snapshot_every = None if snapshot_every is None else _check_snapshot_every(snapshot_every)
        self._saved_at = 0  # transitions added when the last snapshot was saved
        self._storage: dict[str, Tensor] = {}
        self._cursor = 0  # the slot the next transition goes to
        self._size = 0
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._counts = {"added": 0, "sampled": 0, "samples": 0, "snapshots": 0, "saved": 0}
        self._streams = 0  # sample streams open
        self._grown = asyncio.Event()  # set (and replaced) when transitions arrive
        self._idle = asyncio.Event()  # clear while a snapshot is being written
        self._idle.set()
        if restore is not None:
            self._restore(restore)

    async def extend(self, batch: dict[str, Tensor]) -> int:
        """Add many transitions at once; return how many the buffer holds.

        Args:
            batch: One tensor per key, all with the same leading dimension (the
                number of transitions), on any device. A batch larger than the
                capacity keeps its last ``capacity`` transitions.

        Raises:
            TypeError: If ``batch`` is not a dict of tensors, or a dtype differs
                from the buffer's.
            ValueError: If the keys, trailing shapes or leading dimensions do not match.
        """
        await self._settled()
        count = self._check_batch(batch)
        if not self._storage:
            self._storage = {
                key: torch.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype, device=self.device)
                for key, value in batch.items()
            }
        slots = self._write(batch, count)
        self._written(slots)
        self._grown.set()  # wakes the streams waiting for transitions
        self._grown = asyncio.Event()
        if self._snapshot_every is not None and self._counts["added"] - self._saved_at >= self._snapshot_every:
            await self._save()
        return self._size

    async def add(self, transition: dict[str, Tensor]) -> int:
        """Add one transition (tensors without the leading dimension); return how many are held.

        Raises:
            TypeError: If ``transition`` is not a dict of tensors, or a dtype differs.
            ValueError: If the keys or shapes do not match the buffer's.
        """
        if not isinstance(transition, Mapping):
            raise TypeError(f"a transition is a dict of tensors, not {type(transition).__qualname__}")
        for key, value in transition.items():
            if not isinstance(value, Tensor):
                raise TypeError(f"transition[{key!r}] is a {type(value).__qualname__}, not a tensor")
        return await self.extend({key: value.unsqueeze(0) for key, value in transition.items()})

    async def sample(self, batch_size: int, *, device: DeviceLike | None = None) -> Sample:
        """Draw ``batch_size`` transitions uniformly, with replacement.

        Args:
            batch_size: How many to draw.
            device: A device of the buffer's node to put the sample on before it
                leaves: a caller on the same node gets it as it is, so it names
                its own device here; ``"cpu"`` sends host tensors to any caller.
                None: the buffer's device; across nodes the runtime delivers it
                (through a device map, or staged to the calling actor's device).

        Raises:
            ValueError: If ``batch_size`` is not positive, the buffer is empty, or ``device`` names no device.
        """
        target = self._target(device)
        _check_batch_size(batch_size)
        await self._settled()
        return self._draw(batch_size, None, target)

    async def sample_stream(
        self, batch_size: int, *, min_size: int | None = None, device: DeviceLike | None = None
    ) -> AsyncIterator[Sample]:
        """Stream samples of ``batch_size``, drawn as :meth:`sample` draws them, until the consumer leaves.

        ``async for sample in buffer.stream(ReplayBuffer.sample_stream, 256)``.
        Each item is what ``sample(batch_size, device=device)`` would return
        when it is drawn, with one difference: while the buffer holds fewer
        than ``min_size`` transitions (at the start, or after :meth:`clear`) the
        stream waits for ``extend`` or ``add`` instead of failing. The stream
        is one message that lasts as long as it is read; the buffer lets other
        calls in beside it. Samples are drawn up to the stream's window ahead
        of the consumer: a smaller window (``.with_window(2)``) gives fresher
        ones.

        Args:
            batch_size: Transitions per sample.
            min_size: Transitions the buffer must hold before a sample is drawn
                (a warm-up); default ``batch_size``, or the capacity if that is smaller.
            device: Where each sample leaves from, as for :meth:`sample`.

        Raises:
            TypeError: If ``batch_size`` or ``min_size`` is not an int.
            ValueError: If ``batch_size`` is not positive, ``min_size`` is not
                within ``[1, capacity]``, or ``device`` names no device.
        """
        async with contextlib.aclosing(self._samples(batch_size, None, min_size, device)) as samples:
            async for sample in samples:
                yield sample

    async def size(self) -> int:
        """How many transitions the buffer holds."""
        return self._size

    async def streams(self) -> int:
        """How many sample streams are open (a stream closes when its consumer leaves)."""
        return self._streams

    async def clear(self) -> None:
        """Forget every transition and the layout; the next ``extend`` may bring new keys.

        Open sample streams stay open: they wait for new transitions.
        """
        await self._settled()
        self._storage = {}
        self._cursor = 0
        self._size = 0

    async def snapshot(self, path: str) -> int:
        """Write the whole buffer to ``path`` on this node; return the bytes written.

        The file is a tensor file (see :func:`actorch.save_tensors`): no pickle,
        checked on load, replaced atomically. It is written in a worker thread;
        the actor handles nothing else meanwhile, so the file is consistent.
        """
        await self._settled()
        tensors, meta = self._snapshot_state()  # views of the storage: nothing may write until it is saved
        self._idle.clear()
        try:
            written = await asyncio.to_thread(save_tensors, path, tensors, meta)
        finally:
            self._idle.set()
        self._counts["snapshots"] += 1
        return written

    def restore(self, state: tuple[dict[str, Tensor], dict[str, Any]]) -> None:
        """Take the state a relocation hands back: what the last save (``snapshot_every``) held.

        Raises:
            SnapshotError: The state does not fit this buffer (kind, capacity, layout).
        """
        if not (isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict)):
            what = type(self).__qualname__
            raise SnapshotError(f"a relocation snapshot of {what} is (tensors, meta), not a {type(state).__qualname__}")
        tensors, meta = state
        self._restore_state("the relocation snapshot", tensors, meta)
        self._saved_at = self._counts["added"]

    async def statistics(self) -> dict[str, Any]:
        """Counters and layout: size, capacity, device, keys with dtypes and shapes, bytes held.

        ``snapshots`` counts the files written by :meth:`snapshot`, ``saved``
        the snapshots kept for relocation (``snapshot_every``).
        """
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "device": str(self.device),
            "size": self._size,
            "mass": self._mass(),
            "cursor": self._cursor,
            "keys": {
                key: [str(value.dtype).removeprefix("torch."), list(value.shape[1:])]
                for key, value in self._storage.items()
            },
            "bytes": sum(value.nbytes for value in self._storage.values()),
            **self._counts,
        }

    # ------------------------------------------------------------------ for subclasses

    def _written(self, slots: Tensor) -> None:
        """Hook: ``slots`` (int64) were just written with new transitions."""

    def _mass(self) -> float:
        return float(self._size)

    def _target(self, device: DeviceLike | None) -> torch.device:
        return self.device if device is None else as_device(device)

    def _draw(self, batch_size: int, beta: float | None, target: torch.device) -> Sample:
        """Draw one sample (``beta`` is the prioritized buffer's, checked already) and count it."""
        self._count_sample(batch_size)
        indices = torch.randint(self._size, (batch_size,), generator=self._generator, device=self.device)
        return Sample(self._gather(indices), indices, None, None, self._size, float(self._size)).to(target)

    def _count_sample(self, batch_size: int) -> None:
        if self._size == 0:
            raise ValueError(f"cannot sample from an empty replay buffer ({self!r})")
        self._counts["samples"] += 1
        self._counts["sampled"] += batch_size

    async def _samples(
        self, batch_size: int, beta: float | None, min_size: int | None, device: DeviceLike | None
    ) -> AsyncGenerator[Sample, None]:
        """The samples of a stream: draw whenever the buffer holds ``min_size``, else wait for writes."""
        target = self._target(device)
        _check_batch_size(batch_size)
        needed = min(batch_size, self.capacity) if min_size is None else self._check_min_size(min_size)
        self._streams += 1
        try:
            while True:
                if not self._idle.is_set():
                    await self._idle.wait()
                elif self._size < needed:
                    await self._grown.wait()
                else:
                    yield self._draw(batch_size, beta, target)
        finally:
            self._streams -= 1

    def _check_min_size(self, min_size: int) -> int:
        if not isinstance(min_size, int) or isinstance(min_size, bool):
            raise TypeError(f"min_size must be an int, not {type(min_size).__qualname__}")
        if not 1 <= min_size <= self.capacity:
            raise ValueError(f"min_size must be within [1, {self.capacity}] (the capacity), not {min_size}")
        return min_size

    async def _save(self) -> None:
        """Save the whole buffer for relocation; writes and samples wait until rank 0 holds it."""
        self._saved_at = self._counts["added"]
        self._idle.clear()
        try:
            saved = await self.save_snapshot(self._snapshot_state())  # views: nothing may write until it is sent
        finally:
            self._idle.set()
        self._counts["saved"] += saved

    async def _settled(self) -> None:
        """Wait while a snapshot is being written (the only await a handler makes before its update)."""
        while not self._idle.is_set():
            await self._idle.wait()

    def _gather(self, indices: Tensor) -> dict[str, Tensor]:
        return {key: value.index_select(0, indices) for key, value in self._storage.items()}

    def _snapshot_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors = {f"data/{key}": value[: self._size] for key, value in self._storage.items()}
        meta: dict[str, Any] = {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "kind": self.kind,
            "capacity": self.capacity,
            "cursor": self._cursor,
            "size": self._size,
            "keys": list(self._storage),
        }
        return tensors, meta

    def _restore_extra(self, path: str, tensors: dict[str, Tensor], meta: dict[str, Any]) -> Any:
        """Check the subclass's part of a snapshot; return what :meth:`_apply_extra` assigns."""
        return None

    def _apply_extra(self, extra: Any) -> None:
        """Assign what :meth:`_restore_extra` checked."""

    # ------------------------------------------------------------------ internals

    def _check_batch(self, batch: Any) -> int:
        """Check ``batch`` against itself and the buffer's layout; return its transition count."""
        count = _count_transitions(batch)
        if not self._storage:
            return count
        missing = [key for key in self._storage if key not in batch]
        unexpected = [key for key in batch if key not in self._storage]
        if missing or unexpected:
            raise ValueError(
                f"batch keys do not match the buffer's {list(self._storage)}: "
                f"missing {missing}, unexpected {unexpected}"
            )
        for key, stored in self._storage.items():
            value = batch[key]
            if value.dtype != stored.dtype:
                raise TypeError(f"batch[{key!r}] has dtype {value.dtype}, the buffer holds {stored.dtype}")
            if value.shape[1:] != stored.shape[1:]:
                raise ValueError(
                    f"batch[{key!r}] has transitions of shape {list(value.shape[1:])}, "
                    f"the buffer holds {list(stored.shape[1:])}"
                )
        return count

    def _write(self, batch: Mapping[str, Tensor], count: int) -> Tensor:
        """Copy ``batch`` into the ring in at most two slices per key; return the slots written."""
        capacity = self.capacity
        skipped = max(0, count - capacity)  # overwritten within this very batch
        kept = count - skipped
        start = (self._cursor + skipped) % capacity
        first = min(kept, capacity - start)
        with torch.no_grad():
            for key, value in batch.items():
                stored, tail = self._storage[key], value[skipped:]
                stored[start : start + first].copy_(tail[:first])
                if kept > first:
                    stored[: kept - first].copy_(tail[first:])
        self._cursor = (start + kept) % capacity
        self._size = min(self._size + kept, capacity)
        self._counts["added"] += count
        return (start + torch.arange(kept, device=self.device)) % capacity

    def _restore(self, path: str) -> None:
        try:
            tensors, meta = load_tensors(path)
        except OSError as exc:
            what = f"cannot restore {type(self).__qualname__} from {path!r}: {exc.strerror or exc}"
            raise type(exc)(exc.errno, what) from exc
        self._restore_state(repr(path), tensors, meta)

    def _restore_state(self, where: str, tensors: dict[str, Tensor], meta: Any) -> None:
        """Check a snapshot (of a file, or a relocation's) against this buffer, then take it."""
        if not isinstance(meta, dict) or meta.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotError(f"{where} is a tensor file but not a replay buffer snapshot")
        if meta.get("version") != SNAPSHOT_VERSION:
            raise SnapshotError(f"{where} has snapshot version {meta.get('version')!r}, expected {SNAPSHOT_VERSION}")
        if meta.get("kind") != self.kind:
            raise SnapshotError(
                f"{where} holds a {meta.get('kind')!r} replay buffer; {type(self).__qualname__} restores "
                f"only {self.kind!r} snapshots"
            )
        if meta.get("capacity") != self.capacity:
            raise SnapshotError(
                f"{where} holds a buffer of capacity {meta.get('capacity')!r}, this buffer has capacity {self.capacity}"
            )
        size, cursor, keys = meta.get("size"), meta.get("cursor"), meta.get("keys")
        if not (isinstance(size, int) and isinstance(cursor, int) and 0 <= size <= self.capacity):
            raise SnapshotError(f"{where} is inconsistent: size {size!r}, cursor {cursor!r}")
        if not 0 <= cursor < self.capacity or (size < self.capacity and cursor != size):
            raise SnapshotError(f"{where} is inconsistent: cursor {cursor} with size {size}")
        if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys) or len(set(keys)) != len(keys):
            raise SnapshotError(f"{where} is inconsistent: bad key list {keys!r}")
        storage = {}
        for key in keys:
            saved = tensors.get(f"data/{key}")
            if saved is None or saved.dim() == 0 or saved.shape[0] != size:
                raise SnapshotError(f"{where} is inconsistent: key {key!r} does not hold {size} transitions")
            storage[key] = torch.zeros((self.capacity, *saved.shape[1:]), dtype=saved.dtype, device=self.device)
            storage[key][:size].copy_(saved)
        extra = self._restore_extra(where, tensors, meta)
        expected = {f"data/{key}" for key in keys} | self._extra_tensor_names()
        if set(tensors) != expected:
            raise SnapshotError(f"{where} is inconsistent: unexpected tensors {sorted(set(tensors) - expected)}")
        # Everything was checked: only now does the buffer change.
        self._storage, self._size, self._cursor = storage, size, cursor
        self._apply_extra(extra)

    def _extra_tensor_names(self) -> set[str]:
        return set()


def _count_transitions(batch: Any) -> int:
    """The leading dimension shared by every tensor of ``batch``, a non-empty dict of tensors."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"a batch is a dict of tensors, not {type(batch).__qualname__}")
    if not batch:
        raise ValueError("a batch needs at least one key")
    count, first = -1, ""
    for key, value in batch.items():
        if not isinstance(key, str):
            raise TypeError(f"batch keys are strings, not {type(key).__qualname__} ({key!r})")
        if not isinstance(value, Tensor):
            raise TypeError(f"batch[{key!r}] is a {type(value).__qualname__}, not a tensor")
        if value.dim() == 0:
            raise ValueError(f"batch[{key!r}] has no leading dimension (use add() for one transition)")
        if count < 0:
            count, first = value.shape[0], key
        elif value.shape[0] != count:
            raise ValueError(f"batch[{key!r}] holds {value.shape[0]} transitions but batch[{first!r}] holds {count}")
    return count


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool):
        raise TypeError(f"batch_size must be an int, not {type(batch_size).__qualname__}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, not {batch_size}")


def _check_snapshot_every(every: int) -> int:
    if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
        raise ValueError(f"snapshot_every must be a positive int of transitions, not {every!r}")
    return every


def _check_capacity(capacity: int) -> int:
    if not isinstance(capacity, int) or isinstance(capacity, bool):
        raise TypeError(f"capacity must be an int, not {type(capacity).__qualname__}")
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, not {capacity}")
    return capacity
