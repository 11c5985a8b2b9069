"""Where work runs: node processes on demand, an actor's own process, and CPU-bound actors in parallel.

One system (``actorch.run(main)``: one process, which goes on torch RPC the
first time it starts a node process) runs every measurement, round after
round; the table gives medians of rounds, each side by side with its floor:

- own process: ``spawn(Sim, on=Where(process="own"))`` timed until it returns
  (the process has joined and the actor has started), then one call; the floor
  is a bare ``python -c "import torch, actorch"`` in the same round, until it
  has imported both and until it has exited. The actor is then stopped, and its
  process leaves.
- add_nodes(4): four node processes started at once, until all four serve;
  they then leave (``system.leave``), timed too.
- parallel CPU work: N actors (``--actors``, 2) each computing for ``--work``
  seconds (1.0) of CPU time, all called at once: in processes of their own,
  and the same actors on one node, whose event loop runs them one after the
  other. The speed-up is the second over the first. Beside them, the floor: as
  many plain Python processes doing the same work, started at once.
- relocation after a kill: measured by the relocation work
  (``Restart(..., relocate=True)``), not here; its row says so.

On a machine whose cores other programs use, every figure is slower, the
parallel one most: say what else ran.

    python benchmarks/bench_placement.py               # 3 rounds
    python benchmarks/bench_placement.py --quick       # 1 round: a smoke run
    python benchmarks/bench_placement.py --rounds 5 --actors 2 --work 1.0 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_elastic import QUIET, bare_process

import actorch


class Sim(actorch.Actor):
    """A CPU-bound actor: computes for a given CPU time, as an environment step or a data transform does."""

    async def noop(self) -> None:
        return None

    async def work(self, seconds: float) -> float:
        """Compute for ``seconds`` of this process's CPU time; the wall time it took."""
        started, spent = time.perf_counter(), time.process_time()
        while time.process_time() - spent < seconds:
            sum(range(10_000))
        return time.perf_counter() - started


BURN = (
    "import sys, time\n"
    "spent = time.process_time()\n"
    "while time.process_time() - spent < float(sys.argv[1]):\n"
    "    sum(range(10_000))"
)


def plain_processes(count: int, work: float) -> float:
    """Seconds for ``count`` plain Python processes, started at once, to compute ``work`` s of CPU each and exit."""
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", BURN, str(work)]) for _ in range(count)]
    if any(proc.wait() != 0 for proc in procs):
        raise RuntimeError("a plain burning process failed")
    return time.perf_counter() - started


async def own_process(system: actorch.ActorSystem) -> dict[str, float]:
    imported, exited = await asyncio.to_thread(bare_process, "torch, actorch")
    started = time.perf_counter()
    sim = await system.spawn(Sim, on=actorch.Where(process="own"))
    spawned = time.perf_counter()
    await sim.call(Sim.noop)
    answered = time.perf_counter()
    await sim.stop()
    return {
        "own_spawn": spawned - started,
        "own_first_call": answered - started,
        "bare_import": imported,
        "bare_exit": exited,
    }


async def add_four(system: actorch.ActorSystem) -> dict[str, float]:
    started = time.perf_counter()
    nodes = await system.add_nodes(4, label="bench")
    added = time.perf_counter()
    await asyncio.gather(*(system.leave(node.rank) for node in nodes))
    return {"add_nodes_4": added - started, "leave_4": time.perf_counter() - added}


async def parallel(system: actorch.ActorSystem, actors: int, work: float) -> dict[str, float]:
    own = await system.spawn_group(Sim, actors, on=actorch.Where(process="own"))
    one_node = await system.spawn_group(Sim, actors, on=0)
    timings = {}
    for kind, group in (("own_processes", own), ("one_node", one_node)):
        started = time.perf_counter()
        await asyncio.gather(*(member.call(Sim.work, work) for member in group))
        timings[f"work_{kind}"] = time.perf_counter() - started
    await asyncio.gather(*(member.stop() for member in (*own, *one_node)))
    timings["speedup"] = timings["work_one_node"] / timings["work_own_processes"]
    timings["work_plain_processes"] = await asyncio.to_thread(plain_processes, actors, work)
    return timings


async def measure(system: actorch.ActorSystem, rounds: int, actors: int, work: float) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for measured in (await own_process(system), await add_four(system), await parallel(system, actors, work)):
            for key, value in measured.items():
                results.setdefault(key, []).append(value)
    return results


def report(results: dict[str, list[float]], actors: int, work: float) -> None:
    median = {key: statistics.median(values) for key, values in results.items()}
    rounds = len(next(iter(results.values())))
    print(f"medians of {rounds} rounds, {os.cpu_count()} cores\n")
    print(f"{'measurement':<52}{'median':>10}{'floor / other':>18}")
    rows = [
        ("spawn in a process of its own (returns)", "own_spawn", "bare_import"),
        ("  ... and its first call answered", "own_first_call", "bare_exit"),
        ("add_nodes(4), until all four serve", "add_nodes_4", None),
        ("  then leave(rank) for all four", "leave_4", None),
        (f"{actors} actors x {work:g} s CPU, own processes", "work_own_processes", "work_plain_processes"),
        (f"{actors} actors x {work:g} s CPU, one node", "work_one_node", None),
    ]
    for title, key, beside in rows:
        other = f"{median[beside]:.2f} s" if beside else ""
        print(f"{title:<52}{median[key]:>9.2f}s{other:>18}")
    print(f"{'speed-up of own processes over one node':<52}{median['speedup']:>9.2f}x")
    print(f"{'relocation after a kill':<52}{'-':>10}  (measured with Restart(relocate=True), not here)")
    print(
        "\nfloors, in the same rounds: python -c 'import torch, actorch' until imported, and until it exited;"
        f"\n{actors} plain Python processes computing {work:g} s of CPU each, started at once, until they exited"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--actors", type=int, default=2, help="CPU-bound actors run at once (2)")
    parser.add_argument("--work", type=float, default=1.0, help="seconds of CPU work per actor (1.0)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    os.environ.update(QUIET)

    async def run_all(system: actorch.ActorSystem) -> dict[str, list[float]]:
        return await measure(system, rounds, args.actors, args.work)

    results = actorch.run(run_all, stop_grace=2.0, log_level="warning")
    report(results, args.actors, args.work)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
