"""Throughput against calls in flight: raw ``rpc_async`` and actorch, side by side in one world.

For each number of calls in flight (1, 10, 100, 1,000, 10,000 by default), both
sides send that many no-op calls at once and wait for all, again and again,
alternating raw and actorch rounds on the same torch RPC agent; the table gives
the medians of rounds, and ``--png`` draws them (needs matplotlib, in the
``examples`` extra).

    python benchmarks/bench_inflight.py
    python benchmarks/bench_inflight.py --png docs/img/throughput-in-flight.png
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import torch
import torch.distributed.rpc as rpc

import actorch

WORKER = "node1"


def noop() -> None:
    return None


class Echo(actorch.Actor):
    async def noop(self) -> None:
        return None


def calls_per_round(in_flight: int) -> int:
    """Enough calls per round for a stable figure: at least 2,000, in whole batches."""
    return max(in_flight, 2000 // in_flight * in_flight)


def raw(in_flight: int) -> float:
    total = calls_per_round(in_flight)
    start = time.perf_counter()
    for _ in range(total // in_flight):
        torch.futures.wait_all([rpc.rpc_async(WORKER, noop) for _ in range(in_flight)])
    return total / (time.perf_counter() - start)


async def on_actorch(ref: actorch.ActorRef[Echo], in_flight: int) -> float:
    total = calls_per_round(in_flight)
    start = time.perf_counter()
    for _ in range(total // in_flight):
        await asyncio.gather(*(ref.call(Echo.noop) for _ in range(in_flight)))
    return total / (time.perf_counter() - start)


async def bench(system: actorch.ActorSystem, levels: list[int], rounds: int) -> dict[int, dict[str, float]]:
    ref = await system.spawn(Echo, on=1)
    for _ in range(200):  # warm up both paths
        rpc.rpc_sync(WORKER, noop)
        await ref.call(Echo.noop)
    results: dict[int, dict[str, float]] = {}
    for in_flight in levels:
        raws, ours = [], []
        for _ in range(rounds):
            raws.append(raw(in_flight))
            ours.append(await on_actorch(ref, in_flight))
        results[in_flight] = {"raw": statistics.median(raws), "actorch": statistics.median(ours)}
    return results


def report(results: dict[int, dict[str, float]]) -> None:
    print(f"{'in flight':>9}  {'raw rpc_async':>14}  {'actorch':>10}  ratio")
    for in_flight, row in results.items():
        print(f"{in_flight:>9,}  {row['raw']:>12,.0f}/s  {row['actorch']:>8,.0f}/s  {row['actorch'] / row['raw']:5.2f}")


def draw(results: dict[int, dict[str, float]], path: str) -> None:
    import matplotlib  # noqa: PLC0415 - only for --png; an extra, not a dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    levels = list(results)
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(levels, [results[k]["raw"] for k in levels], marker="o", label="raw torch rpc_async")
    axes.plot(levels, [results[k]["actorch"] for k in levels], marker="o", label="actorch ref.call")
    axes.set_xscale("log")
    axes.set_xlabel("calls in flight")
    axes.set_ylabel("no-op calls per second")
    axes.set_title("Throughput between two processes (2 cores, medians)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"saved {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 10, 100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--png", help="save the figure here")
    args = parser.parse_args()

    async def run(system: actorch.ActorSystem) -> dict[int, dict[str, Any]]:
        return await bench(system, args.levels, args.rounds)

    results = actorch.run(run, world_size=2)
    report(results)
    if args.png:
        draw(results, args.png)


if __name__ == "__main__":
    main()
