"""Where a message's time goes: every event-loop callback of both processes, timed and sorted by kind.

Rank 0 sends bursts of no-op calls (2,000 in flight) to an actor on rank 1 for a
few seconds, as ``bench_rpc.py`` (b) does. On both ranks every callback the event
loop runs is timed and put in one of a few kinds (making calls, receiving a
bundle, handling messages, sending bundles...); the table gives each kind's
time per message, and what the process's other threads (torch RPC's) used. The
timing itself costs about a microsecond per callback.

    python benchmarks/profile_messages.py --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from collections import defaultdict
from typing import Any

import actorch

_times: defaultdict[str, float] = defaultdict(float)
_loop_thread: list[int] = []


class Echo(actorch.Actor):
    async def noop(self) -> None:
        return None

    async def profile(self) -> dict[str, Any]:
        return _snapshot()


def _kind(handle: asyncio.Handle) -> str:
    callback = handle._callback  # type: ignore[attr-defined]
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        name = owner.get_coro().__qualname__  # type: ignore[union-attr]
        if name == "Cell.work":
            return "handle messages (mailbox worker)"
        if name.endswith("burst"):
            return "make calls (the caller's task)"
        return f"other task steps ({name})"
    name = getattr(callback, "__qualname__", repr(callback))
    return {
        "Inbox._drain": "receive bundles (decode, route, settle)",
        "Transport._flush": "send bundles (torch rpc_async)",
        "gather.<locals>._done_callback": "asyncio.gather bookkeeping",
        "Port.close": "reply on a bundle's response",
        "FlowControl._flush_credits": "credits",
    }.get(name, f"other callbacks ({name})")


def _install(rank: int) -> None:
    """Time every callback of this node's loop (``run``'s ``setup`` runs on the loop's thread)."""
    _loop_thread.append(threading.get_native_id())
    original = asyncio.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        start = time.perf_counter()
        try:
            original(handle)
        finally:
            _times[_kind(handle)] += time.perf_counter() - start

    asyncio.Handle._run = timed  # type: ignore[method-assign]


def _cpu(path: str) -> float:
    with open(path) as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _snapshot() -> dict[str, Any]:
    return {
        "callbacks": dict(_times),
        "process_cpu": _cpu(f"/proc/{os.getpid()}/stat"),
        "loop_cpu": _cpu(f"/proc/{os.getpid()}/task/{_loop_thread[0]}/stat"),
    }


def _difference(after: dict[str, Any], before: dict[str, Any], messages: int) -> dict[str, float]:
    per = {
        kind: (seconds - before["callbacks"].get(kind, 0.0)) / messages * 1e6
        for kind, seconds in after["callbacks"].items()
    }
    loop_cpu = after["loop_cpu"] - before["loop_cpu"]
    per["torch RPC threads (CPU)"] = ((after["process_cpu"] - before["process_cpu"]) - loop_cpu) / messages * 1e6
    per["event-loop thread (CPU)"] = loop_cpu / messages * 1e6
    return per


async def main(system: actorch.ActorSystem, seconds: float, in_flight: int) -> None:
    ref = await system.spawn(Echo, on=1)
    for _ in range(500):
        await ref.call(Echo.noop)
    before = [_snapshot(), await ref.call(Echo.profile)]
    messages = 0
    start = time.perf_counter()

    async def burst() -> None:
        await asyncio.gather(*(ref.call(Echo.noop) for _ in range(in_flight)))

    while time.perf_counter() - start < seconds:
        await asyncio.create_task(burst())
        messages += in_flight
    elapsed = time.perf_counter() - start
    after = [_snapshot(), await ref.call(Echo.profile)]
    print(f"{messages:,} calls in {elapsed:.1f} s: {messages / elapsed:,.0f} calls/s, {in_flight:,} in flight")
    print(f"\n{'microseconds per call':44} {'rank 0 (caller)':>16} {'rank 1 (callee)':>16}")
    columns = [_difference(a, b, messages) for a, b in zip(after, before, strict=True)]
    found = {kind for column in columns for kind in column}
    kinds = sorted(found, key=lambda kind: -sum(column.get(kind, 0.0) for column in columns))
    for kind in kinds:
        if kind.endswith("(CPU)"):
            continue
        cells = [column.get(kind, 0.0) for column in columns]
        if max(cells) >= 0.05:
            print(f"{kind:44} {cells[0]:16.2f} {cells[1]:16.2f}")
    for kind in ("event-loop thread (CPU)", "torch RPC threads (CPU)"):
        print(f"{kind:44} {columns[0][kind]:16.2f} {columns[1][kind]:16.2f}")
    print(f"{'wall time per call':44} {elapsed / messages * 1e6:16.2f}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--in-flight", type=int, default=2000)
    args = parser.parse_args()

    async def run(system: actorch.ActorSystem) -> None:
        await main(system, args.seconds, args.in_flight)

    actorch.run(run, world_size=2, setup=_install)


if __name__ == "__main__":
    cli()
