"""Replay buffer sampling throughput: one buffer actor, two shards, and raw torch RPC, side by side.

One world of three processes. The raw side is what a torch RPC user writes by
hand: a dict of preallocated tensors held in rank 1's process and ``rpc_sync``
(or ``rpc_async``) of a plain function that samples it with ``randint`` and
``index_select``. The actorch side samples the same transitions from a
``ReplayBuffer`` actor on rank 1, and through a ``ShardedReplayBuffer`` over two
shards on ranks 1 and 2 (half the transitions each); prioritized buffers are
measured too (the raw side has no sum tree to compare them with). Batches of
256; rounds alternate between the sides; medians are printed.

    python benchmarks/bench_replay.py
    python benchmarks/bench_replay.py --rounds 9 --calls 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import torch
import torch.distributed.rpc as rpc

import actorch
from actorch.replay import PrioritizedReplayBuffer, ReplayBuffer, ShardedReplayBuffer

_RAW: dict[str, torch.Tensor] = {}
OBS = 32


def transitions(count: int, seed: int) -> dict[str, torch.Tensor]:
    """Transitions of a small control task: observations, action, reward, next observations, done."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(count, OBS, generator=generator),
        "action": torch.randint(4, (count,), generator=generator),
        "reward": torch.randn(count, generator=generator),
        "next_obs": torch.randn(count, OBS, generator=generator),
        "done": torch.rand(count, generator=generator) < 0.01,
    }


def raw_fill(capacity: int, seed: int) -> int:
    _RAW.clear()
    _RAW.update(transitions(capacity, seed))
    return capacity


def raw_sample(batch_size: int) -> dict[str, torch.Tensor]:
    indices = torch.randint(len(_RAW["action"]), (batch_size,))
    return {key: value.index_select(0, indices) for key, value in _RAW.items()}


async def fill(ref: actorch.ActorRef[Any], capacity: int, seed: int) -> None:
    data = transitions(capacity, seed)
    for start in range(0, capacity, 10_000):
        await ref.call(ReplayBuffer.extend, {key: value[start : start + 10_000].clone() for key, value in data.items()})


async def bench(system: actorch.ActorSystem, rounds: int, calls: int, in_flight: int, capacity: int) -> dict[str, Any]:
    batch = 256
    rpc.rpc_sync("node1", raw_fill, args=(capacity, 0))
    rpc.rpc_sync("node2", raw_fill, args=(capacity // 2, 1))
    single = await system.spawn(ReplayBuffer, args=(capacity,), on=1)
    await fill(single, capacity, 0)
    shards = [await system.spawn(ReplayBuffer, args=(capacity // 2,), on=rank) for rank in (1, 2)]
    for rank, shard in enumerate(shards):
        await fill(shard, capacity // 2, rank)
    sharded = ShardedReplayBuffer(shards, seed=0)
    prioritized = await system.spawn(PrioritizedReplayBuffer, args=(capacity,), on=1)
    await fill(prioritized, capacity, 0)
    prioritized_shards = [
        await system.spawn(PrioritizedReplayBuffer, args=(capacity // 2,), on=rank) for rank in (1, 2)
    ]
    for rank, shard in enumerate(prioritized_shards):
        await fill(shard, capacity // 2, rank)
    prioritized_sharded = ShardedReplayBuffer(prioritized_shards, seed=0)

    def raw_sequential() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            out = rpc.rpc_sync("node1", raw_sample, args=(batch,))
        elapsed = time.perf_counter() - start
        assert out["obs"].shape == (batch, OBS)
        return calls * batch / elapsed

    def raw_concurrent() -> float:
        start = time.perf_counter()
        done = 0
        while done < calls:
            futures = [rpc.rpc_async("node1", raw_sample, args=(batch,)) for _ in range(in_flight)]
            torch.futures.wait_all(futures)
            done += in_flight
        return done * batch / (time.perf_counter() - start)

    def raw_sharded_draw() -> list[Any]:
        # Two raw shards: node1 keeps its first half (the bigger dict serves both sides), node2 its own.
        return [rpc.rpc_async(worker, raw_sample, args=(batch // 2,)) for worker in ("node1", "node2")]

    def raw_sharded_merge(futures: list[Any]) -> dict[str, torch.Tensor]:
        parts = [future.wait() for future in futures]
        return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}

    def raw_sharded_sequential() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            out = raw_sharded_merge(raw_sharded_draw())
        elapsed = time.perf_counter() - start
        assert out["obs"].shape == (batch, OBS)
        return calls * batch / elapsed

    def raw_sharded_concurrent() -> float:
        start = time.perf_counter()
        done = 0
        while done < calls:
            pending = [raw_sharded_draw() for _ in range(in_flight)]
            for futures in pending:
                raw_sharded_merge(futures)
            done += in_flight
        return done * batch / (time.perf_counter() - start)

    def sequential(draw: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[float]]:
        async def measure() -> float:
            start = time.perf_counter()
            for _ in range(calls):
                out = await draw()
            elapsed = time.perf_counter() - start
            assert out.data["obs"].shape == (batch, OBS)
            return calls * batch / elapsed

        return measure

    def concurrent(draw: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[float]]:
        async def measure() -> float:
            start = time.perf_counter()
            done = 0
            while done < calls:
                await asyncio.gather(*(draw() for _ in range(in_flight)))
                done += in_flight
            return done * batch / (time.perf_counter() - start)

        return measure

    actorch_sides: dict[str, Callable[[], Awaitable[float]]] = {}
    draws: dict[str, Callable[[], Awaitable[Any]]] = {
        "one actor": lambda: single.call(ReplayBuffer.sample, batch),
        "2 shards": lambda: sharded.sample(batch),
        "one actor, prioritized": lambda: prioritized.call(PrioritizedReplayBuffer.sample, batch),
        "2 shards, prioritized": lambda: prioritized_sharded.sample(batch),
    }
    for label, draw in draws.items():
        actorch_sides[f"{label}, sequential"] = sequential(draw)
        actorch_sides[f"{label}, {in_flight} in flight"] = concurrent(draw)
    raw_sides = {
        "raw rpc, sequential": raw_sequential,
        f"raw rpc, {in_flight} in flight": raw_concurrent,
        "raw rpc 2 shards, sequential": raw_sharded_sequential,
        f"raw rpc 2 shards, {in_flight} in flight": raw_sharded_concurrent,
    }

    for measure in [*raw_sides.values(), *actorch_sides.values()]:  # warm up every path
        result = measure()
        if asyncio.iscoroutine(result):
            await result
    series: dict[str, list[float]] = {key: [] for key in [*raw_sides, *actorch_sides]}
    for _ in range(rounds):
        for key, raw in raw_sides.items():
            series[key].append(raw())
        for key, measure in actorch_sides.items():
            series[key].append(await measure())
    return {key: statistics.median(values) for key, values in series.items()}


def report(results: dict[str, float], in_flight: int) -> None:
    print(f"\n{'sampling, batch 256 (medians of rounds)':42} {'samples/s':>10} {'batches/s':>10} {'vs raw':>7}")
    for key, rate in results.items():
        mode = "sequential" if key.endswith("sequential") else f"{in_flight} in flight"
        raw = results[f"raw rpc 2 shards, {mode}" if "2 shards" in key else f"raw rpc, {mode}"]
        print(f"{key:42} {rate:10,.0f} {rate / 256:10,.0f} {rate / raw:7.2f}")
    print("(vs raw: the one-process rows against raw rpc, the 2-shard rows against raw rpc 2 shards)")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200, help="batches sampled per measurement")
    parser.add_argument("--in-flight", type=int, default=8, help="concurrent sample calls in the concurrent mode")
    parser.add_argument("--capacity", type=int, default=100_000, help="transitions held (split over the shards)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.rounds} rounds of {args.calls} batches")

    async def main(system: actorch.ActorSystem) -> dict[str, Any]:
        return await bench(system, args.rounds, args.calls, args.in_flight, args.capacity)

    results = actorch.run(main, world_size=3)
    report(results, args.in_flight)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    cli()
