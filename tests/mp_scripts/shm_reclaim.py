"""A node that holds shared memory lent to it, and lends its own, is killed: what it held comes back, its files go.

Usage: ``python shm_reclaim.py`` (three processes on one host). Rank 0 sends
tensors to a keeper on rank 1, which keeps them (rank 0's segments are lent to
it), and that keeper sends tensors of its own to a keeper on rank 0 (rank 1's
segments, mapped by rank 0). Then rank 0 kills rank 1 with SIGKILL and, once
it counts it lost, reports what its pool still lends, which of rank 1's files
are left in ``/dev/shm``, and whether what it kept from rank 1 still reads
right. Every node's pid is reported, so that the test can check that no
segment file of the run outlives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import torch
from actors import emit, wait_lost

import actorch
from actorch._base.channels.segments import SHM_DIR

MIB = 1 << 20


class Keeper(actorch.Actor):
    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []

    async def keep(self, tensor: torch.Tensor) -> int:
        self.kept.append(tensor)
        return len(self.kept)

    async def send_to(self, other: actorch.ActorRef[Keeper], count: int) -> None:
        for index in range(count):
            await other.call(Keeper.keep, torch.full((MIB // 4,), float(index)))

    async def sums(self) -> list[float]:
        return [float(tensor.sum()) for tensor in self.kept]

    async def prefix(self) -> str:
        return f"actorch-{os.getpid()}-"


def files(prefix: str) -> list[str]:
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefix))


async def main(system: actorch.ActorSystem) -> None:
    here = await system.spawn(Keeper, on=0)
    there = await system.spawn(Keeper, on=1)
    for index in range(3):
        await there.call(Keeper.keep, torch.full((MIB // 4,), float(index)))
    await there.call(Keeper.send_to, here, 3)
    shm = system.statistics()["channels"]["shm"]
    before = {"lent": shm["lent"], "theirs": files(await there.call(Keeper.prefix))}
    victim = system.nodes[1]
    os.kill(victim.pid, signal.SIGKILL)
    async with asyncio.timeout(20):
        await wait_lost(system, 1)
    await asyncio.sleep(0.2)  # the loss reached every listener
    shm = system.statistics()["channels"]["shm"]
    emit(
        "reclaimed",
        before=before,
        lent_after=shm["lent"],
        theirs_after=files(f"actorch-{victim.pid}-"),
        kept_sums=await here.call(Keeper.sums),
        pids=[node.pid for node in system.nodes],
    )


if __name__ == "__main__":
    actorch.run(main, world_size=3, stop_grace=1.0)
    print("RETURNED " + json.dumps("returned"), flush=True)
