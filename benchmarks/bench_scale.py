"""Many actors in one process: spawn, fan-out call, lookup, lookup_all and stop, at growing N.

Every step should grow linearly with N; the table shows the time of each step
and its time per actor, and the memory each actor takes. One process, the
in-process world of ``actorch.run(main)``.

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
    }


async def bench(system: actorch.ActorSystem, sizes: list[int], rounds: int) -> dict[int, dict[str, float]]:
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        runs = [await one_round(system, n) for _ in range(rounds)]
        results[n] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        results[n]["kb_per_actor"] = await bytes_per_actor(system, n) / 1024
    return results


def report(results: dict[int, dict[str, Any]]) -> None:
    steps = ("spawn", "call", "lookup", "lookup_all", "stop")
    print(f"{'N':>7}  " + "  ".join(f"{step:>16}" for step in steps) + "  memory/actor")
    for n, row in results.items():
        cells = [f"{row[step]:6.3f} s {row[step] / n * 1e6:5.1f} us" for step in steps]
        print(f"{n:>7}  " + "  ".join(f"{cell:>16}" for cell in cells) + f"  {row['kb_per_actor']:6.1f} KB")
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
