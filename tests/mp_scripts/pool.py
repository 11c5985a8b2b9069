"""Node processes on demand in one real system: add_nodes, placement on them, processes of an actor's own.

Usage:

- ``python pool.py grow``: a static ``run(world_size=2)`` system (an elastic
  world underneath) adds two labelled nodes with declared resources and an
  environment, places actors on them by label and resources, gives two
  CPU-bound actors processes of their own, shows them in the status, lets one
  go (its process leaves and is reaped), has an added node leave, then
  ``LEAVE_ROUNDS`` times adds three nodes and has them leave all at once the
  moment ``add_nodes`` returns, and returns; every process it started must be
  gone with it.
- ``python pool.py reap``: an elastic ``run(world_size=3)`` system has its two
  launch workers leave, one after the other, then, ``REAP_ROUNDS`` times in a
  row, adds a node and an actor of its own process, has the node leave and
  stops the actor at once, and follows each process that left until it is
  gone: how long it was seen a zombie (its parent must reap it at once), and
  whether a stopped actor's node was still listed when ``stop()`` returned.
- ``python pool.py hold TMPDIR``: a one-process ``run(main)`` system adds a node
  and an actor of its own process, starts adding one more, writes the pids of
  the three to ``TMPDIR/pids`` while the last still starts, and waits until the
  test interrupts it (Ctrl-C, SIGTERM) or kills it.

Every check prints one ``RESULT {json}``.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

from actors import Simulator, attempt, emit, is_dead, run_checks

import actorch
from actorch._launch.services.status import gather_status

WORK_SECONDS = 1.0
REAP_ROUNDS = 4
"""Rounds of ``pool.py reap``: each has an added node leave and an actor's own process stop (8 exits in all)."""
LEAVE_ROUNDS = 2
"""Rounds of ``pool.py grow``'s last check: three nodes added, then leaving together at once."""
GONE_WITHIN = 60.0
"""Seconds ``pool.py reap`` follows a process that left before it gives up waiting for it to be gone."""


async def add_and_place(system: actorch.ActorSystem) -> dict[str, Any]:
    waiting = asyncio.ensure_future(system.wait_nodes(4))  # woken by the joins below
    added = await system.add_nodes(2, label="env", resources={"env_slots": 2}, env={"POOL_TEST_ENV": "set"})
    nodes = await waiting
    envs = [
        await system.spawn(Simulator, name=f"envs/{index}", on=actorch.Where(label="env", resources={"env_slots": 1}))
        for index in range(4)
    ]
    where = [await env.call(Simulator.where) for env in envs]
    full = await attempt(system.spawn(Simulator, on=actorch.Where(label="env", resources={"env_slots": 1})))
    await envs[0].stop()
    again = await system.spawn(Simulator, on=actorch.Where(label="env", resources={"env_slots": 1}))
    return {
        "added": [[info.rank, info.label, info.pid, info.parent, dict(info.resources)] for info in added],
        "waited": [info.rank for info in nodes],
        "where": where,
        "full": full,
        "again": again.rank,
        "static": system.elastic,
    }


async def own_processes(system: actorch.ActorSystem) -> dict[str, Any]:
    started = time.monotonic()
    pair = await system.spawn_group(Simulator, 2, name="own", on=actorch.Where(process="own"))
    spawned = time.monotonic() - started
    started = time.monotonic()
    walls = await asyncio.gather(*(member.call(Simulator.work, WORK_SECONDS) for member in pair))
    together = time.monotonic() - started
    where = [await member.call(Simulator.where) for member in pair]
    child = await attempt(pair[1].call(Simulator.start_a_process))
    status = await gather_status(system.host)
    owners = {node["rank"]: node.get("owner") for node in status["nodes"]}
    first = pair[0]
    pid = where[0]["pid"]
    await first.stop()
    async with asyncio.timeout(20):
        while first.rank in {info.rank for info in system.nodes} or not is_dead(pid):  # noqa: ASYNC110 - a process
            await asyncio.sleep(0.05)
    env_node = next(node for node in status["nodes"] if node.get("label") == "env")
    return {
        "spawn_seconds": spawned,
        "work_seconds": together,
        "walls": walls,
        "ranks": [member.rank for member in pair],
        "pids": [entry["pid"] for entry in where],
        "owners": owners,
        "schema": status["schema"],
        "env_node": {key: env_node.get(key) for key in ("resources", "free", "held", "parent", "owner", "pool")},
        "left": first.rank in system.lost_nodes,
        "gone_from_nodes": first.rank not in {info.rank for info in system.nodes},
        "child": child,
    }


async def leave_an_added_node(system: actorch.ActorSystem) -> dict[str, Any]:
    added = [info for info in system.nodes if info.label == "env"]
    rank, pid = added[0].rank, added[0].pid
    await system.leave(rank)
    async with asyncio.timeout(20):
        while not is_dead(pid):  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.05)
    refused = await attempt(system.leave(1))  # a node of the launch: the system is not elastic
    return {"left": rank, "refused": refused}


async def leave_together(system: actorch.ActorSystem) -> dict[str, Any]:
    """Nodes that joined together leave together, the moment ``add_nodes`` returns: each must know the others."""
    rounds = []
    for _ in range(LEAVE_ROUNDS):
        added = await system.add_nodes(3)
        left = await asyncio.gather(*(attempt(system.leave(info.rank)) for info in added))
        rounds.append(
            {"ranks": [info.rank for info in added], "left": [outcome.get("value", outcome) for outcome in left]}
        )
    return {"rounds": rounds, "live": sorted(info.rank for info in system.nodes)}


async def grow(system: actorch.ActorSystem) -> dict[str, Any]:
    return await run_checks(
        system,
        [
            ("add_and_place", add_and_place),
            ("own_processes", own_processes),
            ("leave", leave_an_added_node),
            ("leave_together", leave_together),
        ],
        seconds=90.0,
    )


def process_state(pid: int) -> str:
    """The state letter of ``pid`` in ``/proc`` (``Z``: a zombie), or ``gone``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


async def follow(pid: int) -> dict[str, Any]:
    """Follow a process that left until it is gone: whether it went, and for how long it was seen a zombie."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_WITHIN
    zombie_since = None
    while (state := process_state(pid)) != "gone" and loop.time() < deadline:
        if state == "Z" and zombie_since is None:
            zombie_since = loop.time()
        await asyncio.sleep(0.01)
    return {"gone": state == "gone", "zombie": 0.0 if zombie_since is None else loop.time() - zombie_since}


async def leave_and_follow(system: actorch.ActorSystem, node: actorch.NodeInfo) -> dict[str, Any]:
    """Have ``node`` leave, then follow its process."""
    await system.leave(node.rank)
    return await follow(node.pid)


async def stop_and_follow(system: actorch.ActorSystem, owned: actorch.ActorRef[Simulator]) -> dict[str, Any]:
    """Stop an actor of its own process; whether its node was still listed then; follow its process."""
    pid = (await owned.call(Simulator.where))["pid"]
    await owned.stop()
    listed = owned.rank in {info.rank for info in system.nodes}
    return {"listed": listed, **await follow(pid)}


async def reap(system: actorch.ActorSystem) -> dict[str, Any]:
    workers = [await leave_and_follow(system, info) for info in system.nodes if info.rank != 0]
    rounds = []
    for _ in range(REAP_ROUNDS):
        (added,), owned = await asyncio.gather(
            system.add_nodes(1), system.spawn(Simulator, on=actorch.Where(process="own"))
        )
        left, stopped = await asyncio.gather(leave_and_follow(system, added), stop_and_follow(system, owned))
        rounds.append({"left": left, "stopped": stopped})
    emit("reap", workers=workers, rounds=rounds)
    return {"rounds": len(rounds)}


async def hold(system: actorch.ActorSystem) -> None:
    node = (await system.add_nodes(1))[0]
    own = await system.spawn(Simulator, on=actorch.Where(process="own"))
    where = await own.call(Simulator.where)
    starting = asyncio.ensure_future(system.add_nodes(1))  # still starting when the test ends the run
    await asyncio.sleep(0.5)
    pids = sorted({node.pid, where["pid"], *(child.pid for child in multiprocessing.active_children())})
    Path(sys.argv[2], "pids").write_text(json.dumps(pids))  # noqa: ASYNC240 - one small file, once
    emit("held", pids=pids, ranks=[node.rank, own.rank])
    await starting
    await asyncio.sleep(600)


if __name__ == "__main__":
    if sys.argv[1] == "grow":
        print("RETURNED " + json.dumps(actorch.run(grow, world_size=2, stop_grace=2.0)), flush=True)
    elif sys.argv[1] == "reap":
        # A loaded machine starves node processes as they start: none is lost here, so none is counted lost.
        returned = actorch.run(reap, world_size=3, elastic=True, stop_grace=1.0, liveness_timeout=30.0)
        print("RETURNED " + json.dumps(returned), flush=True)
    else:
        actorch.run(hold, stop_grace=1.0)
