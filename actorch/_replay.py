"""Replay buffers as actors: uniform and prioritized, with snapshots to a tensor file.

A buffer keeps transitions (dicts of tensors) in one preallocated tensor per
key, ``(capacity, *shape)``, written as a ring: the oldest transitions make
room for new ones. Writes, sampling and priority updates work on whole batches
with tensor operations, never one Python object per transition, so a buffer of
millions of transitions costs its tensors and nothing more. Sampled batches
travel as :class:`Sample`, natively, in strict mode too.

Written against the public API only, as a user would write them (layer 9).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from actorch._actor import Actor
from actorch._codec import serializable
from actorch._errors import SnapshotError
from actorch._tensorfile import load_tensors, save_tensors

__all__ = ["PrioritizedReplayBuffer", "ReplayBuffer", "Sample"]

SNAPSHOT_FORMAT = "actorch.replay"
SNAPSHOT_VERSION = 1
_LEVELS_PER_STEP = 5  # tree levels one sampling step descends (reading 2**5 masses per target)


@serializable(17)
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


class ReplayBuffer(Actor):
    """A replay buffer of fixed capacity, sampled uniformly with replacement.

    Transitions are dicts of tensors. The first ``extend`` fixes the layout
    (keys, dtypes and trailing shapes) and allocates ``(capacity, *shape)``
    tensors; later batches must match it. When full, new transitions overwrite
    the oldest (FIFO ring).

    Args:
        capacity: The most transitions held at once.
        restore: A snapshot file (written by :meth:`snapshot` on this node's file
            system) to start from; it must be of the same kind and capacity.
        seed: Seeds this buffer's own random generator, for repeatable sampling.

    Raises:
        ValueError: If ``capacity`` is not a positive int.
        SnapshotError: If ``restore`` is corrupt, truncated, or of another kind,
            capacity or layout.
        OSError: If ``restore`` cannot be read.
    """

    kind: ClassVar[str] = "uniform"
    """What snapshots record, so a snapshot only restores into a buffer of its kind."""

    def __init__(self, capacity: int, *, restore: str | None = None, seed: int | None = None) -> None:
        self.capacity = _check_capacity(capacity)
        self._storage: dict[str, Tensor] = {}
        self._cursor = 0  # the slot the next transition goes to
        self._size = 0
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._counts = {"added": 0, "sampled": 0, "samples": 0, "snapshots": 0}
        if restore is not None:
            self._restore(restore)

    async def extend(self, batch: dict[str, Tensor]) -> int:
        """Add many transitions at once; return how many the buffer holds.

        Args:
            batch: One tensor per key, all with the same leading dimension (the
                number of transitions). A batch larger than the capacity keeps
                its last ``capacity`` transitions.

        Raises:
            TypeError: If ``batch`` is not a dict of tensors, or a dtype differs
                from the buffer's.
            ValueError: If the keys, trailing shapes or leading dimensions do not match.
        """
        count = self._check_batch(batch)
        if not self._storage:
            self._storage = {
                key: torch.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype) for key, value in batch.items()
            }
        slots = self._write(batch, count)
        self._written(slots)
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

    async def sample(self, batch_size: int) -> Sample:
        """Draw ``batch_size`` transitions uniformly, with replacement.

        Raises:
            ValueError: If ``batch_size`` is not positive or the buffer is empty.
        """
        self._check_sample(batch_size)
        indices = torch.randint(self._size, (batch_size,), generator=self._generator)
        return Sample(self._gather(indices), indices, None, None, self._size, float(self._size))

    async def size(self) -> int:
        """How many transitions the buffer holds."""
        return self._size

    async def clear(self) -> None:
        """Forget every transition and the layout; the next ``extend`` may bring new keys."""
        self._storage = {}
        self._cursor = 0
        self._size = 0

    async def snapshot(self, path: str) -> int:
        """Write the whole buffer to ``path`` on this node; return the bytes written.

        The file is a tensor file (see :func:`actorch.save_tensors`): no pickle,
        checked on load, replaced atomically. It is written in a worker thread;
        the actor handles nothing else meanwhile, so the file is consistent.
        """
        tensors, meta = self._snapshot_state()
        written = await asyncio.to_thread(save_tensors, path, tensors, meta)
        self._counts["snapshots"] += 1
        return written

    async def statistics(self) -> dict[str, Any]:
        """Counters and layout: size, capacity, keys with dtypes and shapes, bytes held."""
        return {
            "kind": self.kind,
            "capacity": self.capacity,
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

    def _check_sample(self, batch_size: int) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool):
            raise TypeError(f"batch_size must be an int, not {type(batch_size).__qualname__}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        if self._size == 0:
            raise ValueError(f"cannot sample from an empty replay buffer ({self!r})")
        self._counts["samples"] += 1
        self._counts["sampled"] += batch_size

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
        return (start + torch.arange(kept)) % capacity

    def _restore(self, path: str) -> None:
        try:
            tensors, meta = load_tensors(path)
        except OSError as exc:
            what = f"cannot restore {type(self).__qualname__} from {path!r}: {exc.strerror or exc}"
            raise type(exc)(exc.errno, what) from exc
        where = repr(path)
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
            storage[key] = torch.zeros((self.capacity, *saved.shape[1:]), dtype=saved.dtype)
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


class PrioritizedReplayBuffer(ReplayBuffer):
    """A replay buffer sampled in proportion to priorities, with importance weights.

    Item ``i`` is drawn with probability ``P(i) = p_i ** alpha / sum_k p_k ** alpha``
    (proportional prioritization, Schaul et al. 2016), where ``p_i`` is its last
    priority plus ``epsilon``; new transitions get the largest priority seen so
    far, so each is likely to be replayed at least once. The values
    ``p_i ** alpha`` live in a sum tree held in one float64 tensor; sampling
    descends it for the whole batch at once (stratified: one draw per equal
    slice of the total mass), and updates recompute it level by level.

    Args:
        capacity: The most transitions held at once.
        alpha: How strongly priorities shape sampling (0: uniform).
        beta: Default exponent of the importance weights ``(size * P(i)) ** -beta``
            (0: no correction, 1: full correction).
        epsilon: Added to every priority, so that none is zero.
        restore: A snapshot to start from (same kind, capacity and ``alpha``).
        seed: Seeds this buffer's own random generator.

    Raises:
        ValueError: If an argument is out of range.
        SnapshotError: If ``restore`` is corrupt or does not fit this buffer.
    """

    kind: ClassVar[str] = "prioritized"

    def __init__(
        self,
        capacity: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        epsilon: float = 1e-6,
        restore: str | None = None,
        seed: int | None = None,
    ) -> None:
        _check_capacity(capacity)
        for label, value in (("alpha", alpha), ("epsilon", epsilon)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{label} must be a finite number >= 0, not {value!r}")
        _check_beta(beta)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.epsilon = float(epsilon)
        self._max_priority = 1.0
        self._leaves = 1 << (capacity - 1).bit_length()
        self._depth = self._leaves.bit_length() - 1
        # Node 1 is the root, node n's children are 2n and 2n + 1, leaf i is node leaves + i.
        self._tree = torch.zeros(2 * self._leaves, dtype=torch.float64)
        super().__init__(capacity, restore=restore, seed=seed)

    async def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """Draw ``batch_size`` transitions in proportion to their priorities.

        Args:
            batch_size: How many to draw (with replacement).
            beta: Exponent of the importance weights for this batch; default
                the buffer's ``beta``.

        Raises:
            ValueError: If ``batch_size`` is not positive, ``beta`` is out of
                range, or the buffer is empty or has no priority mass.
        """
        beta = self.beta if beta is None else _check_beta(beta)
        self._check_sample(batch_size)
        tree, total = self._tree, float(self._tree[1])
        if not total > 0:
            raise ValueError(f"cannot sample from {self!r}: every priority is zero")
        # Stratified: target k lies in the k-th of batch_size equal slices of the mass.
        targets = (
            torch.arange(batch_size, dtype=torch.float64)
            + torch.rand(batch_size, dtype=torch.float64, generator=self._generator)
        ) * (total / batch_size)
        nodes = self._descend(targets)
        indices = nodes - self._leaves
        probabilities = tree[nodes] / total
        weights = (self._size * probabilities) ** -beta
        weights = (weights / weights.max()).to(torch.float32)
        return Sample(self._gather(indices), indices, weights, probabilities, self._size, total)

    async def update_priorities(self, indices: Tensor, priorities: Tensor) -> None:
        """Set the priorities of the transitions at ``indices`` (as a ``Sample`` gave them).

        When an index appears more than once, its last priority wins.

        Raises:
            TypeError: If the arguments are not tensors, or ``indices`` are not integers.
            ValueError: If the lengths differ, a priority is negative or not
                finite, or an index does not hold a transition.
        """
        if not isinstance(indices, Tensor) or not isinstance(priorities, Tensor):
            raise TypeError(
                f"indices and priorities are tensors, not {type(indices).__qualname__} "
                f"and {type(priorities).__qualname__}"
            )
        if indices.dtype == torch.bool or indices.is_floating_point() or indices.is_complex():
            raise TypeError(f"indices must be integers, not {indices.dtype}")
        indices = indices.reshape(-1).to(torch.int64)
        values = priorities.detach().reshape(-1).to(torch.float64)  # a loss's graph must not reach the tree
        if len(indices) != len(values):
            raise ValueError(f"{len(indices)} indices but {len(values)} priorities")
        if not len(indices):
            return
        if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
            bad = values[~torch.isfinite(values) | (values < 0)][0]
            raise ValueError(f"priorities must be finite and >= 0, got {float(bad)}")
        if bool((indices < 0).any()) or bool((indices >= self._size).any()):
            bad_index = indices[(indices < 0) | (indices >= self._size)][0]
            raise ValueError(f"index {int(bad_index)} is out of range: the buffer holds {self._size} transitions")
        unique, inverse = torch.unique(indices, return_inverse=True)
        last = torch.full((len(unique),), -1, dtype=torch.int64)
        last.scatter_reduce_(0, inverse, torch.arange(len(indices)), reduce="amax")
        values = values[last] + self.epsilon
        self._max_priority = max(self._max_priority, float(values.max()))
        self._set_leaves(unique, values**self.alpha)

    async def clear(self) -> None:
        """Forget every transition, its priority and the layout."""
        await super().clear()
        self._tree.zero_()
        self._max_priority = 1.0

    async def statistics(self) -> dict[str, Any]:
        """The uniform buffer's statistics plus priority mass, max priority, alpha, beta."""
        return {
            **await super().statistics(),
            "max_priority": self._max_priority,
            "alpha": self.alpha,
            "beta": self.beta,
            "epsilon": self.epsilon,
        }

    def _written(self, slots: Tensor) -> None:
        if len(slots):
            self._set_leaves(slots, torch.full((len(slots),), self._max_priority**self.alpha, dtype=torch.float64))

    def _mass(self) -> float:
        return float(self._tree[1])

    def _descend(self, targets: Tensor) -> Tensor:
        """The leaf (node number) under each target mass, for all targets at once.

        The descendants ``k`` levels below node ``n`` are the nodes ``n * 2**k``
        to ``n * 2**k + 2**k - 1``, one row of ``tree.view(-1, 2**k)``: each
        step reads that row for every target and goes down ``k`` levels, so a
        tree of depth 17 takes 4 steps of a few tensor operations each.
        """
        tree, zero = self._tree, torch.zeros((), dtype=torch.float64)
        nodes = torch.ones(len(targets), dtype=torch.int64)
        depth = self._depth
        while depth > 0:
            levels = min(_LEVELS_PER_STEP, depth)
            width = 1 << levels
            masses = tree.view(-1, width).index_select(0, nodes)
            reached = masses.cumsum(1)
            # Keep each target inside [0, its node's mass): rounding must not carry it onto an empty child.
            targets = torch.minimum(targets, torch.nextafter(reached[:, -1], zero)).clamp_(min=0.0)
            child = torch.searchsorted(reached, targets[:, None], right=True)
            targets = targets - (reached - masses).gather(1, child).squeeze(1)
            nodes = nodes * width + child.squeeze(1)
            depth -= levels
        return nodes

    def _set_leaves(self, slots: Tensor, values: Tensor) -> None:
        """Set leaves ``slots`` (unique) to ``values``, then recompute their ancestors, one level at a time."""
        tree = self._tree
        pairs = tree.view(-1, 2)  # row n holds the children of node n
        nodes = slots + self._leaves
        tree.index_copy_(0, nodes, values)
        for _ in range(self._depth):
            # Siblings share a parent: its repeated writes all carry the same sum.
            nodes = nodes >> 1
            tree.index_copy_(0, nodes, pairs.index_select(0, nodes).sum(1))

    def _snapshot_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors, meta = super()._snapshot_state()
        tensors["priorities"] = self._tree[self._leaves : self._leaves + self.capacity]
        meta.update(alpha=self.alpha, max_priority=self._max_priority)
        return tensors, meta

    def _extra_tensor_names(self) -> set[str]:
        return {"priorities"}

    def _restore_extra(self, path: str, tensors: dict[str, Tensor], meta: dict[str, Any]) -> Any:
        alpha, max_priority = meta.get("alpha"), meta.get("max_priority")
        if alpha != self.alpha:
            raise SnapshotError(f"{path} was taken with alpha={alpha!r}, this buffer has alpha={self.alpha}")
        if not isinstance(max_priority, float) or not math.isfinite(max_priority) or max_priority <= 0:
            raise SnapshotError(f"{path} is inconsistent: max priority {max_priority!r}")
        leaves = tensors.get("priorities")
        if leaves is None or leaves.dtype != torch.float64 or leaves.shape != (self.capacity,):
            raise SnapshotError(f"{path} is inconsistent: it needs {self.capacity} float64 priorities")
        size = meta["size"]
        if not bool(torch.isfinite(leaves).all()) or bool((leaves < 0).any()) or bool(leaves[size:].any()):
            raise SnapshotError(f"{path} is inconsistent: bad priorities (negative, not finite, or past the size)")
        tree = torch.zeros_like(self._tree)
        tree[self._leaves : self._leaves + self.capacity] = leaves
        for level in range(self._depth - 1, -1, -1):
            nodes = torch.arange(1 << level, 2 << level)
            tree[nodes] = tree[2 * nodes] + tree[2 * nodes + 1]
        return tree, max_priority

    def _apply_extra(self, extra: Any) -> None:
        self._tree, self._max_priority = extra


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


def _check_capacity(capacity: int) -> int:
    if not isinstance(capacity, int) or isinstance(capacity, bool):
        raise TypeError(f"capacity must be an int, not {type(capacity).__qualname__}")
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, not {capacity}")
    return capacity


def _check_beta(beta: float) -> float:
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or not 0 <= beta <= 1:
        raise ValueError(f"beta must be a number in [0, 1], not {beta!r}")
    return float(beta)
