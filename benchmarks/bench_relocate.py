"""Time to relocate: from kill -9 of the node hosting a named ReplayBuffer to the first call that works again.

    python benchmarks/bench_relocate.py                       # 5 rounds, 10,000 transitions of 64 floats
    python benchmarks/bench_relocate.py --rounds 7 --transitions 100000 --every 10000
    python benchmarks/bench_relocate.py --signal stop         # frozen nodes: found by the heartbeats
    python benchmarks/bench_relocate.py --snapshots /tmp/snaps  # each save also written there (run(snapshots=))

One world of ``rounds + 2`` processes. Rank 0 runs ``main``; the buffer starts
on node 1 (``Restart(relocate=True)``, ``snapshot_every``), filled before the
first round. Each round kills the node hosting it while rank 0 calls it
through the ref it got at spawn and samples it by name, both in tight loops,
and records, from the moment of the kill:

- when rank 0 counts the node lost (``NodeLost``): the detection;
- the first call through the old ref that succeeds;
- the first lookup + sample by name that succeeds.

The buffer then lives on the next node, which the next round kills (each
relocation waits the policy's backoff, kept constant with ``factor=1``). The
detection of a killed process is its closed connection; of a frozen one
(``--signal stop``), the liveness timeout. Medians are printed, and the cost
of a save (the addition that triggers one, against one that does not); with
``--snapshots DIR``, each save is also written to a file there before it
returns, as ``run(snapshots=DIR)`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import time
from typing import Any

import torch

import actorch


class Round:
    """The times of one round, in seconds from the kill."""

    def __init__(self) -> None:
        self.killed_at = 0.0
        self.detected: float | None = None
        self.old_ref: float | None = None
        self.by_name: float | None = None
        self.done = asyncio.Event()

    def note(self, field: str, sent: float | None = None) -> None:
        """``field`` happened now; for a call, only if it was ``sent`` after the kill (not one already answered)."""
        if sent is not None and sent < self.killed_at:
            return
        if getattr(self, field) is None:
            setattr(self, field, time.monotonic() - self.killed_at)
        if None not in (self.detected, self.old_ref, self.by_name):
            self.done.set()


async def watch_losses(system: actorch.ActorSystem, rounds: dict[int, Round]) -> None:
    async for event in system.events():
        if isinstance(event, actorch.NodeLost) and event.rank in rounds:
            rounds[event.rank].note("detected")


async def call_old_ref(buffer: actorch.ActorRef[actorch.ReplayBuffer], current: list[Round]) -> None:
    while True:
        sent = time.monotonic()
        try:
            await buffer.call(actorch.ReplayBuffer.size)
        except actorch.NodeLostError:
            await asyncio.sleep(0.001)
            continue
        if current:
            current[-1].note("old_ref", sent)
        await asyncio.sleep(0.001)


async def sample_by_name(system: actorch.ActorSystem, current: list[Round]) -> None:
    while True:
        sent = time.monotonic()
        try:
            found = await system.lookup("replay")
            await found.call(actorch.ReplayBuffer.sample, 32)
        except actorch.NodeLostError:
            await asyncio.sleep(0.001)
            continue
        if current:
            current[-1].note("by_name", sent)
        await asyncio.sleep(0.001)


async def fill(buffer: actorch.ActorRef[Any], args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Add every transition, one batch of 100 at a time; the seconds of the additions that saved, and of the rest."""
    saving: list[float] = []
    plain: list[float] = []
    batch = 100
    for start in range(0, args.transitions, batch):
        obs = torch.randn(batch, args.obs)
        began = time.perf_counter()
        await buffer.call(actorch.ReplayBuffer.extend, {"obs": obs, "i": torch.arange(start, start + batch)})
        took = time.perf_counter() - began
        (saving if (start + batch) % args.every == 0 else plain).append(took)
    return saving, plain


async def main(system: actorch.ActorSystem, args: argparse.Namespace) -> dict[str, Any]:
    # Every round is one more relocation within the policy's window: a constant backoff, and enough restarts.
    restart = actorch.Restart(max_restarts=args.rounds, backoff=args.backoff, factor=1.0, relocate=True)
    buffer = await system.spawn(
        actorch.ReplayBuffer,
        args=(args.transitions,),
        kwargs={"snapshot_every": args.every},
        name="replay",
        on=1,
        restart=restart,
    )
    saving, plain = await fill(buffer, args)
    rounds: dict[int, Round] = {}
    current: list[Round] = []
    loops = [
        asyncio.ensure_future(watch_losses(system, rounds)),
        asyncio.ensure_future(call_old_ref(buffer, current)),
        asyncio.ensure_future(sample_by_name(system, current)),
    ]
    kill = signal.SIGKILL if args.signal == "kill" else signal.SIGSTOP
    try:
        for _ in range(args.rounds):
            await asyncio.sleep(0.3)  # the loops run against the live buffer first
            home = (await system.lookup("replay")).rank
            this = rounds[home] = Round()
            current.append(this)
            this.killed_at = time.monotonic()
            os.kill(next(info.pid for info in system.nodes if info.rank == home), kill)  # nodes: the live ones
            async with asyncio.timeout(60):
                await this.done.wait()
            size = await buffer.call(actorch.ReplayBuffer.size)
            assert size == args.transitions, f"the buffer holds {size} transitions after the move"
    finally:
        for loop in loops:
            loop.cancel()
    return {
        "rounds": [{"killed": rank, **vars_of(one)} for rank, one in rounds.items()],
        "save_seconds": saving,
        "plain_seconds": plain,
        "state_bytes": args.transitions * (args.obs * 4 + 8),
    }


def vars_of(one: Round) -> dict[str, float | None]:
    return {"detected": one.detected, "old_ref": one.old_ref, "by_name": one.by_name}


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    rounds = result["rounds"]
    mb = result["state_bytes"] / 1e6
    how = "kill -9" if args.signal == "kill" else "SIGSTOP (frozen)"
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {len(rounds)} rounds of {how}")
    print(
        f"ReplayBuffer of {args.transitions:,} transitions ({mb:.1f} MB), a save every {args.every:,} "
        f"additions, Restart(relocate=True, backoff={args.backoff:g}, factor=1)"
    )
    print(f"snapshot directory: {args.snapshots or 'none (rank 0 keeps them in memory)'}")
    print()
    print(f"{'from the kill to (medians, ms)':48} {'median':>8} {'min':>8} {'max':>8}")
    rows = [
        ("rank 0 counts the node lost (detection)", [r["detected"] for r in rounds]),
        ("first call through the old ref", [r["old_ref"] for r in rounds]),
        ("first lookup + sample by name", [r["by_name"] for r in rounds]),
        ("first call, after the detection", [r["old_ref"] - r["detected"] for r in rounds]),
    ]
    for label, values in rows:
        ms = [value * 1000 for value in values]
        print(f"{label:48} {statistics.median(ms):8.1f} {min(ms):8.1f} {max(ms):8.1f}")
    print()
    print(f"{'an addition of 100 transitions (ms)':48} {'median':>8}")
    print(f"{'  that saves the buffer to rank 0':48} {statistics.median(result['save_seconds']) * 1000:8.2f}")
    print(f"{'  that does not':48} {statistics.median(result['plain_seconds']) * 1000:8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="kills, one node each (the world has rounds + 2)")
    parser.add_argument("--transitions", type=int, default=10_000, help="the buffer's capacity, filled")
    parser.add_argument("--obs", type=int, default=64, help="floats per transition")
    parser.add_argument("--every", type=int, default=1_000, help="snapshot_every (a multiple of 100)")
    parser.add_argument("--backoff", type=float, default=0.1, help="the policy's backoff (Restart's default)")
    parser.add_argument("--signal", choices=["kill", "stop"], default="kill")
    parser.add_argument("--snapshots", metavar="DIR", help="write every save to this snapshot directory too")
    parser.add_argument("--json", help="also write the results to this file")
    options = parser.parse_args()
    if options.every % 100 or options.transitions % options.every:
        parser.error("--every must be a multiple of 100 that divides --transitions")

    async def run_main(system: actorch.ActorSystem) -> dict[str, Any]:
        return await main(system, options)

    outcome = actorch.run(run_main, world_size=options.rounds + 2, stop_grace=1.0, snapshots=options.snapshots)
    report(outcome, options)
    if options.json:
        with open(options.json, "w") as file:
            json.dump(outcome, file, indent=2)
