"""``ShardedReplayBuffer``: one replay buffer made of several buffer actors, on several nodes.

A plain client object, not an actor: it holds refs to the shards, spreads
writes over them and samples across them in proportion to their sizes (or
priority mass), asking the shards concurrently. Any process may build one from
the shards' refs; it keeps only what the shards last reported. The shards may
keep their storage on different devices: the client merges their samples on
one device.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from actorch._actors.ref import ActorRef
from actorch._base.errors import GroupError
from actorch._stock.prioritized_replay import PrioritizedReplayBuffer
from actorch._stock.replay import ReplayBuffer, Sample
from actorch._stock.transfer import DeviceLike, as_device

__all__ = ["ShardedReplayBuffer"]

SHARD_SHIFT = 40
"""Sampled indices are ``shard_index << SHARD_SHIFT | local_index``."""
_LOCAL_MASK = (1 << SHARD_SHIFT) - 1


class ShardedReplayBuffer:
    """A client over replay buffer actors (the shards) that reads and writes them as one buffer.

    Sampling first splits the batch among the shards with a multinomial draw
    over their last known sizes (uniform shards) or priority masses
    (prioritized shards), so each transition's chance matches one big buffer;
    the shards then draw concurrently, and the client merges their samples.
    For prioritized shards it recomputes each item's global probability (its
    probability within its shard times the shard's share of the total mass) and
    the importance weights from it. Sizes and masses are learnt on first use and
    refreshed by every reply, so under concurrent writers they may lag a little.

    Indices of a merged sample encode the shard: ``shard_index << 40 | local_index``.

    Args:
        shards: Refs to ``ReplayBuffer`` actors, all uniform or all prioritized.
        beta: Default exponent of the importance weights (prioritized shards).
        seed: Seeds the generator that splits batches among shards.
        device: Where merged samples go. None: where the shards' samples
            arrive (a shard on the caller's node sends them from its own
            device, one elsewhere as the runtime delivers them) when they all
            arrive on one device, else the CPU.

    Raises:
        ValueError: If ``shards`` is empty, mixes kinds, ``beta`` is out of [0, 1],
            or ``device`` names no device.
        TypeError: If a shard is not a ref to a ``ReplayBuffer`` importable here.
    """

    SHARD_SHIFT = SHARD_SHIFT
    """Bits of a merged index below its shard index: ``shard = index >> SHARD_SHIFT``."""

    def __init__(
        self,
        shards: Sequence[ActorRef[Any]],
        *,
        beta: float = 0.4,
        seed: int | None = None,
        device: DeviceLike | None = None,
    ) -> None:
        if not shards:
            raise ValueError("a sharded replay buffer needs at least one shard")
        classes = []
        for index, ref in enumerate(shards):
            cls = ref.actor_class if isinstance(ref, ActorRef) else None
            if cls is None or not issubclass(cls, ReplayBuffer):
                raise TypeError(f"shard {index} ({ref!r}) is not a ref to a ReplayBuffer actor importable here")
            classes.append(cls)
        kinds = {issubclass(cls, PrioritizedReplayBuffer) for cls in classes}
        if len(kinds) > 1:
            raise ValueError("shards must be all uniform or all prioritized, not a mix")
        if not isinstance(beta, (int, float)) or isinstance(beta, bool) or not 0 <= beta <= 1:
            raise ValueError(f"beta must be a number in [0, 1], not {beta!r}")
        self.shards: list[ActorRef[Any]] = list(shards)
        self.prioritized = kinds.pop()
        self.beta = float(beta)
        self.device = None if device is None else as_device(device)
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._sizes: list[int] | None = None  # as the shards last reported them
        self._masses: list[float] | None = None
        self._next = 0  # the shard that gets the next transition
        self._counts = {"extends": 0, "added": 0, "samples": 0, "sampled": 0, "refreshes": 0}

    def __repr__(self) -> str:
        kind = "prioritized" if self.prioritized else "uniform"
        return f"<ShardedReplayBuffer {kind}, {len(self.shards)} shards on nodes {[r.rank for r in self.shards]}>"

    def statistics(self) -> dict[str, Any]:
        """What the client knows: shard sizes and masses as last reported, and its counters."""
        return {"shards": len(self.shards), "sizes": self._sizes, "masses": self._masses, **self._counts}

    async def extend(self, batch: dict[str, Tensor]) -> int:
        """Spread a batch of transitions over the shards, round robin; return the transitions held.

        Transition ``i`` of the batch goes to shard ``(k + i) % len(shards)``,
        where ``k`` continues from the previous call, so single transitions
        rotate over the shards too. The shards are written concurrently.

        Returns:
            The transitions held by all shards together, as last reported.

        Raises:
            TypeError, ValueError: If ``batch`` is not a dict of tensors with one
                leading dimension (the shards check the rest).
            GroupError: If some shards failed; their indices and refs are named.
        """
        count = _leading_dimension(batch)
        n = len(self.shards)
        parts: dict[int, dict[str, Tensor]] = {}
        for offset in range(min(n, count)):
            shard = (self._next + offset) % n
            if n == 1:
                parts[shard] = batch
            else:  # fresh tensors, wherever they are: a view would carry its whole storage to the shard
                parts[shard] = {
                    key: value[offset::n].clone(memory_format=torch.contiguous_format) for key, value in batch.items()
                }
        self._next = (self._next + count) % n
        sizes = await self._fan_out("extend", {shard: ("extend", (part,)) for shard, part in parts.items()})
        known = await self._known()
        for shard, size in sizes.items():
            known[0][shard] = size
        self._counts["extends"] += 1
        self._counts["added"] += count
        return sum(known[0])

    async def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """Draw ``batch_size`` transitions across the shards, as from one buffer.

        Args:
            batch_size: How many to draw (with replacement).
            beta: Importance-weight exponent for this batch (prioritized shards);
                default the client's ``beta``.

        Returns:
            The merged sample: data grouped by shard, global indices, and for
            prioritized shards global probabilities and importance weights.

        Raises:
            ValueError: If ``batch_size`` is not positive, ``beta`` is out of
                range, or every shard is empty.
            GroupError: If some shards failed; their indices and refs are named.
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        if beta is not None and (not isinstance(beta, (int, float)) or isinstance(beta, bool) or not 0 <= beta <= 1):
            raise ValueError(f"beta must be a number in [0, 1], not {beta!r}")
        sizes, masses = await self._known()
        if not sum(masses) > 0:
            sizes, masses = await self._refresh()
            if not sum(masses) > 0:
                raise ValueError(f"cannot sample from {self!r}: every shard is empty")
        weights = torch.tensor(masses, dtype=torch.float64)
        counts = torch.multinomial(weights, batch_size, replacement=True, generator=self._generator)
        per_shard = torch.bincount(counts, minlength=len(self.shards)).tolist()
        calls: dict[int, tuple[str, tuple[Any, ...]]] = {
            shard: ("sample", (count,)) for shard, count in enumerate(per_shard) if count
        }
        # A shard that was empty may have filled since: ask it, or it would never be drawn.
        calls.update({shard: ("statistics", ()) for shard, mass in enumerate(masses) if not mass > 0})
        replies = await self._fan_out("sample", calls)
        samples: dict[int, Sample] = {}
        for shard, reply in replies.items():
            if isinstance(reply, Sample):
                samples[shard] = reply
                sizes[shard], masses[shard] = reply.size, reply.mass
            else:
                sizes[shard], masses[shard] = reply["size"], reply["mass"]
        self._counts["samples"] += 1
        self._counts["sampled"] += batch_size
        return self._merge(samples, sizes, masses, self.beta if beta is None else float(beta))

    async def update_priorities(self, indices: Tensor, priorities: Tensor) -> None:
        """Set priorities of transitions by the global indices a merged sample gave; one call per shard.

        Raises:
            TypeError: If the shards are not prioritized, or the arguments are not tensors.
            ValueError: If the lengths differ or an index names no shard.
            GroupError: If some shards refused or failed; their indices and refs are named.
        """
        if not self.prioritized:
            raise TypeError(f"{self!r} has uniform shards: they have no priorities to update")
        if not isinstance(indices, Tensor) or not isinstance(priorities, Tensor):
            raise TypeError("indices and priorities must be tensors")
        if indices.dtype == torch.bool or indices.is_floating_point() or indices.is_complex():
            raise TypeError(f"indices must be integers, not {indices.dtype}")
        indices, priorities = indices.reshape(-1).to(torch.int64), priorities.detach().reshape(-1)
        if len(indices) != len(priorities):
            raise ValueError(f"{len(indices)} indices but {len(priorities)} priorities")
        shard_of = indices >> SHARD_SHIFT
        if bool((indices < 0).any()) or bool((shard_of >= len(self.shards)).any()):
            bad = int(indices[(indices < 0) | (shard_of >= len(self.shards))][0])
            raise ValueError(f"index {bad} names no shard of {self!r}")
        calls: dict[int, tuple[str, tuple[Any, ...]]] = {}
        for shard in torch.unique(shard_of).tolist():
            mine = shard_of == shard
            calls[shard] = ("update_priorities", (indices[mine] & _LOCAL_MASK, priorities[mine]))
        await self._fan_out("update_priorities", calls)

    async def size(self) -> int:
        """The transitions held by all shards together, asked now."""
        sizes, _ = await self._refresh()
        return sum(sizes)

    # ------------------------------------------------------------------ internals

    async def _known(self) -> tuple[list[int], list[float]]:
        if self._sizes is None or self._masses is None:
            return await self._refresh()
        return self._sizes, self._masses

    async def _refresh(self) -> tuple[list[int], list[float]]:
        replies = await self._fan_out("statistics", dict.fromkeys(range(len(self.shards)), ("statistics", ())))
        self._sizes = [replies[shard]["size"] for shard in range(len(self.shards))]
        self._masses = [float(replies[shard]["mass"]) for shard in range(len(self.shards))]
        self._counts["refreshes"] += 1
        return self._sizes, self._masses

    async def _fan_out(self, what: str, calls: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, Any]:
        """Make ``calls`` (shard -> endpoint, args) concurrently; raise ``GroupError`` if any failed."""
        shards = sorted(calls)
        outcomes = await asyncio.gather(
            *(self.shards[shard].call(calls[shard][0], *calls[shard][1]) for shard in shards), return_exceptions=True
        )
        results: list[Any] = [None] * len(self.shards)
        for shard, outcome in zip(shards, outcomes, strict=True):
            results[shard] = outcome

        def label(index: int) -> str:
            return f"replay shard {shards[index]} ({self.shards[shards[index]]!r})"

        failed = GroupError.from_outcomes(f"calls to {what!r} of replay shards", label, outcomes, results)
        if failed is not None:
            raise failed
        return dict(zip(shards, outcomes, strict=True))

    def _merge(self, samples: dict[int, Sample], sizes: list[int], masses: list[float], beta: float) -> Sample:
        shards = sorted(samples)
        device = self.device
        if device is None:
            arrived = {part.indices.device for part in samples.values()}
            device = arrived.pop() if len(arrived) == 1 else torch.device("cpu")
        parts = [samples[shard].to(device) for shard in shards]
        keys = list(parts[0].data)
        data = {key: torch.cat([part.data[key] for part in parts]) for key in keys}
        indices = torch.cat([part.indices | (shard << SHARD_SHIFT) for shard, part in zip(shards, parts, strict=True)])
        size, mass = sum(sizes), float(sum(masses))
        if not self.prioritized:
            return Sample(data, indices, None, None, size, float(size))
        probabilities = torch.cat(
            [_local_probabilities(part) * (masses[shard] / mass) for shard, part in zip(shards, parts, strict=True)]
        )
        weights = (size * probabilities) ** -beta
        return Sample(data, indices, (weights / weights.max()).to(torch.float32), probabilities, size, mass)


def _local_probabilities(sample: Sample) -> Tensor:
    if sample.probabilities is None:
        raise TypeError(f"a prioritized shard replied with a uniform sample ({sample!r})")
    return sample.probabilities


def _leading_dimension(batch: Any) -> int:
    """The transition count of ``batch``; the shards check keys, dtypes and shapes."""
    if not isinstance(batch, dict):
        raise TypeError(f"a batch is a dict of tensors, not {type(batch).__qualname__}")
    if not batch:
        raise ValueError("a batch needs at least one key")
    counts = set()
    for key, value in batch.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"batch[{key!r}] is a {type(value).__qualname__}, not a tensor")
        if value.dim() == 0:
            raise ValueError(f"batch[{key!r}] has no leading dimension")
        counts.add(value.shape[0])
    if len(counts) > 1:
        raise ValueError(f"the tensors of a batch differ in leading dimension: {sorted(counts)}")
    return counts.pop()
