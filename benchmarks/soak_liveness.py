"""Soak: many multi-process actor systems start, spawn and call at once under a mixed CPU load; no node may be lost.

    python benchmarks/soak_liveness.py                     # 4 rounds of 3 jobs and 4 torch spinners
    python benchmarks/soak_liveness.py --rounds 8 --jobs 4 --spinners 6

Each round starts, all at the same moment, ``--jobs`` copies of a small actor
program (``actorch.run`` with three processes: rank 0 spawns actors on nodes
1 and 2 as soon as it starts, and one in a process of its own that joins the
running system, calls them, stops them, a few times over; each worker first
prepares its data for a random while, so that nodes become ready seconds
apart, as they do in real programs) and
``--spinners`` processes that import torch and multiply matrices on four
torch threads each, every process in a session of its own as other users'
jobs are. Start-up is what is loaded most: a dozen interpreters import torch
and bring up TensorPipe together on a couple of cores.

It prints, per round and in all: the jobs that ended well, the nodes counted
lost and by which path (each ``node lost`` log line, classified by its
``why``), the calls and spawns that failed (by exception class) and the
machine's load. Every node here is alive all along, so any node counted lost
is a false loss; the soak passes with 0 nodes lost and 0 calls failed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import actorch

REPO = Path(__file__).resolve().parent.parent
RESULT = "SOAK-RESULT "
JOB_TIMEOUT = 240.0
"""Seconds one job may take under load before it is killed (and counted as failed)."""
SETUP_SECONDS = 3.0
"""At most this long (at random) each worker prepares its data before it serves."""

PATHS = [
    ("heartbeat silence", "not heard from"),
    ("expelled by the peer", "counts this node lost"),
    ("watch failed", "connection lost"),
    ("watch ended", "left the world"),
    ("send failed", "send failed"),
    ("lane closed", "fast lane closed"),
]
"""How a ``node lost`` line's ``why`` names the path that declared the loss."""


def path_of(why: str) -> str:
    """The loss path a ``why`` names (see ``PATHS``)."""
    return next((path for path, words in PATHS if words in why), "other")


# ---------------------------------------------------------------------------- one job (run with --job)


def prepare(rank: int) -> None:
    """Each node's set-up: a worker prepares its data for a random while first (torch work), as real ones do.

    Nodes of one system thus become ready at different moments, seconds apart
    under load, as they do when they load data or models before serving.
    """
    if rank == 0:
        return
    end = time.monotonic() + random.uniform(0.0, SETUP_SECONDS)
    data = torch.randn(256, 256)
    while time.monotonic() < end:
        data = torch.tanh(data @ data)


async def job(system: actorch.ActorSystem, cycles: int) -> dict[str, Any]:
    """Spawn models on nodes 1 and 2 at once, call them, stop them, ``cycles`` times; one more in its own process."""
    counts: dict[str, Any] = {"spawns": 0, "calls": 0, "failed": collections.Counter()}
    for cycle in range(cycles):
        refs = []
        places: list[int | actorch.Where] = [1, 2, 2, 1]
        if cycle == 0:
            places.append(actorch.Where(process="own"))  # a node that joins the running system
        for index, place in enumerate(places):
            try:
                refs.append(await system.spawn(Model, args=(index,), name=f"soak/{cycle}/{index}", on=place))
                counts["spawns"] += 1
            except actorch.ActorchError as exc:
                counts["failed"][type(exc).__name__] += 1
        for _ in range(5):
            outcomes = await asyncio.gather(*(ref.call(Model.step) for ref in refs), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    counts["failed"][type(outcome).__name__] += 1
                else:
                    counts["calls"] += 1
        for ref in refs:
            try:
                await ref.stop()
            except actorch.ActorchError as exc:
                counts["failed"][type(exc).__name__] += 1
    counts["failed"] = dict(counts["failed"])
    return counts


def job_main(cycles: int) -> None:
    """One job: a system of three processes running ``job``; prints its counts on one line."""
    started = time.monotonic()
    counts = actorch.run(lambda system: job(system, cycles), world_size=3, setup=prepare)
    counts["seconds"] = round(time.monotonic() - started, 2)
    print(RESULT + json.dumps(counts), flush=True)


class Model(actorch.Actor):
    """A small model that trains a step per call (torch work on the node, as a trainer's)."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x, self.y = torch.randn(256, 64), torch.randint(0, 10, (256,))

    async def step(self) -> float:
        """One training step; the loss."""
        self.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        return loss.item()


# ---------------------------------------------------------------------------- the load


SPINNER = """
import sys, time
import torch
torch.set_num_threads(4)
a = torch.randn(384, 384)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    a = torch.tanh(a @ a)
"""


def start_spinner(seconds: float) -> subprocess.Popen[bytes]:
    """A process that imports torch and multiplies matrices on four threads for ``seconds``."""
    return subprocess.Popen(
        [sys.executable, "-c", SPINNER, str(seconds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def start_job(cycles: int, log: Path) -> tuple[subprocess.Popen[bytes], Any]:
    """A job in a session of its own; its stdout and stderr (the JSON log lines) go to ``log``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("ACTORCH_LOG_LEVEL", "warning")
    sink = log.open("wb")
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--job", "--cycles", str(cycles)],
        stdout=sink,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    return process, sink


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process``'s whole session (a job's workers with it) and reap it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


LOST_LINE = re.compile(r'\{.*"event": "node lost".*\}')


def read_job(log: Path, code: int | None) -> dict[str, Any]:
    """What one job reported: its counts (None if it reported none), its node-lost lines, its exit code."""
    text = log.read_text(errors="replace")
    counts = None
    losses = []
    for line in text.splitlines():
        if line.startswith(RESULT):
            counts = json.loads(line[len(RESULT) :])
        elif LOST_LINE.search(line):
            event = json.loads(LOST_LINE.search(line).group(0))  # type: ignore[union-attr]
            losses.append(event)
    return {"counts": counts, "losses": losses, "code": code, "tail": text[-1500:]}


def one_round(jobs: int, spinners: int, cycles: int, folder: Path, number: int) -> list[dict[str, Any]]:
    """Start ``spinners`` and ``jobs`` at once, wait for the jobs, end the spinners; each job's report."""
    load = [start_spinner(JOB_TIMEOUT) for _ in range(spinners)]
    running = [start_job(cycles, folder / f"round{number}-job{i}.log") for i in range(jobs)]
    limit = time.monotonic() + JOB_TIMEOUT
    reports = []
    try:
        for index, (process, sink) in enumerate(running):
            try:
                code: int | None = process.wait(max(limit - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                code = None
            stop_group(process)
            sink.close()
            reports.append(read_job(folder / f"round{number}-job{index}.log", code))
    finally:
        for process, sink in running:
            stop_group(process)
            sink.close()
        for spinner in load:
            stop_group(spinner)
    return reports


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over job reports: jobs ok, nodes lost by path, calls failed by error, spawns and calls done."""
    by_path: collections.Counter[str] = collections.Counter()
    failed: collections.Counter[str] = collections.Counter()
    spawns = calls = ok = 0
    for report in reports:
        for event in report["losses"]:
            by_path[path_of(str(event.get("why", "")))] += 1
        counts = report["counts"]
        if counts is None:
            failed["job ended without a result"] += 1
            continue
        spawns += counts["spawns"]
        calls += counts["calls"]
        failed.update(counts["failed"])
        ok += report["code"] == 0 and not counts["failed"]
    return {
        "jobs": len(reports),
        "ok": ok,
        "lost": sum(by_path.values()),
        "by_path": dict(by_path),
        "failed": sum(failed.values()),
        "failures": dict(failed),
        "spawns": spawns,
        "calls": calls,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=3, help="actor systems (3 processes each) started at once")
    parser.add_argument("--spinners", type=int, default=4, help="torch matmul processes (4 threads each) beside them")
    parser.add_argument("--cycles", type=int, default=3, help="spawn, call and stop cycles per job")
    parser.add_argument("--keep", action="store_true", help="keep the jobs' logs (their folder is printed)")
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job_main(args.cycles)
        return 0
    folder = Path(tempfile.mkdtemp(prefix="soak-liveness-"))
    every: list[dict[str, Any]] = []
    started = time.monotonic()
    for number in range(1, args.rounds + 1):
        reports = one_round(args.jobs, args.spinners, args.cycles, folder, number)
        every.extend(reports)
        total = summarize(reports)
        load = os.getloadavg()[0]
        print(
            f"round {number}: {total['ok']}/{total['jobs']} jobs ok, {total['lost']} nodes lost {total['by_path']}, "
            f"{total['failed']} failed {total['failures']}, {total['spawns']} spawns, {total['calls']} calls, "
            f"load {load:.1f}",
            flush=True,
        )
        for report in reports:
            for event in report["losses"]:
                print(f"    node {event.get('node')} lost node {event.get('peer')}: {event.get('why')}", flush=True)
            if report["counts"] is None:
                print("    a job reported nothing; its output ends with:\n" + report["tail"], flush=True)
    total = summarize(every)
    print(
        f"\nall: {args.rounds} rounds, {total['jobs']} jobs ({total['ok']} ok) in {time.monotonic() - started:.0f} s; "
        f"nodes lost {total['lost']} {total['by_path']}; calls failed {total['failed']} {total['failures']}; "
        f"{total['spawns']} spawns, {total['calls']} calls"
    )
    if args.keep:
        print(f"logs in {folder}")
    else:
        for log in folder.iterdir():
            log.unlink()
        folder.rmdir()
    return 0 if total["lost"] == 0 and total["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
