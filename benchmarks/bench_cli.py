"""How fast the ``actorch`` command answers, against ``python -c pass`` side by side.

Each command runs as the console script runs it (``from _actorch_cli import
main``), in a fresh interpreter, with an empty runtime directory of its own:
``--help``, ``status`` of no system, ``stop --pid 1`` of no system, and bad
input. ``python -m actorch --help`` is there too: the same command behind the
package's whole facade, torch included. The commands take turns, round after
round, so a load that comes and goes weighs on all of them alike; medians, and
each median's ratio to the median of ``python -c pass``.

    python benchmarks/bench_cli.py               # 11 rounds
    python benchmarks/bench_cli.py --rounds 21
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = "import sys; from _actorch_cli import main; sys.exit(main())"
"""What the ``actorch`` console script does (pyproject.toml's ``[project.scripts]``)."""

COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "actorch --help": [sys.executable, "-c", SCRIPT, "--help"],
    "actorch status (no system)": [sys.executable, "-c", SCRIPT, "status"],
    "actorch stop --pid 1": [sys.executable, "-c", SCRIPT, "stop", "--pid", "1"],
    "actorch launch (bad input)": [sys.executable, "-c", SCRIPT, "launch"],
    "python -m actorch --help": [sys.executable, "-m", "actorch", "--help"],
}
EXPECTED = {"actorch status (no system)": 1, "actorch stop --pid 1": 1, "actorch launch (bad input)": 2}
"""Exit codes other than 0 that a command must end with, or the benchmark stops (it would time a failure)."""


def once(argv: list[str], env: dict[str, str], expected: int) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != expected:
        sys.exit(f"{' '.join(argv)}: exit code {done.returncode}, expected {expected}\n{done.stderr.decode()}")
    return elapsed


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--rounds", type=int, default=11, help="runs of each command (11)")
    args = options.parse_args()
    with tempfile.TemporaryDirectory() as runtime:
        env = {key: value for key, value in os.environ.items() if key != "ACTORCH_STATUS_PORT"}
        env["ACTORCH_RUNTIME_DIR"] = str(Path(runtime) / "actorch")  # no system runs, as far as the command sees
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for name, argv in COMMANDS.items():  # a first run of each, not timed: files in the page cache
            once(argv, env, EXPECTED.get(name, 0))
        for _ in range(args.rounds):
            for name, argv in COMMANDS.items():
                times[name].append(once(argv, env, EXPECTED.get(name, 0)))
    floor = statistics.median(times["python -c pass"])
    print(f"{'command':<30} {'median':>9} {'min':>9} {'x python -c pass':>17}   ({args.rounds} rounds)")
    for name, found in times.items():
        median = statistics.median(found)
        print(f"{name:<30} {median * 1e3:>7.0f} ms {min(found) * 1e3:>6.0f} ms {median / floor:>16.1f}x")


if __name__ == "__main__":
    main()
