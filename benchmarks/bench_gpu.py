"""CUDA tensors: each of actorch's GPU paths beside raw torch RPC given the same work, and the device's own limit.

Two processes on one machine share ``cuda:0``. Each size is a round trip (there
and back: the echo returns what it got), raw ``rpc_sync`` and actorch rounds
alternating, medians of rounds, in GB/s counting both directions' bytes:

- the limit: one device-to-device copy of the same bytes in one process
  (the bytes of one copy over its time);
- CUDA IPC (actorch's default on one host) beside raw torch RPC with the map
  ``cuda:0 -> cuda:0``, and the 1 MB round trip's latency in microseconds;
- the device map alone (``channels=["device_map"]``) beside raw torch RPC
  with the same map;
- staged through host memory (no map, ``channels=["shm", "staged"]``: a pinned segment of the host) beside raw
  torch RPC with the same moves written by hand (``.cpu()`` there, ``.cuda()``
  back);
- weight sync: a learner on ``cuda:0`` sends ``--weights-mb`` of bf16 to one
  actor, then broadcasts it to ``--actors`` actors, each in its own process on
  the same GPU: the time to all of them against one transfer (a broadcast
  copies once per GPU, the actors share the copy).

It needs CUDA, and says so and exits where there is none.

    python benchmarks/bench_gpu.py                     # 1 MB, 64 MB and 1 GB
    python benchmarks/bench_gpu.py --sizes-mb 1 64 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import torch
import torch.distributed.rpc as rpc

import actorch


def echo(value: torch.Tensor) -> torch.Tensor:
    return value


def staged_echo(value: torch.Tensor) -> torch.Tensor:
    """What a raw torch RPC user writes without a map: to the GPU on arrival, back to the host to answer."""
    return value.to("cuda:0").cpu()


class Echo(actorch.Actor):
    async def echo(self, value: torch.Tensor) -> torch.Tensor:
        return value


class Holder(actorch.Actor):
    """An actor that takes weights and says they landed (its stream waited for them)."""

    async def take(self, weights: torch.Tensor) -> int:
        torch.cuda.current_stream(weights.device).synchronize()
        return weights.numel()


async def timed(once: Callable[[], Awaitable[Any]]) -> float:
    """Seconds ``once`` takes, the device idle before and after."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    await once()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def copy_limit(nbytes: int, rounds: int) -> float:
    """GB/s of one device-to-device copy of ``nbytes`` on ``cuda:0``, in this process (median of ``rounds``)."""
    source = torch.randn(nbytes // 4, device="cuda:0")
    target = torch.empty_like(source)
    target.copy_(source)
    rates = []
    for _ in range(max(rounds, 5)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        target.copy_(source)
        torch.cuda.synchronize()
        rates.append(nbytes / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


async def side_by_side(
    ref: actorch.ActorRef[Echo], rounds: int, sizes_mb: list[int], *, staged: bool = False
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for mb in sizes_mb:
        tensor = torch.randn(mb * (1 << 20) // 4, device="cuda:0")

        async def raw(tensor: torch.Tensor = tensor) -> None:
            if staged:
                out = rpc.rpc_sync("node1", staged_echo, args=(tensor.cpu(),)).to("cuda:0")
            else:
                out = rpc.rpc_sync("node1", echo, args=(tensor,))
            assert out.shape == tensor.shape

        async def ours(tensor: torch.Tensor = tensor) -> None:
            out = await ref.call(Echo.echo, tensor)
            assert out.shape == tensor.shape

        for warm in (raw, ours, raw, ours):
            await warm()
        raw_seconds, our_seconds = [], []
        for _ in range(rounds):  # alternate, so both see the same moment of a noisy machine
            raw_seconds.append(await timed(raw))
            our_seconds.append(await timed(ours))
        raw_s, our_s = statistics.median(raw_seconds), statistics.median(our_seconds)
        rows[f"{mb} MB"] = {
            "raw": 2 * tensor.nbytes / raw_s / 1e9,
            "actorch": 2 * tensor.nbytes / our_s / 1e9,
            "raw_us": raw_s * 1e6,
            "actorch_us": our_s * 1e6,
            "limit": copy_limit(tensor.nbytes, rounds),
        }
    return rows


async def ipc(system: actorch.ActorSystem, rounds: int, sizes_mb: list[int]) -> dict[str, Any]:
    rows = await side_by_side(await system.spawn(Echo, on=1), rounds, sizes_mb)
    rows["channels"] = {name: count["tensors"] for name, count in system.statistics()["channels"].items()}
    return rows


async def mapped(system: actorch.ActorSystem, rounds: int, sizes_mb: list[int]) -> dict[str, Any]:
    return await side_by_side(await system.spawn(Echo, on=1), rounds, sizes_mb)


async def staged(system: actorch.ActorSystem, rounds: int, sizes_mb: list[int]) -> dict[str, Any]:
    return await side_by_side(await system.spawn(Echo, on=1, device="cuda:0"), rounds, sizes_mb, staged=True)


async def weight_sync(system: actorch.ActorSystem, rounds: int, weights_mb: int, actors: int) -> dict[str, Any]:
    holders = [await system.spawn(Holder, on=rank, device="cuda:0") for rank in range(1, actors + 1)]
    weights = torch.randn(weights_mb * (1 << 20) // 2, device="cuda:0").to(torch.bfloat16)

    async def to_one() -> None:
        await holders[0].call(Holder.take, weights)

    async def to_all() -> None:
        await asyncio.gather(*actorch.broadcast(holders, Holder.take, weights))

    for warm in (to_one, to_all, to_one, to_all):
        await warm()
    one, every = [], []
    for _ in range(rounds):
        one.append(await timed(to_one))
        every.append(await timed(to_all))
    return {
        "one_s": statistics.median(one),
        "all_s": statistics.median(every),
        "bytes": weights.nbytes,
        "actors": actors,
        "limit_gbps": copy_limit(weights.nbytes, rounds),
    }


def report(title: str, rows: dict[str, Any]) -> None:
    print(f"\n{title}")
    columns = ("size", 8), ("limit GB/s", 11), ("raw GB/s", 10), ("actorch GB/s", 13), ("ratio", 7)
    print(" ".join(f"{name:>{width}}" for name, width in (*columns, ("of limit", 9), ("us", 9))))
    for size, row in rows.items():
        if size == "channels":
            continue
        ratio, of_limit = row["actorch"] / row["raw"], row["actorch"] / row["limit"]
        print(
            f"{size:>8} {row['limit']:>11.1f} {row['raw']:>10.2f} {row['actorch']:>13.2f} {ratio:>7.2f}"
            f" {of_limit:>8.0%} {row['actorch_us']:>9.0f}"
        )
    if "channels" in rows:
        print(f"channels that carried them: {rows['channels']}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--weights-mb", type=int, default=1024, help="weights a learner syncs (bf16)")
    parser.add_argument("--actors", type=int, default=4, help="actors, each in its own process, that take them")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu.py needs a CUDA GPU: torch.cuda.is_available() is False here", file=sys.stderr)
        sys.exit(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {args.rounds} rounds")
    limit = 2 * max(args.sizes_mb) << 20  # a staged gigabyte is host bytes: let it through

    async def run_ipc(system: actorch.ActorSystem) -> dict[str, Any]:
        return await ipc(system, args.rounds, args.sizes_mb)

    async def run_mapped(system: actorch.ActorSystem) -> dict[str, Any]:
        return await mapped(system, args.rounds, args.sizes_mb)

    async def run_staged(system: actorch.ActorSystem) -> dict[str, Any]:
        return await staged(system, args.rounds, args.sizes_mb)

    async def run_weights(system: actorch.ActorSystem) -> dict[str, Any]:
        return await weight_sync(system, args.rounds, args.weights_mb, args.actors)

    results = {
        "ipc": actorch.run(run_ipc, world_size=2, transport=actorch.TorchRpc(device_maps="auto")),
        "mapped": actorch.run(
            run_mapped, world_size=2, transport=actorch.TorchRpc(device_maps="auto"), channels=["device_map"]
        ),
        "staged": actorch.run(
            run_staged,
            world_size=2,
            transport=actorch.TorchRpc(device_maps=None),
            channels=["shm", "staged"],
            max_message_size=limit,
        ),
        "weights": actorch.run(run_weights, world_size=args.actors + 1, transport=actorch.TorchRpc(device_maps="auto")),
    }
    report("CUDA IPC, one host (raw: torch RPC with the device map cuda:0 -> cuda:0)", results["ipc"])
    report("device map cuda:0 -> cuda:0 (round trip, CUDA channels)", results["mapped"])
    report("no map: staged through host memory (raw: .cpu() and .cuda() by hand)", results["staged"])
    weights = results["weights"]
    print(
        f"\nweight sync, {weights['bytes'] / 2**30:.2f} GiB of bf16 on one GPU: "
        f"one actor {weights['one_s'] * 1e3:.1f} ms, "
        f"all {weights['actors']} (broadcast) {weights['all_s'] * 1e3:.1f} ms, "
        f"{weights['all_s'] / weights['one_s']:.2f}x one transfer (target <= 2); "
        f"one copy on the device takes {weights['bytes'] / weights['limit_gbps'] / 1e6:.2f} ms"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    cli()
