"""Collectors on workers hand their batches to a Collection on rank 0 through leases of shared memory (one host).

Usage: ``python collect_shared.py``. Every check prints one ``RESULT {json}``
line; the test asserts on them. The collectors play ``corridor.Pixels``
(uint8 frames whose first pixel moves by ``1 + action`` a step), so every
batch can be checked against its own actions.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from actors import run_checks
from corridor import FramePolicy, Pixels

import actorch
from actorch._base.channels.leases import DEFAULT_SHM_POOL, process_pool
from actorch.rl import Batch, Collection, Collector

OPTIONS = {"num_envs": 2, "frames_per_batch": 16, "logits": True}


class PidCollector(Collector):
    async def pid(self) -> int:
        return os.getpid()

    async def refuse_shared_memory(self, refuse: bool) -> None:
        """This process's pool of shared memory has no room from now on (its idle segments removed), or again."""
        pool = process_pool()
        pool.limit = 1 if refuse else DEFAULT_SHM_POOL
        if refuse:
            pool._evict(pool.bytes)


def intact(batch: Batch) -> bool:
    """The batch is what the collector played: each step moved the first pixel by 1 + the action taken."""
    moved = (batch.next_observations[:, :, 0, 0].long() - batch.observations[:, :, 0, 0].long()) % 256
    return bool(
        batch.observations.dtype == torch.uint8
        and batch.observations.shape == (8, 2, 2, 3)
        and torch.equal(moved, 1 + batch.actions)
        and torch.equal(batch.observations[1:], batch.next_observations[:-1])
    )


async def spawn(system: actorch.ActorSystem) -> list[actorch.ActorRef[PidCollector]]:
    return [
        await system.spawn(PidCollector, args=(Pixels, FramePolicy), kwargs={**OPTIONS, "seed": rank}, on=rank)
        for rank in (1, 2)
    ]


def slot_files(pids: list[int]) -> list[str]:
    """The shared-memory segments the collectors' processes made (named after their pid)."""
    return sorted(name for name in os.listdir("/dev/shm") for pid in pids if name.startswith(f"actorch-{pid}-"))


async def check_streamed(system: actorch.ActorSystem) -> dict[str, Any]:
    refs = await spawn(system)
    pids = [await ref.call(PidCollector.pid) for ref in refs]
    batches = []
    async with Collection(refs, window=2) as collection:
        async for batch in collection:
            batches.append(batch)
            if len(batches) == 12:
                break
    counts = [await ref.call(Collector.statistics) for ref in refs]
    files = slot_files(pids)
    for ref in refs:
        await ref.stop()
    return {
        "intact": [intact(batch) for batch in batches],
        "by_reference": sum(count["by_reference"] for count in counts),
        "batches": sum(count["batches"] for count in counts),
        "files": len(files),
        "pids": [node.pid for node in system.nodes],
    }


async def check_waited(system: actorch.ActorSystem) -> dict[str, Any]:
    refs = await spawn(system)
    learner = FramePolicy()
    batches = []
    async with Collection(refs, max_lag=0, on_lag="wait") as collection:
        async for batch in collection:
            batches.append(batch)
            await collection.publish(learner)
            if len(batches) == 6:
                break
    counts = [await ref.call(Collector.statistics) for ref in refs]
    for ref in refs:
        await ref.stop()
    return {"intact": [intact(batch) for batch in batches], "by_reference": [count["by_reference"] for count in counts]}


async def check_unasked(system: actorch.ActorSystem) -> dict[str, Any]:
    [ref, _] = await spawn(system)
    batches = []
    async for batch in ref.stream(Collector.batches, 2):
        batches.append(batch)
    statistics = await ref.call(Collector.statistics)
    return {"intact": [intact(batch) for batch in batches], "by_reference": statistics["by_reference"]}


async def check_by_value(system: actorch.ActorSystem) -> dict[str, Any]:
    refs = await spawn(system)
    batches = []
    async with Collection(refs, window=2, shared_memory=False, stop_collectors=True) as collection:
        async for batch in collection:
            batches.append(batch)
            if len(batches) == 4:
                break
        counts = [await ref.call(Collector.statistics) for ref in refs]
    return {"intact": [intact(batch) for batch in batches], "by_reference": sum(c["by_reference"] for c in counts)}


async def check_refused(system: actorch.ActorSystem) -> dict[str, Any]:
    refs = await spawn(system)
    await refs[0].call(PidCollector.refuse_shared_memory, True)
    batches = []
    try:
        async with Collection(refs, window=2) as collection:
            async for batch in collection:
                batches.append(batch)
                if (len(batches) >= 8 and len({batch.collector for batch in batches}) == 2) or len(batches) == 64:
                    break
        counts = [await ref.call(Collector.statistics) for ref in refs]
    finally:
        await refs[0].call(PidCollector.refuse_shared_memory, False)
        for ref in refs:
            await ref.stop()
    return {
        "intact": [intact(batch) for batch in batches],
        "sources": len({batch.collector for batch in batches}),
        "refused": [(c["shm_refused"], c["by_reference"], c["batches"]) for c in counts],
    }


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    checks = [
        ("streamed", check_streamed),
        ("waited", check_waited),
        ("unasked", check_unasked),
        ("by_value", check_by_value),
        ("refused", check_refused),
    ]
    return await run_checks(system, checks)


if __name__ == "__main__":
    result = actorch.run(main, world_size=3)
    print("RETURNED " + json.dumps(result), flush=True)
