"""CUDA tensors: actorch against raw torch RPC with the same device map, side by side, and the staged path.

Two processes on one machine share ``cuda:0``. With ``device_maps="auto"`` both
sides send CUDA tensors on TensorPipe's CUDA channels; each size is a round trip
(there and back, the echo returns what it got), raw ``rpc_sync`` and actorch
rounds alternating, medians of rounds. Then, in a second world without a map,
actorch stages through pinned host memory to an actor on ``cuda:0``, beside raw
torch RPC with the same moves written by hand (``.cpu()`` there, ``.cuda()``
back). It needs CUDA, and says so and exits where there is none.

    python benchmarks/bench_gpu.py                     # 1 MB, 64 MB and 1 GB
    python benchmarks/bench_gpu.py --sizes-mb 1 64 --rounds 5
"""

from __future__ import annotations

import argparse
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


async def median_gbps(rounds: int, nbytes: int, once: Callable[[], Awaitable[Any]]) -> float:
    """Median round-trip bandwidth (both directions' bytes over the time) of ``rounds`` runs of ``once``."""
    rates = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        await once()
        torch.cuda.synchronize()
        rates.append(2 * nbytes / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


async def mapped(system: actorch.ActorSystem, rounds: int, sizes_mb: list[int]) -> dict[str, Any]:
    ref = await system.spawn(Echo, on=1)
    rows: dict[str, Any] = {}
    for mb in sizes_mb:
        tensor = torch.randn(mb * (1 << 20) // 4, device="cuda:0")

        async def raw(tensor: torch.Tensor = tensor) -> None:
            out = rpc.rpc_sync("node1", echo, args=(tensor,))
            assert out.device == tensor.device

        async def ours(tensor: torch.Tensor = tensor) -> None:
            out = await ref.call(Echo.echo, tensor)
            assert out.device == tensor.device

        for warm in (raw, ours):
            await warm()
        raw_rates, our_rates = [], []
        for _ in range(rounds):  # alternate, so both see the same moment of a noisy machine
            raw_rates.append(await median_gbps(1, tensor.nbytes, raw))
            our_rates.append(await median_gbps(1, tensor.nbytes, ours))
        rows[f"{mb} MB"] = {"raw": statistics.median(raw_rates), "actorch": statistics.median(our_rates)}
    return rows


async def staged(system: actorch.ActorSystem, rounds: int, sizes_mb: list[int]) -> dict[str, Any]:
    ref = await system.spawn(Echo, on=1, device="cuda:0")
    rows: dict[str, Any] = {}
    for mb in sizes_mb:
        tensor = torch.randn(mb * (1 << 20) // 4, device="cuda:0")

        async def raw(tensor: torch.Tensor = tensor) -> None:
            out = rpc.rpc_sync("node1", staged_echo, args=(tensor.cpu(),)).to("cuda:0")
            assert out.device == tensor.device

        async def ours(tensor: torch.Tensor = tensor) -> None:
            out = await ref.call(Echo.echo, tensor)
            assert out.device.type == "cpu"  # main is no actor: staged results land on the host

        for warm in (raw, ours):
            await warm()
        raw_rates, our_rates = [], []
        for _ in range(rounds):
            raw_rates.append(await median_gbps(1, tensor.nbytes, raw))
            our_rates.append(await median_gbps(1, tensor.nbytes, ours))
        rows[f"{mb} MB"] = {"raw": statistics.median(raw_rates), "actorch": statistics.median(our_rates)}
    return rows


def report(title: str, rows: dict[str, Any]) -> None:
    print(f"\n{title}")
    print(f"{'size':>8} {'raw GB/s':>10} {'actorch GB/s':>13} {'ratio':>7}")
    for size, row in rows.items():
        print(f"{size:>8} {row['raw']:>10.2f} {row['actorch']:>13.2f} {row['actorch'] / row['raw']:>7.2f}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu.py needs a CUDA GPU: torch.cuda.is_available() is False here", file=sys.stderr)
        sys.exit(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {args.rounds} rounds")
    limit = 2 * max(args.sizes_mb) << 20

    async def run_mapped(system: actorch.ActorSystem) -> dict[str, Any]:
        return await mapped(system, args.rounds, args.sizes_mb)

    async def run_staged(system: actorch.ActorSystem) -> dict[str, Any]:
        return await staged(system, args.rounds, args.sizes_mb)

    results = {
        "mapped": actorch.run(run_mapped, world_size=2, device_maps="auto", max_message_size=limit),
        "staged": actorch.run(run_staged, world_size=2, device_maps=None, max_message_size=limit),
    }
    report("device map cuda:0 -> cuda:0 (round trip, CUDA channels)", results["mapped"])
    report("no map: staged through host memory (raw: .cpu() and .cuda() by hand)", results["staged"])
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    cli()
