"""A stopped actor's name is gone from every node that had it cached, at once, round after round, under load.

Usage: ``python names.py``. A ``run(world_size=4)`` system puts a ``Finder``
on every node but rank 0, and keeps every node busy with calls all along. Each
round spawns a named actor (plain, or relocatable, on each node in turn), has
every node look its name up (so that every node's cache holds it), stops it
(from rank 0, or from a ``Finder`` on another node) and, as soon as ``stop()``
returns, looks the name up from every node at once with a short deadline and
lists its pattern there. Every lookup must fail and every list be empty. A
last round does the same while one node's event loop is kept busy by a handler
for longer than the registry waits for evictions: that node must still drop
the name before it looks it up again. Before all that, while nothing runs on
rank 0 yet, one actor's name is used every way a program uses one (lookups
from two nodes, a glob, a refused spawn, remote errors, a cancelled call,
tells and calls at once), stopped, and must be gone from every node too. Prints one ``RESULT`` per round, and
``RETURNED`` with the number of rounds and whether the load ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from actors import Counter, Finder, Tally, attempt, emit

import actorch
from actorch._actors.registry import EVICT_TIMEOUT

ROUNDS = 8
WORLD_SIZE = 4
LIVENESS = 30.0
"""A loaded machine starves processes: no node here is lost, so none is counted lost for a silence."""
BRIEFLY = 0.3
"""Seconds a lookup after the stop may wait: the name must already be gone, so it fails by then."""
IN_FLIGHT = 16
"""Calls the load keeps in flight to each node."""


async def look_briefly(system: actorch.ActorSystem, name: str) -> dict[str, Any]:
    async with asyncio.timeout(BRIEFLY):
        ref = await system.lookup(name)
    return {"found": [ref.name, ref.rank]}


async def load(counters: list[actorch.ActorRef[Counter]], made: list[int]) -> None:
    """Keep ``IN_FLIGHT`` calls in flight to each counter, until cancelled."""
    while True:
        await asyncio.gather(*(counter.call(Counter.add, 1) for counter in counters for _ in range(IN_FLIGHT)))
        made[0] += IN_FLIGHT * len(counters)


async def look_everywhere(system: actorch.ActorSystem, finders: list[actorch.ActorRef[Finder]], name: str) -> list[Any]:
    """Look ``name`` up from every node at once, briefly: each outcome's error type (or what was found)."""
    after = await asyncio.gather(
        attempt(look_briefly(system, name)),
        *(finder.call(Finder.find_within, name, BRIEFLY) for finder in finders),
    )
    return [outcome.get("error", {}).get("type") or outcome for outcome in after]


async def list_everywhere(system: actorch.ActorSystem, finders: list[actorch.ActorRef[Finder]]) -> list[Any]:
    listed = await asyncio.gather(
        system.lookup_all("cached/*"), *(finder.call(Finder.list_names, "cached/*") for finder in finders)
    )
    return [[ref.name for ref in listed[0]], *listed[1:]]


async def one_round(system: actorch.ActorSystem, finders: list[actorch.ActorRef[Finder]], index: int) -> None:
    name = f"cached/{index}"
    relocatable = index % 2 == 1
    if relocatable:  # never on rank 0
        on = 1 + (index // 2) % (WORLD_SIZE - 1)
        target: actorch.ActorRef[Any] = await system.spawn(
            Tally, name=name, on=on, restart=actorch.Restart(relocate=True)
        )
    else:
        on = (index // 2) % WORLD_SIZE
        target = await system.spawn(Counter, args=(index,), name=name, on=on)
    cached = [(await system.lookup(name)).rank]
    cached += [found[1] for found in await asyncio.gather(*(finder.call(Finder.find, name) for finder in finders))]
    stopper = "main" if index % 4 < 2 else next(f"finder on {f.rank}" for f in finders if f.rank != on)
    if stopper == "main":
        await target.stop()
    else:
        await next(f for f in finders if f.rank != on).call(Finder.stop_named, name)
    after = await look_everywhere(system, finders, name)
    listed = await list_everywhere(system, finders)
    emit(f"round {index}", on=on, relocatable=relocatable, stopper=stopper, cached=cached, after=after, listed=listed)


async def busy_round(system: actorch.ActorSystem, finders: list[actorch.ActorRef[Finder]]) -> None:
    """Stop an actor while the node of ``finders[-1]``, which has its name cached, is busy past ``EVICT_TIMEOUT``."""
    name = "cached/busy"
    target = await system.spawn(Counter, name=name, on=1)
    cached = [(await system.lookup(name)).rank]
    cached += [found[1] for found in await asyncio.gather(*(finder.call(Finder.find, name) for finder in finders))]
    busy = finders[-1]
    busy.tell(Finder.block, EVICT_TIMEOUT + 1.0)
    await asyncio.sleep(0.5)  # the handler has the loop by now
    await target.stop()
    after = await look_everywhere(system, finders, name)  # the busy node answers once its handler is done
    listed = await list_everywhere(system, finders)
    emit("busy", busy=busy.rank, cached=cached, after=after, listed=listed)


async def used_every_way(system: actorch.ActorSystem, finders: list[actorch.ActorRef[Finder]]) -> None:
    """One actor's name used every way a program uses one, in this order, then stopped: the name must be gone.

    Found from rank 0 and from an actor on another node, listed by a glob,
    refused to a second spawn, through remote errors, a call its deadline
    cancels, 500 tells and 1,000 calls at once. It runs before anything has
    been spawned on rank 0.
    """
    name = "held/out"
    target = await system.spawn(Tally, name=name, on=1)
    cached = [(await system.lookup(name)).rank, (await finders[1].call(Finder.find, name))[1]]
    globbed = [ref.name for ref in await system.lookup_all("held/*")]
    refused = await attempt(system.spawn(Tally, name=name, on=2))
    errors = [await attempt(target.call(Tally.add, "x")) for _ in range(3)]  # type: ignore[arg-type]
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.05):
            await target.call(Tally.hang, 5.0)
    for _ in range(500):
        target.tell(Tally.add, 1)
    added = await asyncio.gather(*(target.call(Tally.add, 1) for _ in range(1000)))
    await target.stop()
    after = await look_everywhere(system, finders, name)
    emit(
        "used every way",
        cached=cached,
        globbed=globbed,
        refused=refused["error"]["type"],
        errors=[error["error"]["type"] for error in errors],
        counted=max(added),
        after=after,
        listed=[[ref.name for ref in await system.lookup_all("held/*")]],
    )


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    finders = [await system.spawn(Finder, on=rank) for rank in range(1, WORLD_SIZE)]
    await used_every_way(system, finders)
    counters = [await system.spawn(Counter, on=rank) for rank in range(WORLD_SIZE)]
    made = [0]
    loading = asyncio.ensure_future(load(counters, made))
    try:
        for index in range(ROUNDS):
            await one_round(system, finders, index)
        await busy_round(system, finders)
    finally:
        loading.cancel()
    return {"rounds": ROUNDS, "loaded": made[0] > 0}


if __name__ == "__main__":
    result = actorch.run(main, world_size=WORLD_SIZE, stop_grace=1.0, liveness_timeout=LIVENESS)
    print("RETURNED " + json.dumps(result), flush=True)
