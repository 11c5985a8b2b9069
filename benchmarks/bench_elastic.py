"""Elastic membership: how fast a new process serves, how fast a busy node leaves, what churn costs the others.

One elastic system (``actorch.run(..., world_size=2, elastic=True)``) runs
every measurement, round after round; the table gives medians of rounds.

- join -> first served call: a new process is launched with the system's join
  environment (``system.join_env()``) and calls ``actorch.serve()``; timed from
  ``Popen`` until a call to an actor spawned on the new node is answered, split
  into launch -> node in ``system.nodes`` (joined) and joined -> answered
  (spawn + call). The floor beside it: a bare ``python -c "import torch"``
  process (and ``import actorch``), started and waited for in the same round.
- graceful leave with 100 actors: the joined node then hosts 100 actors with a
  trivial ``on_stop``; ``await system.leave(rank)`` is timed from rank 0 until
  it returns (the node is gone), and until its process has exited.
- throughput during churn: 200 calls in flight from rank 0 to an actor on rank 1
  (a stable node) for a fixed window, without churn, then while other nodes
  join and leave one after another (launch, wait until joined, ``leave``).

On a small machine a joining process's start (its ``import torch``) competes
for the same cores as the stable nodes: the churn ratio measures that too.

    python benchmarks/bench_elastic.py               # 3 rounds, 3 s windows (under a minute on 2 cores)
    python benchmarks/bench_elastic.py --quick       # 1 round, 1 s windows: a smoke run
    python benchmarks/bench_elastic.py --rounds 5 --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import actorch

HERE = Path(__file__).resolve().parent
MODULE = "bench_elastic"
"""This file's importable name: actor classes must resolve as ``bench_elastic:Cls`` on every node, not ``__main__``."""
JOINER = "import sys; sys.path.insert(0, sys.argv[1]); import actorch; sys.exit(actorch.serve(name=sys.argv[2]))"
JOIN_WITHIN = 120.0
QUIET = {"ACTORCH_LOG_LEVEL": "warning", "TORCH_CPP_LOG_LEVEL": "ERROR"}


class Echo(actorch.Actor):
    async def noop(self) -> None:
        return None

    async def on_stop(self) -> None:
        return None


class Joiners:
    """The joining processes this run launched, their output in a temporary folder; ended and removed at the end."""

    def __init__(self, system: actorch.ActorSystem) -> None:
        self.system = system
        self.folder = Path(tempfile.mkdtemp(prefix="bench_elastic-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.count = 0
        self.odd: list[str] = []

    def launch(self, kind: str) -> tuple[str, subprocess.Popen[bytes]]:
        self.count += 1
        label = f"{kind}{self.count}"
        env = {**os.environ, **self.system.join_env(), **QUIET}
        with (self.folder / f"{label}.out").open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", JOINER, str(HERE), label], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.procs[label] = proc
        return label, proc

    async def joined(self, label: str) -> int:
        """The rank of node ``label`` once ``system.nodes`` lists it."""
        proc = self.procs[label]
        async with asyncio.timeout(JOIN_WITHIN):
            while True:
                for info in self.system.nodes:
                    if info.label == label:
                        return info.rank
                if proc.poll() is not None:
                    raise RuntimeError(f"joiner {label} exited with {proc.returncode}: {self.output(label)}")
                await asyncio.sleep(0.002)

    async def exited(self, label: str, within: float = 30.0) -> int | None:
        proc = self.procs[label]
        try:
            code = await asyncio.to_thread(proc.wait, within)
        except subprocess.TimeoutExpired:
            self.odd.append(f"{label}: still running {within:.0f} s after it left")
            return None
        if code != 0:
            self.odd.append(f"{label}: exit code {code}: {self.output(label)[-500:]}")
        elif output := self.output(label).strip():
            self.odd.append(f"{label} printed: {output[-500:]}")
        return code

    def output(self, label: str) -> str:
        return (self.folder / f"{label}.out").read_text(errors="replace")

    def kill_all(self) -> None:
        for label, proc in self.procs.items():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                self.odd.append(f"{label}: killed at the end")
        shutil.rmtree(self.folder, ignore_errors=True)  # what was odd in the outputs is in self.odd


def bare_process(module: str) -> tuple[float, float]:
    """Seconds for ``python -c "import module"`` to have imported it (it says so on stdout), and to exit."""
    code = f"import sys, {module}; sys.stdout.write('imported\\n'); sys.stdout.flush()"
    started = time.perf_counter()
    with subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **QUIET}, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        imported = time.perf_counter()
        status = proc.wait()
    exited = time.perf_counter()
    if status != 0 or line != b"imported\n":
        raise RuntimeError(f"python -c {code!r} failed (exit code {status})")
    return imported - started, exited - started


async def join_and_leave(system: actorch.ActorSystem, joiners: Joiners, actors: int) -> dict[str, float]:
    """One join timed to its first answered call; then ``actors`` actors on the new node, and its leave timed."""
    started = time.perf_counter()
    label, _ = joiners.launch("join")
    rank = await joiners.joined(label)
    joined = time.perf_counter()
    first = await system.spawn(Echo, on=rank)
    await first.call(Echo.noop)
    served = time.perf_counter()

    more = await asyncio.gather(*(system.spawn(Echo, on=rank) for _ in range(actors - 1)))
    await asyncio.gather(*(ref.call(Echo.noop) for ref in more))
    exit_time: list[float] = []

    def wait_exit() -> None:
        joiners.procs[label].wait(60)
        exit_time.append(time.perf_counter())

    waiting = asyncio.ensure_future(asyncio.to_thread(wait_exit))
    leaving = time.perf_counter()
    await system.leave(rank)
    left = time.perf_counter()
    await waiting
    await joiners.exited(label)
    return {
        "join_total": served - started,
        "join_visible": joined - started,
        "join_serve": served - joined,
        "leave": left - leaving,
        "leave_exit": exit_time[0] - leaving,
    }


async def calls_per_second(target: actorch.ActorRef[Echo], in_flight: int, duration: float) -> float:
    """Calls answered per second with ``in_flight`` callers looping on ``target`` for ``duration`` seconds."""
    answered = 0
    deadline = time.perf_counter() + duration

    async def caller() -> None:
        nonlocal answered
        while time.perf_counter() < deadline:
            await target.call(Echo.noop)
            answered += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(in_flight)))
    return answered / (time.perf_counter() - started)


async def churn(system: actorch.ActorSystem, joiners: Joiners, stop: asyncio.Event) -> int:
    """Nodes join and leave one after another until ``stop`` is set; how many cycles started before it was."""
    cycles = 0
    while not stop.is_set():
        label, _ = joiners.launch("churn")
        rank = await joiners.joined(label)
        await system.leave(rank)
        await joiners.exited(label)
        cycles += 1
    return cycles


async def throughput(
    system: actorch.ActorSystem, joiners: Joiners, target: actorch.ActorRef[Echo], in_flight: int, duration: float
) -> dict[str, float]:
    steady = await calls_per_second(target, in_flight, duration)
    stop = asyncio.Event()
    churning = asyncio.ensure_future(churn(system, joiners, stop))
    try:
        during = await calls_per_second(target, in_flight, duration)
    finally:
        stop.set()
    cycles = await churning  # the join-and-leave under way finishes, outside the window
    return {"steady": steady, "churn": during, "ratio": during / steady, "cycles": cycles}


async def bench(system: actorch.ActorSystem, args: argparse.Namespace) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {}
    joiners = Joiners(system)
    try:
        target = await system.spawn(Echo, on=1)
        await calls_per_second(target, args.in_flight, min(0.5, args.duration))  # warm-up
        for index in range(args.rounds):
            step: dict[str, float] = {}
            for module in ("torch", "actorch"):
                imported, exited = await asyncio.to_thread(bare_process, module)
                step |= {f"import_{module}": exited, f"imported_{module}": imported}
            step |= await join_and_leave(system, joiners, args.actors)
            step |= await throughput(system, joiners, target, args.in_flight, args.duration)
            for key, value in step.items():
                runs.setdefault(key, []).append(value)
            print(f"round {index + 1}/{args.rounds} done", flush=True)
    finally:
        joiners.kill_all()
    for line in joiners.odd:
        print(f"NOTE {line}")
    return runs


def report(runs: dict[str, list[float]], args: argparse.Namespace) -> None:
    med = {key: statistics.median(values) for key, values in runs.items()}
    rows = [
        ("join -> first served call (s)", "join_total", ".3f"),
        ("  launch -> in system.nodes (s)", "join_visible", ".3f"),
        ("  joined -> call answered: spawn + call (s)", "join_serve", ".3f"),
        ('floor: python -c "import torch", start -> exit (s)', "import_torch", ".3f"),
        ("  start -> torch imported (s)", "imported_torch", ".3f"),
        ('floor: python -c "import actorch", start -> exit (s)', "import_actorch", ".3f"),
        ("  start -> actorch imported (s)", "imported_actorch", ".3f"),
        (f"leave with {args.actors} actors: leave() returned (s)", "leave", ".3f"),
        (f"leave with {args.actors} actors: process exited (s)", "leave_exit", ".3f"),
        (f"calls/s to rank 1, {args.in_flight} in flight, no churn", "steady", ",.0f"),
        (f"calls/s to rank 1, {args.in_flight} in flight, during churn", "churn", ",.0f"),
        ("churn / no churn", "ratio", ".3f"),
        (f"join+leave cycles started in the {args.duration:g} s churn window", "cycles", ".0f"),
    ]
    print()
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, python {sys.version.split()[0]}")
    print(f"rounds: {args.rounds}, windows: {args.duration:g} s")
    print()
    print("| measure | median | runs |")
    print("|---|---:|---|")
    for title, key, fmt in rows:
        print(f"| {title} | {med[key]:{fmt}} | {', '.join(f'{value:{fmt}}' for value in runs[key])} |")
    print()
    join = med["join_total"]
    for module in ("torch", "actorch"):
        exited, imported = med[f"import_{module}"], med[f"imported_{module}"]
        print(
            f"join -> first call vs a bare `import {module}` process: {join / exited:.2f}x its start -> exit, "
            f"{join / imported:.2f}x its start -> imported; beyond the import: {join - imported:+.3f} s "
            f"({(join - imported) / join:+.0%} of the join)"
        )
    print(
        f"throughput during churn / without: {med['churn'] / med['steady']:.3f} (ratio of medians); "
        f"per round: {', '.join(f'{value:.3f}' for value in runs['ratio'])}"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of each throughput window")
    parser.add_argument("--actors", type=int, default=100, help="actors on the node that leaves")
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="1 round, 1 s windows: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration = 1, 1.0

    async def main(system: actorch.ActorSystem) -> dict[str, list[float]]:
        return await bench(system, args)

    runs = actorch.run(main, world_size=2, elastic=True, stop_grace=2.0)
    report(runs, args)


if __name__ == "__main__":
    # Run as the importable module, so that the actor classes are ``bench_elastic:Echo`` on every node.
    sys.path.insert(0, str(HERE))
    importlib.import_module(MODULE).cli()
