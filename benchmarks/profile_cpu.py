"""CPU each side spends on one sequential call: raw torch RPC, the asyncio floor, and actorch.

Rank 0 makes no-op calls to rank 1 one after another, three ways in turn, as
``bench_rpc.py`` (a) does: a raw ``rpc_sync``; the floor (torch RPC bridged into
asyncio at both ends and nothing else, ``bench_rpc.bridged_noop``); and
``await ref.call``. For each it reads the CPU time of both event-loop threads
and of both whole processes, per call. On a machine with few cores a
sequential round trip keeps them busy, so CPU spent anywhere is latency.

    python benchmarks/profile_cpu.py --rounds 5               # actorch on its fast lane
    python benchmarks/profile_cpu.py --rounds 5 --lane off    # actorch on torch RPC alone
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Awaitable, Callable

import torch.distributed.rpc as rpc
from bench_rpc import Echo, bridged_call, noop

import actorch

COLUMNS = ("wall", "caller loop", "caller process", "callee loop", "callee process")


def _process_cpu() -> float:
    times = os.times()
    return times.user + times.system


class Clock(actorch.Actor):
    async def cpu(self) -> tuple[float, float]:
        """This node's loop-thread and process CPU seconds."""
        return time.thread_time(), _process_cpu()


async def measure(system: actorch.ActorSystem, rounds: int, calls: int) -> dict[str, list[float]]:
    echo = await system.spawn(Echo, on=1)
    clock = await system.spawn(Clock, on=1)
    await echo.call(Echo.lend_loop)

    async def raw() -> None:
        rpc.rpc_sync("node1", noop)

    worker = rpc.get_worker_info("node1")

    async def floor() -> None:
        await bridged_call(worker)

    async def actorch_call() -> None:
        await echo.call(Echo.noop)

    ways: dict[str, Callable[[], Awaitable[None]]] = {"raw": raw, "floor": floor, "actorch": actorch_call}
    for call in ways.values():  # warm up
        for _ in range(200):
            await call()
    series: dict[str, list[list[float]]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, call in ways.items():
            callee_before = await clock.call(Clock.cpu)
            loop_before, process_before, start = time.thread_time(), _process_cpu(), time.perf_counter()
            for _ in range(calls):
                await call()
            wall = time.perf_counter() - start
            loop_after, process_after = time.thread_time(), _process_cpu()
            callee_after = await clock.call(Clock.cpu)
            spent = (
                wall,
                loop_after - loop_before,
                process_after - process_before,
                callee_after[0] - callee_before[0],
                callee_after[1] - callee_before[1],
            )
            series[name].append([seconds / calls * 1e6 for seconds in spent])
    return {name: [statistics.median(column) for column in zip(*rows, strict=True)] for name, rows in series.items()}


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="sequential calls per round and way")
    parser.add_argument("--transport", choices=["uv", "shm"], default="uv")
    parser.add_argument("--lane", choices=["on", "off"], default="on", help="actorch's fast lane")
    args = parser.parse_args()

    async def main(system: actorch.ActorSystem) -> dict[str, list[float]]:
        return await measure(system, args.rounds, args.calls)

    results = actorch.run(
        main, world_size=2, transport=actorch.TorchRpc(tensorpipe=args.transport, lane=args.lane == "on")
    )
    print(f"medians of {args.rounds} rounds of {args.calls} sequential no-op calls, microseconds per call")
    print(f"actorch's fast lane: {args.lane}")
    print(f"{'':8}" + "".join(f"{column:>16}" for column in COLUMNS))
    for name, row in results.items():
        print(f"{name:8}" + "".join(f"{value:16.1f}" for value in row))


if __name__ == "__main__":
    cli()
