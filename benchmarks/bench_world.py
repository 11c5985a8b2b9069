"""Worlds of 2, 4 and 8 processes on one machine: throughput, and 1,000 actors spread over the ranks.

For each world size it starts a world, measures no-op calls per second with
2,000 in flight from rank 0 to an actor on every other rank at once, then
spawns 1,000 named actors spread round-robin over all ranks, calls each once,
looks each up by name from rank 0, and stops them all, each step at once
(``asyncio.gather``). Medians of rounds.

    python benchmarks/bench_world.py                  # world sizes 2, 4, 8
    python benchmarks/bench_world.py --sizes 2 4 --actors 500 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import actorch


class Echo(actorch.Actor):
    async def noop(self) -> None:
        return None


async def throughput(system: actorch.ActorSystem, in_flight: int) -> float:
    targets = [await system.spawn(Echo, on=rank) for rank in range(1, system.world_size)]
    for ref in targets:
        await ref.call(Echo.noop)
    start = time.perf_counter()
    await asyncio.gather(*(targets[i % len(targets)].call(Echo.noop) for i in range(in_flight)))
    elapsed = time.perf_counter() - start
    await asyncio.gather(*(ref.stop() for ref in targets))
    return in_flight / elapsed


async def actors(system: actorch.ActorSystem, count: int) -> dict[str, float]:
    started = time.perf_counter()
    refs = await asyncio.gather(
        *(system.spawn(Echo, name=f"world/{i}", on=i % system.world_size) for i in range(count))
    )
    spawned = time.perf_counter()
    await asyncio.gather(*(ref.call(Echo.noop) for ref in refs))
    called = time.perf_counter()
    await asyncio.gather(*(system.lookup(f"world/{i}") for i in range(count)))
    looked_up = time.perf_counter()
    await asyncio.gather(*(ref.stop() for ref in refs))
    stopped = time.perf_counter()
    return {
        "spawn": spawned - started,
        "call": called - spawned,
        "lookup": looked_up - called,
        "stop": stopped - looked_up,
    }


def measure(world_size: int, count: int, in_flight: int, rounds: int) -> dict[str, float]:
    async def run(system: actorch.ActorSystem) -> dict[str, float]:
        rates = [await throughput(system, in_flight) for _ in range(rounds)]
        steps = [await actors(system, count) for _ in range(rounds)]
        result = {key: statistics.median(step[key] for step in steps) for key in steps[0]}
        result["calls_per_s"] = statistics.median(rates)
        return result

    return actorch.run(run, world_size=world_size)


def report(results: dict[int, dict[str, Any]], count: int, in_flight: int) -> None:
    print(
        f"world  calls/s ({in_flight:,} in flight)  "
        + "  ".join(f"{s} {count:,}" for s in ("spawn", "call", "lookup", "stop"))
    )
    for size, row in results.items():
        print(
            f"{size:>5}  {row['calls_per_s']:>22,.0f}  "
            + "  ".join(
                f"{row[step]:>{len(step) + len(f'{count:,}')}.3f}" for step in ("spawn", "call", "lookup", "stop")
            )
        )
    print("(seconds for each step over all actors at once; medians of rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--actors", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = {size: measure(size, args.actors, args.in_flight, args.rounds) for size in args.sizes}
    report(results, args.actors, args.in_flight)


if __name__ == "__main__":
    main()
