"""The parameter server against raw torch RPC: pull and push of a 10M-parameter model.

One world of three processes. The raw side is what a torch RPC user writes by
hand: a server object in rank 1's process, ``rpc_sync`` of a function that
returns its state dict (pull), or applies gradients with SGD and returns the new
state dict (push). The actorch side is ``ParameterServer`` on rank 1 with the same
model and optimizer, called from rank 0, and a ``ParameterClient`` over two
shards on ranks 1 and 2. Rounds alternate between the sides; medians are printed.

    python benchmarks/bench_parameter_server.py
    python benchmarks/bench_parameter_server.py --rounds 9 --ops 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import torch
import torch.distributed.rpc as rpc
from torch import nn

import actorch

_RAW: dict[str, Any] = {}


def make_model() -> nn.Module:
    """About 10M parameters (40 MB of float32)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1000, 5000), nn.Linear(5000, 1000))


def raw_setup() -> int:
    model = make_model()
    _RAW["params"] = dict(model.named_parameters())
    _RAW["optimizer"] = torch.optim.SGD(model.parameters(), lr=1e-6)
    return sum(p.numel() for p in model.parameters())


def raw_pull() -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in _RAW["params"].items()}


def raw_push(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for name, p in _RAW["params"].items():
        p.grad = grads[name]
    _RAW["optimizer"].step()
    return raw_pull()


async def bench(system: actorch.ActorSystem, rounds: int, ops: int) -> dict[str, Any]:
    worker = "node1"
    numel = rpc.rpc_sync(worker, raw_setup)
    options = {"optimizer_kwargs": {"lr": 1e-6}}
    server = await system.spawn(actorch.ParameterServer, args=(make_model,), kwargs=options, on=1)
    shards = [
        await system.spawn(actorch.ParameterServer, args=(make_model,), kwargs={**options, "shard": (i, 2)}, on=1 + i)
        for i in range(2)
    ]
    grads = {name: torch.full_like(p, 1e-3) for name, p in make_model().named_parameters()}
    nbytes = 4 * numel

    def timed_sync(op: Callable[[], Any]) -> float:
        start = time.perf_counter()
        for _ in range(ops):
            op()
        return ops / (time.perf_counter() - start)

    async def timed(op: Callable[[], Awaitable[Any]]) -> float:
        start = time.perf_counter()
        for _ in range(ops):
            await op()
        return ops / (time.perf_counter() - start)

    version = 0

    async def gated_pull() -> None:
        assert await server.call(actorch.ParameterServer.pull, since=version) is None

    measures: dict[str, Callable[[], Any]] = {
        "raw pull": lambda: timed_sync(lambda: rpc.rpc_sync(worker, raw_pull)),
        "actorch pull": lambda: timed(lambda: server.call(actorch.ParameterServer.pull)),
        "actorch pull, 2 shards": lambda: timed(lambda: actorch.params.ParameterClient(shards).pull()),
        "actorch pull, unchanged": lambda: timed(gated_pull),
        "raw push": lambda: timed_sync(lambda: rpc.rpc_sync(worker, raw_push, args=(grads,))),
        "actorch push": lambda: timed(lambda: server.call(actorch.ParameterServer.push, grads)),
        "actorch push, 2 shards": lambda: timed(lambda: actorch.params.ParameterClient(shards).push(grads)),
    }
    for measure in measures.values():  # warm up every path once
        result = measure()
        if isinstance(result, Awaitable):
            await result
    version = await server.call(actorch.ParameterServer.version)
    series: dict[str, list[float]] = {key: [] for key in measures}
    for _ in range(rounds):
        for key, measure in measures.items():
            if key == "actorch pull, unchanged":
                version = await server.call(actorch.ParameterServer.version)
            result = measure()
            series[key].append(await result if isinstance(result, Awaitable) else result)
    return {"numel": numel, "nbytes": nbytes, **{key: statistics.median(v) for key, v in series.items()}}


def report(res: dict[str, Any]) -> None:
    gb = res["nbytes"] / 1e9
    print(f"\nmodel: {res['numel'] / 1e6:.1f}M parameters ({res['nbytes'] / 1e6:.0f} MB); medians of rounds")
    print(f"{'operation':26} {'ops/s':>8} {'GB/s':>7} {'vs raw':>7}")
    for key, rate in res.items():
        if key in ("numel", "nbytes"):
            continue
        kind = "pull" if "pull" in key else "push"
        ratio = rate / res[f"raw {kind}"]
        moved = 0.0 if key.endswith("unchanged") else rate * gb * (1 if kind == "pull" else 2)
        print(f"{key:26} {rate:8.1f} {moved:7.2f} {ratio:7.2f}")
    print("(a push sends the gradients and brings the new parameters back: twice the bytes of a pull)")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=4, help="operations per round and measure")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.rounds} rounds of {args.ops}")

    async def main(system: actorch.ActorSystem) -> dict[str, Any]:
        return await bench(system, args.rounds, args.ops)

    report(actorch.run(main, world_size=3))


if __name__ == "__main__":
    cli()
