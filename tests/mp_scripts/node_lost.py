"""A worker dies mid-run (SIGKILL); calls fail with NodeLostError and shutdown stays bounded.

Usage: ``python node_lost.py handler|pid|stop TMPDIR``: ``handler`` makes the
actor on rank 1 kill its own process inside a call; ``pid`` makes ``main`` kill
the worker's pid from ``system.nodes[1]``; ``stop`` freezes it with SIGSTOP, a
hang that closes no connection, so only the heartbeats can tell. Either way a
call is pending meanwhile. Rank 0 kills a worker it lost, stopped or not.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from actors import Counter, Stopper, Victim, attempt, attempt_now, emit, is_dead

import actorch

MODE = sys.argv[1]
TMP = Path(sys.argv[2])
MAIN_RETURNED: list[float] = []
STOPPED: list[int] = []


async def main(system: actorch.ActorSystem) -> str:
    victim = await system.spawn(Victim, name="victim/a", on=1)
    survivor = await system.spawn(Counter, args=(5,), name="survivor", on=2)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_survivor"),), on=2)
    victim_pid = system.nodes[1].pid
    reported_pid = await victim.call(Victim.get)
    pending = asyncio.ensure_future(victim.call(Victim.hang, 60))
    await asyncio.sleep(0.3)
    killed_at = time.monotonic()
    dying = None
    if MODE == "handler":
        dying = asyncio.ensure_future(victim.call(Victim.die))
    elif MODE == "stop":
        os.kill(victim_pid, signal.SIGSTOP)
        STOPPED.append(victim_pid)
    else:
        os.kill(victim_pid, signal.SIGKILL)

    async def settle(task: Any) -> Any:
        async with asyncio.timeout(15):
            return await task

    pending_outcome = await attempt(settle(pending))
    pending_outcome["since_kill"] = time.monotonic() - killed_at
    dying_outcome = await attempt(settle(dying)) if dying is not None else None
    new_call = await attempt(victim.call(Victim.get))
    new_tell = attempt_now(lambda: victim.tell(Victim.get))
    spawn_on_lost = await attempt(system.spawn(Counter, on=1))

    async def lookup_briefly() -> Any:
        async with asyncio.timeout(1.0):
            return await system.lookup("victim/a")

    lookup_lost = await attempt(lookup_briefly())
    survivor_value = await survivor.call(Counter.add, 1)
    fresh = await system.spawn(Counter, args=(8,), name="fresh", on=2)
    emit(
        "node_lost",
        mode=MODE,
        victim_pid=victim_pid,
        reported_pid=reported_pid,
        victim_dead=is_dead(victim_pid),
        pending=pending_outcome,
        dying=dying_outcome,
        new_call=new_call,
        new_tell=new_tell,
        spawn_on_lost=spawn_on_lost,
        lookup_lost=lookup_lost,
        listed=[ref.name for ref in await system.lookup_all("**")],
        lost_nodes=sorted(system.lost_nodes),
        survivor_value=survivor_value,
        fresh=[fresh.rank, await fresh.call(Counter.get)],
    )
    MAIN_RETURNED.append(time.monotonic())
    return "main finished"


if __name__ == "__main__":
    result = actorch.run(main, world_size=3)
    emit("shutdown", seconds=time.monotonic() - MAIN_RETURNED[0], result=result)
    emit("stopped_worker", dead=[is_dead(pid) for pid in STOPPED])  # rank 0 kills a worker it lost
    print("RETURNED " + json.dumps(result), flush=True)
