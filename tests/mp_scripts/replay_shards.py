"""Replay buffer shards on two worker processes, filled by actors there, sampled from rank 0 over torch RPC.

Usage: ``python replay_shards.py TMPDIR``. The world runs in strict mode, so
everything (samples included) must travel natively. Every check prints one
``RESULT {json}`` line with what it observed (or ``failed`` with the exception).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

# isort: off
# actorch first, before anything imports torch: it quiets torch's C++ logging.
import actorch
import torch
from actors import attempt, describe, run_checks

# isort: on
from actorch.replay import PrioritizedReplayBuffer, ReplayBuffer, Sample, ShardedReplayBuffer

SHARD_SHIFT = ShardedReplayBuffer.SHARD_SHIFT

TMP = Path(sys.argv[1])
LOCAL = (1 << SHARD_SHIFT) - 1
BASES = {1: 0, 2: 100_000}  # transition values start here on each worker, so a value tells where it was made


def batch_of(values: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"obs": values.to(torch.float32)[:, None].repeat(1, 4), "value": values.to(torch.int64)}


class Filler(actorch.Actor):
    """Writes transitions to the shard of its own node, as an environment worker would."""

    def __init__(self, shard: actorch.ActorRef[ReplayBuffer]) -> None:
        self.shard = shard

    async def fill(self, batches: int, per_batch: int) -> list[int]:
        base = BASES[self.system.rank]
        size = 0
        for index in range(batches):
            values = base + index * per_batch + torch.arange(per_batch)
            size = await self.shard.call(ReplayBuffer.extend, batch_of(values))
        return [self.system.rank, os.getpid(), size]


def decode(sample: Sample) -> tuple[torch.Tensor, torch.Tensor]:
    return sample.indices >> SHARD_SHIFT, sample.indices & LOCAL


async def check_prioritized(system: actorch.ActorSystem) -> dict[str, Any]:
    kwargs = {"alpha": 1.0, "epsilon": 0.0}
    shards = [
        await system.spawn(PrioritizedReplayBuffer, args=(1000,), kwargs={**kwargs, "seed": rank}, on=rank)
        for rank in (1, 2)
    ]
    fillers = [await system.spawn(Filler, args=(shard,), on=shard.rank) for shard in shards]
    filled = await asyncio.gather(fillers[0].call(Filler.fill, 10, 30), fillers[1].call(Filler.fill, 10, 10))
    client = ShardedReplayBuffer(shards, seed=0)
    from_first, matches, draws = 0, True, 0
    started = time.monotonic()
    for _ in range(20):
        sample = await client.sample(200)
        shard, local = decode(sample)
        matches &= bool(torch.equal(sample.data["value"], local + 100_000 * shard))
        matches &= bool(torch.equal(sample.data["obs"][:, 0], sample.data["value"].to(torch.float32)))
        from_first += int((shard == 0).sum())
        draws += len(shard)
    seconds = time.monotonic() - started
    # Triple the priority of every transition of the second shard: its mass becomes 300, like the first's.
    everything = torch.cat([torch.arange(300), (1 << SHARD_SHIFT) | torch.arange(100)])
    await client.update_priorities(everything, torch.cat([torch.ones(300), torch.full((100,), 3.0)]))
    await client.sample(10)  # refreshes both masses
    after = [int((decode(await client.sample(200))[0] == 0).sum()) for _ in range(20)]
    last = await client.sample(64)
    assert last.probabilities is not None
    assert last.weights is not None
    shard, _ = decode(last)
    expected = torch.where(shard == 0, 1.0 / 600, 3.0 / 600).double()
    return {
        "filled": filled,
        "pids": [node.pid for node in system.nodes],
        "sizes": [await ref.call(ReplayBuffer.size) for ref in shards],
        "first_share": from_first / draws,
        "data_matches_indices": matches,
        "samples_per_s": draws / seconds,
        "first_share_after_update": sum(after) / (20 * 200),
        "probabilities_ok": bool(torch.allclose(last.probabilities, expected)),
        "masses": [(await ref.call(ReplayBuffer.statistics))["mass"] for ref in shards],
        "total": await client.size(),
    }


async def check_uniform(system: actorch.ActorSystem) -> dict[str, Any]:
    shards = [await system.spawn(ReplayBuffer, args=(64,), kwargs={"seed": rank}, on=rank) for rank in (1, 2)]
    client = ShardedReplayBuffer(shards, seed=1)
    held = await client.extend(batch_of(torch.arange(100)))
    sample = await client.sample(500)
    shard, _ = decode(sample)
    return {
        "held": held,
        "sizes": [await ref.call(ReplayBuffer.size) for ref in shards],
        "even_to_first": sorted(set(sample.data["value"][shard == 0].remainder(2).tolist())),
        "odd_to_second": sorted(set(sample.data["value"][shard == 1].remainder(2).tolist())),
        "weights": sample.weights,
    }


async def check_group_error(system: actorch.ActorSystem) -> dict[str, Any]:
    shards = [
        await system.spawn(PrioritizedReplayBuffer, args=(100,), kwargs={"seed": rank}, name=f"replay/{rank}", on=rank)
        for rank in (1, 2)
    ]
    client = ShardedReplayBuffer(shards, seed=0)
    await client.extend(batch_of(torch.arange(40)))
    await shards[1].stop()
    outcome: dict[str, Any] = {}
    try:
        await client.sample(16)
    except actorch.GroupError as exc:
        outcome = {
            "message": str(exc),
            "failed": exc.failed,
            "members": [describe(error) for error in exc.exceptions],
            "notes": [getattr(error, "__notes__", []) for error in exc.exceptions],
            "kept": [type(result).__name__ for result in exc.results],
        }
    except Exception as exc:
        outcome = {"wrong": describe(exc)}
    return {"sample": outcome, "size": await attempt(client.size())}


async def check_snapshot(system: actorch.ActorSystem) -> dict[str, Any]:
    path = str(TMP / "shard.snap")
    original = await system.spawn(PrioritizedReplayBuffer, args=(50,), kwargs={"seed": 3}, on=1)
    await original.call(PrioritizedReplayBuffer.extend, batch_of(torch.arange(70)))
    await original.call(PrioritizedReplayBuffer.update_priorities, torch.arange(10), torch.arange(10.0))
    written = await original.call(PrioritizedReplayBuffer.snapshot, path)
    restored = await system.spawn(PrioritizedReplayBuffer, args=(50,), kwargs={"seed": 3, "restore": path}, on=2)
    first = await original.call(PrioritizedReplayBuffer.sample, 32)
    second = await restored.call(PrioritizedReplayBuffer.sample, 32)
    data = await anyio.Path(path).read_bytes()
    corrupt = TMP / "corrupt.snap"
    await anyio.Path(corrupt).write_bytes(data[:-100])
    refused = await attempt(system.spawn(PrioritizedReplayBuffer, args=(50,), kwargs={"restore": str(corrupt)}, on=2))
    wrong_kind = await attempt(system.spawn(ReplayBuffer, args=(50,), kwargs={"restore": path}, on=1))
    return {
        "written": written,
        "file_size": len(data),
        "same_indices": bool(torch.equal(first.indices, second.indices)),
        "same_data": bool(torch.equal(first.data["obs"], second.data["obs"])),
        "same_weights": first.weights is not None
        and second.weights is not None
        and bool(torch.equal(first.weights, second.weights)),
        "refused": refused,
        "wrong_kind": wrong_kind,
    }


Check = Callable[[actorch.ActorSystem], Awaitable[dict[str, Any]]]
CHECKS: list[tuple[str, Check]] = [
    ("prioritized", check_prioritized),
    ("uniform", check_uniform),
    ("group_error", check_group_error),
    ("snapshot", check_snapshot),
]


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    return await run_checks(system, CHECKS, seconds=60)


if __name__ == "__main__":
    result = actorch.run(main, world_size=3, strict=True)
    print("RETURNED " + json.dumps(result), flush=True)
