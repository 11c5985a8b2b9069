"""Pipeline stage overlap: the RPC tutorial's raw torch RPC pipeline against examples/pipeline.py, in one world.

Both sides train the same two-shard ResNet of ``examples/pipeline.py`` (shard 1
on rank 1, shard 2 on rank 2, driven from rank 0) with distributed autograd and
a ``DistributedOptimizer``, on the very same torch RPC agent:

- raw: the tutorial's shape. Each micro-batch goes as ``RRef(x)`` to
  ``p1_rref.remote().forward(x_rref)``, whose result RRef goes to
  ``p2_rref.rpc_async().forward(y_rref)``; shards fetch their input with
  ``to_here()`` and compute under a lock; rank 0 waits on all futures.
- actorch: ``examples/pipeline.py`` itself. Micro-batches go to shard 1 through
  concurrent ``ref.call``s; shard 1 calls shard 2 itself.

Each shard records when it starts and ends computing each micro-batch, on
``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process of a Linux
machine). The overlap of a run is the time during which both shards were
computing at once. Rounds alternate raw and actorch runs; the table shows
medians over rounds.

    python benchmarks/bench_pipeline.py                  # 1, 2, 4, 8 micro-batches, 5 rounds
    python benchmarks/bench_pipeline.py --quick          # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch import nn
from torch.distributed.optim import DistributedOptimizer

import actorch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from pipeline import DistResNet, Shard1, Shard2, batches, shard1_layers, shard2_layers

Interval = tuple[float, float]


class Timed(nn.Module):
    """Wraps a shard's layers and records when each forward starts and ends."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.intervals: list[Interval] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.monotonic()
        out = self.inner(x)
        self.intervals.append((start, time.monotonic()))
        return out

    def take(self) -> list[Interval]:
        taken, self.intervals = self.intervals, []
        return taken


# ---- actorch: the example's shards, timed ----


class TimedShard1(Shard1):
    def __init__(self) -> None:
        super().__init__()
        self.timed = Timed(self.layers)
        self.layers = nn.Sequential(self.timed)

    async def intervals(self) -> list[Interval]:
        return self.timed.take()


class TimedShard2(Shard2):
    def __init__(self) -> None:
        super().__init__()
        self.timed = Timed(self.layers)
        self.layers = nn.Sequential(self.timed)

    async def intervals(self) -> list[Interval]:
        return self.timed.take()


# ---- raw torch RPC: the tutorial's shape ----


class RawShard:
    def __init__(self, make_layers: Any) -> None:
        self.layers = Timed(make_layers())
        self._lock = threading.Lock()

    def forward(self, x_rref: Any) -> torch.Tensor:
        x = x_rref.to_here()
        with self._lock:
            return self.layers(x)

    def parameter_rrefs(self) -> list[Any]:
        return [rpc.RRef(p) for p in self.layers.parameters()]

    def intervals(self) -> list[Interval]:
        return self.layers.take()


class RawDistResNet:
    def __init__(self, split_size: int, p1_rref: Any, p2_rref: Any) -> None:
        self.split_size, self.p1_rref, self.p2_rref = split_size, p1_rref, p2_rref

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        out_futures = []
        for x in xs.split(self.split_size):
            x_rref = rpc.RRef(x)
            y_rref = self.p1_rref.remote().forward(x_rref)
            out_futures.append(self.p2_rref.rpc_async().forward(y_rref))
        return torch.cat(torch.futures.wait_all(out_futures))

    def parameter_rrefs(self) -> list[Any]:
        return [*self.p1_rref.rpc_sync().parameter_rrefs(), *self.p2_rref.rpc_sync().parameter_rrefs()]


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def raw_run(model: RawDistResNet, optimizer: DistributedOptimizer, timed: Batches) -> float:
    """Train on ``timed`` as the tutorial does, in the calling thread; returns the seconds it took."""
    start = time.perf_counter()
    for inputs, labels in timed:
        with dist_autograd.context() as context_id:
            loss = nn.functional.cross_entropy(model.forward(inputs), labels)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)
    return time.perf_counter() - start


async def ours_run(model: DistResNet, optimizer: DistributedOptimizer, timed: Batches) -> float:
    """Train on ``timed`` as examples/pipeline.py does; returns the seconds it took."""
    start = time.perf_counter()
    for inputs, labels in timed:
        with dist_autograd.context() as context_id:
            loss = nn.functional.cross_entropy(await model.forward(inputs), labels)
            await asyncio.to_thread(dist_autograd.backward, context_id, [loss])
            await asyncio.to_thread(optimizer.step, context_id)
    return time.perf_counter() - start


# ---- measuring ----


def merged(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def overlap(first: list[Interval], second: list[Interval]) -> float:
    """Seconds during which both lists have an interval open."""
    total = 0.0
    for a_start, a_end in merged(first):
        for b_start, b_end in merged(second):
            total += max(0.0, min(a_end, b_end) - max(a_start, b_start))
    return total


def busy(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in merged(intervals))


async def bench(system: actorch.ActorSystem, args: argparse.Namespace) -> dict[int, dict[str, list[float]]]:
    shard1 = await system.spawn(TimedShard1, on=1)
    shard2 = await system.spawn(TimedShard2, on=2)
    raw_p1 = rpc.remote("node1", RawShard, args=(shard1_layers,))
    raw_p2 = rpc.remote("node2", RawShard, args=(shard2_layers,))
    data = batches(args.batches + 1, args.batch_size)

    async def ours_intervals() -> list[list[Interval]]:
        return [await shard1.call(TimedShard1.intervals), await shard2.call(TimedShard2.intervals)]

    def raw_intervals() -> list[list[Interval]]:
        return [raw_p1.rpc_sync().intervals(), raw_p2.rpc_sync().intervals()]

    results: dict[int, dict[str, list[float]]] = {}
    for splits in args.splits:
        split_size = -(-args.batch_size // splits)
        ours = DistResNet(split_size, shard1, shard2)  # type: ignore[arg-type]  # refs to the timed subclasses
        raw = RawDistResNet(split_size, raw_p1, raw_p2)
        ours_optimizer = await asyncio.to_thread(
            DistributedOptimizer, torch.optim.SGD, await ours.parameter_rrefs(), lr=0.05, momentum=0.9
        )
        raw_optimizer = await asyncio.to_thread(
            DistributedOptimizer, torch.optim.SGD, await asyncio.to_thread(raw.parameter_rrefs), lr=0.05, momentum=0.9
        )

        # One untimed batch on each side warms up this split size.
        await ours_run(ours, ours_optimizer, data[:1])
        await asyncio.to_thread(raw_run, raw, raw_optimizer, data[:1])
        await ours_intervals()
        await asyncio.to_thread(raw_intervals)
        series: dict[str, list[float]] = {
            key: [] for key in ("raw_overlap", "ours_overlap", "raw_busy", "ours_busy", "raw_time", "ours_time")
        }
        for _ in range(args.rounds):
            series["raw_time"].append(await asyncio.to_thread(raw_run, raw, raw_optimizer, data[1:]) / args.batches)
            first, second = await asyncio.to_thread(raw_intervals)
            series["raw_overlap"].append(overlap(first, second))
            series["raw_busy"].append(min(busy(first), busy(second)))
            series["ours_time"].append(await ours_run(ours, ours_optimizer, data[1:]) / args.batches)
            first, second = await ours_intervals()
            series["ours_overlap"].append(overlap(first, second))
            series["ours_busy"].append(min(busy(first), busy(second)))
        results[splits] = series
    return results


def report(args: argparse.Namespace, results: dict[int, dict[str, list[float]]]) -> None:
    print(
        f"\n== per run of {args.batches} batches of {args.batch_size}, medians of {args.rounds} rounds ==\n"
        "overlap: seconds during which both stages computed; compute: the less busy stage's computing seconds;\n"
        "share: overlap / compute (per round, then the median); s/batch: one training step, backward included"
    )
    print(
        f"{'splits':>6} {'overlap raw':>11} {'actorch':>8} {'ratio':>6} {'share raw':>9} {'actorch':>8}"
        f" {'compute raw':>11} {'actorch':>8} {'s/batch raw':>11} {'actorch':>8} {'ratio':>6}"
    )
    for splits, series in results.items():
        med = {key: statistics.median(values) for key, values in series.items()}
        shares = {
            side: statistics.median(
                o / b if b else 0.0 for o, b in zip(series[f"{side}_overlap"], series[f"{side}_busy"], strict=True)
            )
            for side in ("raw", "ours")
        }
        ratio = med["ours_overlap"] / med["raw_overlap"] if med["raw_overlap"] > 0 else float("nan")
        print(
            f"{splits:>6} {med['raw_overlap']:>9.3f} s {med['ours_overlap']:>6.3f} s {ratio:>6.2f}"
            f" {shares['raw']:>9.0%} {shares['ours']:>8.0%}"
            f" {med['raw_busy']:>9.3f} s {med['ours_busy']:>6.3f} s"
            f" {med['raw_time']:>9.3f} s {med['ours_time']:>6.3f} s {med['ours_time'] / med['raw_time']:>6.2f}"
        )


def one_thread(rank: int) -> None:
    torch.set_num_threads(1)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8], help="micro-batches per batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=3, help="timed batches per run (the tutorial's 3)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rpc-threads", type=int, default=32, help="the raw side blocks one thread per to_here()")
    parser.add_argument("--quick", action="store_true", help="1 and 4 micro-batches, 1 round of 1 batch")
    args = parser.parse_args()
    if args.quick:
        args.splits, args.rounds, args.batches = [1, 4], 1, 1
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.rpc_threads} RPC threads per process")

    async def main(system: actorch.ActorSystem) -> dict[int, dict[str, list[float]]]:
        return await bench(system, args)

    report(
        args, actorch.run(main, world_size=3, transport=actorch.TorchRpc(threads=args.rpc_threads), setup=one_thread)
    )


if __name__ == "__main__":
    cli()
