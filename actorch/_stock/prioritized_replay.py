"""The prioritized replay buffer: a sum tree over priorities, sampled and updated in bulk.

The tree lives in one float64 tensor (leaves at ``[size, 2 * size)``); sampling
descends it for a whole batch at once, several levels per tensor operation, and
priority updates recompute the touched parents level by level. Importance
weights follow Schaul et al. (2016), normalised by the batch's largest weight.
The tree lives on the buffer's device, beside the storage, so sampling and
updates never leave it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import torch
from torch import Tensor

from actorch._base.errors import SnapshotError
from actorch._stock.replay import ReplayBuffer, Sample, _check_batch_size, _check_capacity
from actorch._stock.transfer import DeviceLike

__all__ = ["PrioritizedReplayBuffer"]

_LEVELS_PER_STEP = 5  # tree levels one sampling step descends (reading 2**5 masses per target)


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
        snapshot_every: Save the buffer for relocation each time this many
            more transitions were added (see :class:`ReplayBuffer`).

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
        snapshot_every: int | None = None,
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
        self._tree = torch.zeros(2 * self._leaves, dtype=torch.float64, device=self.device)
        super().__init__(capacity, restore=restore, seed=seed, snapshot_every=snapshot_every)

    async def sample(self, batch_size: int, beta: float | None = None, *, device: DeviceLike | None = None) -> Sample:
        """Draw ``batch_size`` transitions in proportion to their priorities.

        Args:
            batch_size: How many to draw (with replacement).
            beta: Exponent of the importance weights for this batch; default
                the buffer's ``beta``.
            device: Where the sample leaves from, as for :meth:`ReplayBuffer.sample`.

        Raises:
            ValueError: If ``batch_size`` is not positive, ``beta`` is out of
                range, the buffer is empty or has no priority mass, or
                ``device`` names no device.
        """
        beta = self.beta if beta is None else _check_beta(beta)
        target = self._target(device)
        _check_batch_size(batch_size)
        await self._settled()
        return self._draw(batch_size, beta, target)

    async def sample_stream(
        self,
        batch_size: int,
        beta: float | None = None,
        *,
        min_size: int | None = None,
        device: DeviceLike | None = None,
    ) -> AsyncIterator[Sample]:
        """Stream samples drawn as :meth:`sample` draws them, until the consumer leaves.

        As :meth:`ReplayBuffer.sample_stream`: the stream waits while the buffer
        holds fewer than ``min_size`` transitions. Samples are drawn up to the
        stream's window ahead of the consumer, so they reflect the priorities
        of that moment: with ``update_priorities`` after each batch, a small
        window (``.with_window(1)``) keeps them current.

        Args:
            batch_size: Transitions per sample.
            beta: Exponent of the importance weights; default the buffer's ``beta``.
            min_size: Transitions the buffer must hold before a sample is drawn;
                default ``batch_size``, or the capacity if that is smaller.
            device: Where each sample leaves from, as for :meth:`ReplayBuffer.sample`.

        Raises:
            TypeError: If ``batch_size`` or ``min_size`` is not an int.
            ValueError: If an argument is out of range, ``device`` names no
                device, or (mid-stream) every priority is zero.
        """
        beta = self.beta if beta is None else _check_beta(beta)
        async with contextlib.aclosing(self._samples(batch_size, beta, min_size, device)) as samples:
            async for sample in samples:
                yield sample

    async def update_priorities(self, indices: Tensor, priorities: Tensor) -> None:
        """Set the priorities of the transitions at ``indices`` (as a ``Sample`` gave them).

        When an index appears more than once, its last priority wins. The
        tensors may be on any device: they are moved to the tree's.

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
        await self._settled()
        device = self._tree.device
        indices = indices.reshape(-1).to(device, torch.int64)
        values = priorities.detach().reshape(-1).to(device, torch.float64)  # a loss's graph must not reach the tree
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
        last = torch.full((len(unique),), -1, dtype=torch.int64, device=device)
        last.scatter_reduce_(0, inverse, torch.arange(len(indices), device=device), reduce="amax")
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

    def _draw(self, batch_size: int, beta: float | None, target: torch.device) -> Sample:
        assert beta is not None
        self._count_sample(batch_size)
        tree, total = self._tree, float(self._tree[1])
        if not total > 0:
            raise ValueError(f"cannot sample from {self!r}: every priority is zero")
        # Stratified: target k lies in the k-th of batch_size equal slices of the mass.
        targets = (
            torch.arange(batch_size, dtype=torch.float64, device=tree.device)
            + torch.rand(batch_size, dtype=torch.float64, generator=self._generator, device=tree.device)
        ) * (total / batch_size)
        nodes = self._descend(targets)
        indices = nodes - self._leaves
        probabilities = tree[nodes] / total
        weights = (self._size * probabilities) ** -beta
        weights = (weights / weights.max()).to(torch.float32)
        return Sample(self._gather(indices), indices, weights, probabilities, self._size, total).to(target)

    def _written(self, slots: Tensor) -> None:
        if len(slots):
            value = self._max_priority**self.alpha
            self._set_leaves(slots, torch.full((len(slots),), value, dtype=torch.float64, device=slots.device))

    def _mass(self) -> float:
        return float(self._tree[1])

    def _descend(self, targets: Tensor) -> Tensor:
        """The leaf (node number) under each target mass, for all targets at once.

        The descendants ``k`` levels below node ``n`` are the nodes ``n * 2**k``
        to ``n * 2**k + 2**k - 1``, one row of ``tree.view(-1, 2**k)``: each
        step reads that row for every target and goes down ``k`` levels, so a
        tree of depth 17 takes 4 steps of a few tensor operations each.
        """
        tree = self._tree
        zero = torch.zeros((), dtype=torch.float64, device=tree.device)
        nodes = torch.ones(len(targets), dtype=torch.int64, device=tree.device)
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
            nodes = torch.arange(1 << level, 2 << level, device=tree.device)
            tree[nodes] = tree[2 * nodes] + tree[2 * nodes + 1]
        return tree, max_priority

    def _apply_extra(self, extra: Any) -> None:
        self._tree, self._max_priority = extra


def _check_beta(beta: float) -> float:
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or not 0 <= beta <= 1:
        raise ValueError(f"beta must be a number in [0, 1], not {beta!r}")
    return float(beta)
