"""How long ``actorch.run`` takes to start and end a system, against the cost of ``import torch`` itself.

Each side is a fresh interpreter, timed from its start to its exit, side by
side in one run, alternating, medians of ``--rounds``:

- ``python -c pass``: the interpreter alone;
- ``import torch``: what any torch program pays before it does anything;
- ``import actorch``: the package, torch included;
- ``run N``: ``actorch.run(main, world_size=N)`` with a ``main`` that returns
  at once, for each N of ``--nodes`` (1, 4 and 8): rank 0's import, its N - 1
  worker processes started and joined, ``main`` run, and the whole system
  shut down. The time to ``main`` (rank 0 enters it) is printed beside it.

The machine's cores bound what N processes that each import torch can take:
on 2 cores, 8 nodes import torch 8 times over 2 cores. The last column divides
each side by ``import torch``.

    python benchmarks/bench_startup.py
    python benchmarks/bench_startup.py --nodes 1 4 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

RUN = """
import time, sys
began = float(sys.argv[1])
import actorch

async def main(system):
    print(f"MAIN {time.time() - began:.3f}", flush=True)

if __name__ == "__main__":
    actorch.run(main, world_size={nodes}, record=False, status=False)
"""


def timed(argv: list[str]) -> tuple[float, float | None]:
    """Seconds from start to exit of ``argv``, and to ``main`` if it says so."""
    began = time.time()
    done = subprocess.run(
        [*argv, repr(began)], capture_output=True, text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    took = time.time() - began
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    to_main = next((float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("MAIN ")), None)
    return took, to_main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    python = sys.executable
    sides: dict[str, list[str]] = {
        "python -c pass": [python, "-c", "pass"],
        "import torch": [python, "-c", "import torch"],
        "import actorch": [python, "-c", "import actorch"],
    }
    scripts = []
    for nodes in args.nodes:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f".startup_{nodes}.py")
        with open(path, "w", encoding="utf-8") as file:
            file.write(RUN.replace("{nodes}", str(nodes)))
        scripts.append(path)
        sides[f"run {nodes}"] = [python, path]
    times: dict[str, list[float]] = {side: [] for side in sides}
    to_main: dict[str, list[float]] = {side: [] for side in sides}
    try:
        for _ in range(args.rounds):
            for side, argv in sides.items():
                took, entered = timed(argv)
                times[side].append(took)
                if entered is not None:
                    to_main[side].append(entered)
    finally:
        for path in scripts:
            os.remove(path)
    torch_time = statistics.median(times["import torch"])
    with open("/proc/loadavg", encoding="ascii") as file:
        load = file.read().split()[0]
    print(f"start-up, medians of {args.rounds} rounds, {os.cpu_count()} cores, load {load} at the end")
    print(f"{'side':<16}{'to exit (s)':>12}{'to main (s)':>12}{'x import torch':>16}")
    for side in sides:
        median = statistics.median(times[side])
        entered = f"{statistics.median(to_main[side]):.2f}" if to_main[side] else "-"
        print(f"{side:<16}{median:>12.2f}{entered:>12}{median / torch_time:>16.2f}")


if __name__ == "__main__":
    main()
