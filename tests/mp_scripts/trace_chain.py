"""A three-node run traced from the start: main -> A (node 1) -> B (node 2) -> C (node 0), tells, waits.

``python trace_chain.py PATH`` traces with ``run(trace=PATH)``, ``PATH SAMPLE``
with ``system.trace(PATH, sample=SAMPLE)`` around the chain;
``actorch run -n 3 --trace PATH trace_chain.py - [SAMPLE]`` through the
launcher (``-``: no path of its own). Its result ``chain`` is what ``main``
saw, for the test to hold the file against.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from actors import emit
from traced import Busy, Hop

import actorch

PATH = sys.argv[1]
SAMPLE = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
CALLS = 20


async def main(system: actorch.ActorSystem) -> None:
    if SAMPLE < 1:
        async with system.trace(PATH, sample=SAMPLE) as timeline:
            await chain(system)
        emit("timeline", events=timeline.events, dropped=timeline.dropped, missing=timeline.missing)
    else:
        await chain(system)


async def chain(system: actorch.ActorSystem) -> None:
    c = await system.spawn(Hop, name="c", on=0)
    b = await system.spawn(Hop, args=(c,), name="b", on=2)
    a = await system.spawn(Hop, args=(b,), name="a", on=1)
    busy = await system.spawn(Busy, name="busy", on=2)
    results = [await a.call(Hop.relay, i) for i in range(CALLS)]
    for i in range(CALLS):
        a.tell(Hop.note, i)
    while await a.call(Hop.noted_count) < CALLS:  # noqa: ASYNC110 - the count lives in another process
        await asyncio.sleep(0.01)
    await asyncio.gather(*(busy.call(Busy.hold, 0.01) for _ in range(4)))
    with contextlib.suppress(ValueError):
        await b.call(Hop.fail)
    counted = [item async for item in b.stream(Hop.count, 5)]
    emit("chain", results=results, counted=counted, pids={str(node.rank): node.pid for node in system.nodes})


if __name__ == "__main__":
    if PATH == "-" or SAMPLE < 1:
        actorch.run(main, world_size=3)
    else:
        actorch.run(main, world_size=3, trace=PATH)
