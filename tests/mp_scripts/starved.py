"""Live nodes that are slow, not dead: none may be counted lost (three processes, default liveness timeout 2.5 s).

Usage: ``python starved.py late|held|both TMPDIR`` (``both``: ``late``, then
``held`` in the same system, so that their tests pay for one start):

- ``late``: rank 2 sets up for twice the liveness timeout before it joins, so
  rank 1 is ready and judging rank 0 seconds before rank 2 has joined (rank 0
  waits for it to finish starting); then rank 0 spawns on and calls both;
- ``held``: rank 1 computes for 4 s without letting another of its threads run
  (its interpreter held, as a long C call holds it), while rank 0 calls rank 2;
  then rank 0 does the same to itself; then every node is called again.

Either way the script reports the nodes counted lost (none, when all is well)
and what the calls returned.
"""

from __future__ import annotations

import asyncio
import sys
import time

from actors import Counter, attempt, emit
from faulty import Stuck

import actorch

MODE = sys.argv[1]
LIVENESS = 2.5
HELD = 4.0  # past the liveness timeout


def setup(rank: int) -> None:
    if MODE in ("late", "both") and rank == 2:
        time.sleep(2 * LIVENESS)


async def late(system: actorch.ActorSystem) -> None:
    counters = [await system.spawn(Counter, args=(rank,), on=rank) for rank in (1, 2)]
    values = [await attempt(counter.call(Counter.add, 10)) for counter in counters]
    emit("late", values=values, lost=sorted(system.lost_nodes))


async def held(system: actorch.ActorSystem) -> None:
    stuck, own = await system.spawn(Stuck, on=1), await system.spawn(Stuck, on=0)
    counters = [await system.spawn(Counter, on=rank) for rank in (1, 2)]
    holding = asyncio.ensure_future(attempt(stuck.call(Stuck.hold_busy, HELD)))
    meanwhile = []
    while not holding.done():
        meanwhile.append(await attempt(counters[1].call(Counter.add)))
        await asyncio.sleep(0.2)
    worker_held = await holding
    lost_after_worker = sorted(system.lost_nodes)
    await own.call(Stuck.hold_busy, HELD)  # rank 0 itself, on its loop
    after = [await attempt(counter.call(Counter.add)) for counter in counters]
    emit(
        "held",
        worker_held=worker_held,
        meanwhile=meanwhile,
        lost_after_worker=lost_after_worker,
        after=after,
        lost=sorted(system.lost_nodes),
    )


async def main(system: actorch.ActorSystem) -> str:
    if MODE in ("late", "both"):
        await late(system)
    if MODE in ("held", "both"):
        await held(system)
    return "main finished"


if __name__ == "__main__":
    print("RETURNED " + repr(actorch.run(main, world_size=3, setup=setup, liveness_timeout=LIVENESS)), flush=True)
