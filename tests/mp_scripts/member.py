"""One rank of a world that the test starts with torchrun's variables (``_mp.start_world``).

Usage: ``python member.py MODE TMPDIR``; every rank runs it, rank 0 runs ``main``:

- ``ok``: ``main`` returns; every rank exits with code 0;
- ``fails``: ``main`` raises; every rank exits with code 1;
- ``blocked``: a handler blocks rank 1's event loop as ``main`` returns: rank 1's
  watchdog ends it (code 1) once rank 0 has left;
- ``stale``: rank 1 calls rank 0 over and over; the test stops rank 1 (SIGSTOP)
  past the liveness timeout, so rank 0 counts it lost, then continues it. Rank 0
  writes ``TMPDIR/ready`` (rank 1's pid) once the calls run, and waits for
  ``TMPDIR/continued`` before it reports what it refused;
- ``expelled``: rank 1, which calls rank 0 every 1.5 s, sleeps 2 s in a C call
  that keeps its interpreter: alive, never stopped, but running nothing, so
  rank 0 (liveness timeout 1 s) counts it lost. Awake again, rank 1 is stale,
  and hears so from rank 0's answers.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from actors import Counter, attempt, emit
from faulty import Caller, Stuck

import actorch

MODE = sys.argv[1]
TMP = Path(sys.argv[2])


async def stale(system: actorch.ActorSystem) -> None:
    counter = await system.spawn(Counter, on=0)
    caller = await system.spawn(Caller, args=(str(TMP / "caller.json"),), on=1)
    calling = asyncio.ensure_future(caller.call(Caller.keep_calling, counter, 120.0))
    await asyncio.sleep(0.5)
    (TMP / "ready").write_text(str(system.nodes[1].pid))
    started = time.monotonic()
    async with asyncio.timeout(30):
        outcome = await attempt(calling)
    emit("lost", outcome=outcome, seconds=time.monotonic() - started, lost=sorted(system.lost_nodes))
    async with asyncio.timeout(60):
        while not (TMP / "continued").exists():  # noqa: ASYNC110 - the test writes the file
            await asyncio.sleep(0.05)
    await asyncio.sleep(3.0)  # time for the stale node to speak, be refused and leave
    emit("refused", count=system.statistics()["messages_refused"])


async def expelled(system: actorch.ActorSystem) -> None:
    counter = await system.spawn(Counter, on=0)
    caller = await system.spawn(Caller, args=(str(TMP / "caller.json"),), on=1)
    sleeper = await system.spawn(Stuck, on=1)
    calling = asyncio.ensure_future(caller.call(Caller.keep_calling, counter, 120.0, 1.5))
    await asyncio.sleep(0.3)
    sleeper.tell(Stuck.hold_asleep, 2)
    async with asyncio.timeout(30):
        outcome = await attempt(calling)
    emit("lost", outcome=outcome, at=time.monotonic(), lost=sorted(system.lost_nodes))
    await asyncio.sleep(3.0)  # time for the stale node to speak, be refused and leave
    emit("refused", count=system.statistics()["messages_refused"])


async def main(system: actorch.ActorSystem) -> str:
    if MODE == "fails":
        await system.spawn(Counter, on=1)
        raise RuntimeError("main fails on purpose")
    if MODE == "stale":
        await stale(system)
    if MODE == "expelled":
        await expelled(system)
    if MODE == "blocked":
        stuck = await system.spawn(Stuck, on=1)
        stuck.tell(Stuck.block, 600.0)
        await asyncio.sleep(0.3)
    return "main finished"


if __name__ == "__main__":
    liveness = 2.5
    if MODE == "expelled" and os.environ["RANK"] == "0":
        liveness = 1.0
    print("RETURNED " + repr(actorch.run(main, stop_grace=1.0, liveness_timeout=liveness)), flush=True)
