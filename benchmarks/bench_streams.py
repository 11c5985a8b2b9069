"""Streams against calls, and broadcast against a loop of calls and raw torch RPC, side by side in one world.

Streams: an actor on rank 1 hands rank 0 ``--items`` items (a small dict, or
a fresh 1 MB tensor) by a stream, by sequential calls (one call per item) and by
calls with 8 in flight; items/s are medians of ``--rounds``, the three
alternating.

Broadcast: a world of 4 nodes: rank 0 sends, the actors are spread round-robin over ranks
1 to 3 (the sender's node hosts none, so every copy crosses processes). One
round sends one ``--mb`` tensor to every actor and waits for every reply:

- ``broadcast``: ``ActorGroup.call`` with the same tensor for every member,
  which sends it once per node;
- ``loop, all``: one ``ref.call`` per actor, all in flight at once
  (gathered), which sends it once per actor; but the calls to one node leave
  in one bundle, whose pickling by torch RPC may hold a tensor met several
  times only once, so this is the loop at its cheapest;
- ``loop, 8``: the same calls, at most 8 in flight, so bundles hold one or
  a few calls: what a loop of calls costs where it cannot share bundles;
- ``raw torch RPC``: one ``rpc_async`` per actor to the actor's rank, all in
  flight at once (``wait_all``), which also sends it once per actor.

Each measurement alternates the four and reports the median of ``--rounds``,
with the tensor bytes rank 0's transport sent per round.

    python benchmarks/bench_streams.py                          # both; 40 MB to 8, 32 and 64 actors
    python benchmarks/bench_streams.py --only streams --rounds 7
    python benchmarks/bench_streams.py --only broadcast --mb 4 --actors 8 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import torch
import torch.distributed.rpc as rpc

import actorch
from actorch.group import ActorGroup

WORLD_SIZE = 4
IN_FLIGHT = 8


def take(tensor: torch.Tensor) -> int:
    """What the raw torch RPC side runs at each send: the same work as the actor's endpoint."""
    return tensor.numel()


class Sink(actorch.Actor):
    async def take(self, tensor: torch.Tensor) -> int:
        return tensor.numel()


async def timed(send: Callable[[], Awaitable[list[int]]], expected: int) -> float:
    start = time.perf_counter()
    counts = await send()
    elapsed = time.perf_counter() - start
    assert all(count == expected for count in counts), counts
    return elapsed


async def broadcast_rows(system: actorch.ActorSystem, options: argparse.Namespace) -> list[dict[str, Any]]:
    """Per actor count: seconds per round of broadcast, loop of calls and raw torch RPC, and tensor bytes sent."""
    tensor = torch.randn(options.mb * (1 << 20) // 4)
    transport = system.host.node.transport  # its counters show the copies that left rank 0
    rows: list[dict[str, Any]] = []
    for count in options.actors:
        refs = [await system.spawn(Sink, on=1 + index % (WORLD_SIZE - 1)) for index in range(count)]
        group = ActorGroup(refs)

        async def by_broadcast(group: ActorGroup[Sink] = group) -> list[int]:
            return await group.call(Sink.take, tensor)

        async def by_loop(refs: list[actorch.ActorRef[Sink]] = refs) -> list[int]:
            return await asyncio.gather(*(ref.call(Sink.take, tensor) for ref in refs))

        async def by_eight(refs: list[actorch.ActorRef[Sink]] = refs) -> list[int]:
            room = asyncio.Semaphore(IN_FLIGHT)

            async def one(ref: actorch.ActorRef[Sink]) -> int:
                async with room:
                    return await ref.call(Sink.take, tensor)

            return await asyncio.gather(*(one(ref) for ref in refs))

        async def by_raw(refs: list[actorch.ActorRef[Sink]] = refs) -> list[int]:
            futures = [rpc.rpc_async(f"node{ref.rank}", take, args=(tensor,)) for ref in refs]
            return await asyncio.to_thread(torch.futures.wait_all, futures)  # the loop stays free for actorch

        sides = {"broadcast": by_broadcast, "loop": by_loop, "eight": by_eight, "raw": by_raw}
        series: dict[str, list[float]] = {side: [] for side in sides}
        sent: dict[str, int] = {}
        await by_broadcast()  # warm up
        for _ in range(options.rounds):
            for side, send in sides.items():
                before = sum(transport.tensor_bytes_sent.values())
                series[side].append(await timed(send, tensor.numel()))
                sent[side] = sum(transport.tensor_bytes_sent.values()) - before
        rows.append(
            {
                "actors": count,
                "mb": options.mb,
                **{f"{side}_s": statistics.median(values) for side, values in series.items()},
                "broadcast_bytes": sent["broadcast"],
                "loop_bytes": sent["loop"],
            }
        )
        await asyncio.gather(*(ref.stop() for ref in refs))
    return rows


def report_broadcast(rows: list[dict[str, Any]]) -> None:
    print(f"\n== broadcast: one tensor to every actor over ranks 1-{WORLD_SIZE - 1} (medians of rounds) ==")
    print("time per round; ratios: that side's time over broadcast's; sent: tensor bytes rank 0 put in bundles")
    print(
        f"{'actors':>6} {'MB':>4} {'broadcast':>10} {'loop, all':>10} {'loop, 8':>10} {'raw RPC':>10} "
        f"{'all/b':>6} {'8/b':>6} {'raw/b':>6} {'sent: b':>9} {'sent: loop':>10}"
    )
    for row in rows:
        b = row["broadcast_s"]
        times = " ".join(f"{row[key] * 1e3:>7.1f} ms" for key in ("broadcast_s", "loop_s", "eight_s", "raw_s"))
        ratios = " ".join(f"{row[key] / b:>6.2f}" for key in ("loop_s", "eight_s", "raw_s"))
        print(
            f"{row['actors']:>6} {row['mb']:>4} {times} {ratios} "
            f"{row['broadcast_bytes'] / 1e6:>6.0f} MB {row['loop_bytes'] / 1e6:>7.0f} MB"
        )


class Source(actorch.Actor):
    """Hands out items, by a stream or by calls: a small dict, or a fresh 1 MB tensor each time.

    Fresh, as a producer's new data would be: the same tensor object in
    several replies of one bundle would be pickled, and sent, once.
    """

    def __init__(self) -> None:
        self.big = torch.randn(1 << 18)  # 1 MB

    def _make(self, big: bool) -> Any:
        return self.big.clone() if big else {"step": 1, "reward": 0.5, "done": False}

    async def items(self, n: int, big: bool) -> AsyncIterator[Any]:
        for _ in range(n):
            yield self._make(big)

    async def item(self, big: bool) -> Any:
        return self._make(big)


STREAM_CASES = [("small", False, actorch.DEFAULT_STREAM_WINDOW), ("small", False, 64), ("1 MB", True, 16)]
"""What a row streams: its name, whether the item is the 1 MB tensor, and the stream's window."""


async def stream_rows(system: actorch.ActorSystem, options: argparse.Namespace) -> list[dict[str, Any]]:
    """Per case: items/s by a stream, by sequential calls and by calls 8 in flight (medians of rounds)."""
    source = await system.spawn(Source, on=1)
    rows: list[dict[str, Any]] = []
    for name, big, window in STREAM_CASES:
        count = options.items // 20 if big else options.items

        async def by_stream(big: bool = big, window: int = window, count: int = count) -> int:
            got = 0
            async for _ in source.stream(Source.items, count, big).with_window(window):
                got += 1
            return got

        async def by_calls(big: bool = big, count: int = count) -> int:
            for _ in range(count):
                await source.call(Source.item, big)
            return count

        async def by_eight(big: bool = big, count: int = count) -> int:
            room = asyncio.Semaphore(IN_FLIGHT)

            async def one() -> None:
                async with room:
                    await source.call(Source.item, big)

            await asyncio.gather(*(one() for _ in range(count)))
            return count

        sides = {"stream": by_stream, "calls": by_calls, "eight": by_eight}
        rates: dict[str, list[float]] = {side: [] for side in sides}
        await by_stream()  # warm up
        for _ in range(options.rounds):
            for side, fetch in sides.items():
                start = time.perf_counter()
                got = await fetch()
                rates[side].append(got / (time.perf_counter() - start))
                assert got == count, (side, got)
        rows.append(
            {"item": name, "window": window, "items": count}
            | {f"{side}_per_s": statistics.median(values) for side, values in rates.items()}
        )
    await source.stop()
    return rows


def report_streams(rows: list[dict[str, Any]]) -> None:
    print("\n== streams: items from rank 1 to rank 0 (medians of rounds) ==")
    print("items/s; ratios: the stream's rate over the calls' rate")
    print(
        f"{'item':>6} {'window':>6} {'items':>6} {'stream':>10} {'calls, 1':>10} {'calls, 8':>10} {'s/1':>6} {'s/8':>6}"
    )
    for row in rows:
        stream = row["stream_per_s"]
        print(
            f"{row['item']:>6} {row['window']:>6} {row['items']:>6} {stream:>10,.0f} {row['calls_per_s']:>10,.0f} "
            f"{row['eight_per_s']:>10,.0f} {stream / row['calls_per_s']:>6.2f} {stream / row['eight_per_s']:>6.2f}"
        )


SECTIONS: dict[str, tuple[Any, Any]] = {
    "streams": (stream_rows, report_streams),
    "broadcast": (broadcast_rows, report_broadcast),
}
"""Each section of the benchmark: what measures it in the world, and what prints its table."""


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run these sections (default: all)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--items", type=int, default=4000, help="small items per stream (1 MB items: a 20th)")
    parser.add_argument("--mb", type=int, default=40, help="broadcast tensor size in MB")
    parser.add_argument("--actors", type=int, nargs="+", default=[8, 32, 64], help="actor counts to broadcast to")
    parser.add_argument("--json", help="also write the results to this file")
    options = parser.parse_args()
    sections = options.only or list(SECTIONS)

    async def main(system: actorch.ActorSystem) -> dict[str, Any]:
        return {name: await SECTIONS[name][0](system, options) for name in sections}

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, world of {WORLD_SIZE}, {options.rounds} rounds")
    results = actorch.run(main, world_size=WORLD_SIZE)
    for name in sections:
        SECTIONS[name][1](results[name])
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    cli()
