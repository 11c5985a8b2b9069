"""A three-process world on ``FaultyTransport(TorchRpc(), Partition({2}, ...))``: rank 2 cut off while a call waits.

Usage: ``python faulty_world.py [stalled]``. The record travels to every
worker (pickled by the launch), so each node runs the same schedule from the
same epoch. Rank 0 spawns an actor on ranks 1 and 2 before the partition
begins (``CUT_AT`` seconds after the epoch), keeps a call to rank 2 pending,
and reports how it ended and when (``partition``): a real partition's bounds,
on torch RPC and the lane alike.

``stalled``: a helper process stops rank 0 (``SIGSTOP``) just after the cut,
for ``STALL`` seconds, so that rank 0's heartbeats give rank 2 a full
``liveness_timeout`` from when it runs again, while rank 2 counts rank 0 lost
that long before: whatever rank 2 then says to rank 0 must not cross the cut.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from actors import describe, emit

import actorch
from actorch.testing import FaultyTransport, Partition

CUT_AT = 12.0
"""Seconds after the epoch the partition begins: every node has started, and the actors are spawned, by then."""
EPOCH = time.time()
LIVENESS = 2.5
SETTLE = 30.0
STALLED = sys.argv[1:] == ["stalled"]
STALL = 1.0
"""Seconds rank 0 is stopped just after the cut (``stalled``): rank 2 counts it lost that much earlier."""
STOPPER = """
import os, signal, sys, time
pid, at, stall = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
time.sleep(max(0.0, at - time.time()))
os.kill(pid, signal.SIGSTOP)
time.sleep(stall)
os.kill(pid, signal.SIGCONT)
"""


class Side(actorch.Actor):
    async def hang(self) -> None:
        await asyncio.Event().wait()

    async def echo(self, value: Any) -> Any:
        return value

    async def lost(self) -> dict[int, str]:
        return self.system.lost_nodes


async def main(system: actorch.ActorSystem) -> str:
    near = await system.spawn(Side, on=1)
    far = await system.spawn(Side, on=2)
    assert await far.call(Side.echo, "before") == "before"  # the lane and torch RPC carry as usual
    lane_bundles = system.statistics()["lane_bundles_sent"]
    if time.time() >= EPOCH + CUT_AT:
        emit("partition", failed="the world started after the partition began: raise CUT_AT")
        return "late"
    pending = asyncio.ensure_future(far.call(Side.hang))
    try:
        async with asyncio.timeout(CUT_AT + SETTLE):
            await pending
        outcome: dict[str, Any] = {"value": "answered"}
    except Exception as exc:
        outcome = {"error": describe(exc)}
    after = time.time() - (EPOCH + CUT_AT)
    async with asyncio.timeout(SETTLE):
        while 2 not in await near.call(Side.lost):  # noqa: ASYNC110 - rank 1 sees it in its own time
            await asyncio.sleep(0.05)
    emit(
        "partition",
        outcome=outcome,
        lost_after=after,
        why=system.lost_nodes.get(2),
        near_still_answers=await near.call(Side.echo, "after") == "after",
        near_lost=sorted(await near.call(Side.lost)),
        lane_bundles_before=lane_bundles,
    )
    return "returned"


if __name__ == "__main__":
    if STALLED:  # this process is rank 0
        subprocess.Popen([sys.executable, "-c", STOPPER, str(os.getpid()), repr(EPOCH + CUT_AT + 0.2), repr(STALL)])
    record = FaultyTransport(actorch.TorchRpc(), Partition({2}, start=CUT_AT), epoch=EPOCH)
    print("RETURNED " + json.dumps(actorch.run(main, world_size=3, transport=record, liveness_timeout=LIVENESS)))
