"""Many actors in one process: spawn, fan-out call, lookup, lookup_all and stop, at growing N.

Every step should grow linearly with N; the table shows the time of each step
and its time per actor, and the memory each actor takes. One process, the
in-process world of ``actorch.run(main)``. The last column is the time of one
call while every one of the N actors waits inside an ``asyncio.timeout`` of its
own: each call reads its caller's deadline, and that read must not grow with
the timers armed elsewhere.

    python benchmarks/bench_scale.py                       # N = 2,500 / 5,000 / 10,000 / 20,000
    python benchmarks/bench_scale.py --sizes 1000 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import tracemalloc
from typing import Any

import actorch


class Leaf(actorch.Actor):
    async def ping(self) -> int:
        return 1

    async def nap(self, seconds: float) -> None:
        async with asyncio.timeout(60):  # a timer of its own, armed while it naps
            await asyncio.sleep(seconds)


NAP = 0.5
"""Seconds each actor naps (a timeout and a sleep armed) while one call after another is timed."""
TIMED_CALLS = 2_000


async def bytes_per_actor(system: actorch.ActorSystem, n: int) -> float:
    """Memory Python allocates for each of ``n`` named actors (traced in a round of its own, not timed)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    refs = await asyncio.gather(*(system.spawn(Leaf, name=f"memory/{i}") for i in range(n)))
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    await asyncio.gather(*(ref.stop() for ref in refs))
    return (after - before) / n


async def one_round(system: actorch.ActorSystem, n: int) -> dict[str, float]:
    gc.collect()
    started = time.perf_counter()
    refs = await asyncio.gather(*(system.spawn(Leaf, name=f"scale/{i}") for i in range(n)))
    spawned = time.perf_counter()
    await asyncio.gather(*(ref.call(Leaf.ping) for ref in refs))
    called = time.perf_counter()
    await asyncio.gather(*(system.lookup(f"scale/{i}") for i in range(n)))
    looked_up = time.perf_counter()
    found = await system.lookup_all("scale/*")
    listed = time.perf_counter()
    assert len(found) == n
    await asyncio.gather(*(ref.stop() for ref in refs))
    stopped = time.perf_counter()
    return {
        "spawn": spawned - started,
        "call": called - spawned,
        "lookup": looked_up - called,
        "lookup_all": listed - looked_up,
        "stop": stopped - listed,
        "call_among_timers": await call_among_timers(system, await spawn_nappers(system, n)),
    }


async def spawn_nappers(system: actorch.ActorSystem, n: int) -> list[actorch.ActorRef[Leaf]]:
    return list(await asyncio.gather(*(system.spawn(Leaf) for _ in range(n))))


async def call_among_timers(system: actorch.ActorSystem, nappers: list[actorch.ActorRef[Leaf]]) -> float:
    """Seconds per call to an idle actor while every napper waits in its own ``asyncio.timeout``."""
    target = await system.spawn(Leaf)
    naps = [asyncio.ensure_future(ref.call(Leaf.nap, NAP)) for ref in nappers]
    await asyncio.sleep(0.05)  # every nap has begun: 2 timers armed per napper
    started = time.perf_counter()
    for _ in range(TIMED_CALLS):
        await target.call(Leaf.ping)
    per_call = (time.perf_counter() - started) / TIMED_CALLS
    await asyncio.gather(*naps)
    await asyncio.gather(*(ref.stop() for ref in [*nappers, target]))
    return per_call


async def bench(system: actorch.ActorSystem, sizes: list[int], rounds: int) -> dict[int, dict[str, float]]:
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        runs = [await one_round(system, n) for _ in range(rounds)]
        results[n] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        results[n]["kb_per_actor"] = await bytes_per_actor(system, n) / 1024
    return results


def report(results: dict[int, dict[str, Any]]) -> None:
    steps = ("spawn", "call", "lookup", "lookup_all", "stop")
    print(f"{'N':>7}  " + "  ".join(f"{step:>16}" for step in steps) + "  memory/actor  call among N timers")
    for n, row in results.items():
        cells = [f"{row[step]:6.3f} s {row[step] / n * 1e6:5.1f} us" for step in steps]
        memory, among = f"{row['kb_per_actor']:9.1f} KB", f"{row['call_among_timers'] * 1e6:6.1f} us"
        print(f"{n:>7}  " + "  ".join(f"{cell:>16}" for cell in cells) + f"  {memory}  {among:>18}")
    print("(each cell: the step for all N actors, then per actor; medians of rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2500, 5000, 10000, 20000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    async def run(system: actorch.ActorSystem) -> dict[int, dict[str, float]]:
        return await bench(system, args.sizes, args.rounds)

    report(actorch.run(run, configure_logs=True))


if __name__ == "__main__":
    main()
