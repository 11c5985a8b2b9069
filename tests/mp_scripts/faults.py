"""Faults inside a running world: stuck handlers, a hanging ``on_stop``, a blocked event loop, rank 0 killed.

Usage: ``python faults.py MODE TMPDIR`` with ``stop_grace`` 1 s, three processes:

- ``stuck``: stopping an actor with a handler that never returns and an
  ``on_stop`` that hangs; then ``main`` returns with handlers still stuck
  (one that can be cancelled, one that swallows its cancellation);
- ``blocked``: a worker's handler blocks its event loop when ``main`` returns;
- ``rank0``: ``main`` writes ``TMPDIR/ready`` (the workers' pids) and sleeps
  until the test kills this process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from actors import Stopper, attempt, emit
from faulty import HangingStop, Stuck

import actorch

MODE = sys.argv[1]
TMP = Path(sys.argv[2])
GRACE = 1.0
MAIN_RETURNED: list[float] = []


async def stuck(system: actorch.ActorSystem) -> None:
    hanging_stop = await system.spawn(HangingStop, args=(str(TMP / "on_stop_began"),), on=1)
    stuck = await system.spawn(Stuck, on=1)
    pending = asyncio.ensure_future(stuck.call(Stuck.forever))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    stopped = await attempt(hanging_stop.stop())
    stop_seconds = time.monotonic() - started
    stopper_alone = await system.spawn(Stuck, on=2)
    waiting = asyncio.ensure_future(stopper_alone.call(Stuck.forever))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await stopper_alone.stop()
    forever_stop_seconds = time.monotonic() - started
    emit(
        "stuck",
        stop=stopped,
        stop_seconds=stop_seconds,
        on_stop_began=(TMP / "on_stop_began").exists(),
        forever_stop_seconds=forever_stop_seconds,
        forever_outcome=await attempt(waiting),
    )
    stubborn = await system.spawn(Stuck, on=2)
    stubborn.tell(Stuck.stubborn)
    stuck.tell(Stuck.forever)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank2"),), on=2)
    pending.cancel()
    await asyncio.sleep(0.2)


async def blocked(system: actorch.ActorSystem) -> None:
    stuck = await system.spawn(Stuck, on=1)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank2"),), on=2)
    emit("blocked", pid=await stuck.call(Stuck.pid))
    stuck.tell(Stuck.block, 600.0)
    await asyncio.sleep(0.3)


async def rank0(system: actorch.ActorSystem) -> None:
    for rank in (1, 2):
        await system.spawn(Stopper, args=(str(TMP / f"on_stop_rank{rank}"),), on=rank)
    pids = [node.pid for node in system.nodes[1:]]
    (TMP / "ready").write_text(json.dumps(pids))
    await asyncio.sleep(600)


async def main(system: actorch.ActorSystem) -> str:
    await {"stuck": stuck, "blocked": blocked, "rank0": rank0}[MODE](system)
    MAIN_RETURNED.append(time.monotonic())
    return "main finished"


if __name__ == "__main__":
    result = actorch.run(main, world_size=3, stop_grace=GRACE)
    emit("shutdown", seconds=time.monotonic() - MAIN_RETURNED[0], result=result)
