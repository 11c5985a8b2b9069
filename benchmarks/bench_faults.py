"""Every fault the test suite injects, repeated: the bound promised, the median and worst measured, messages lost.

    python benchmarks/bench_faults.py                  # 5 runs of each fault, then the bad inputs
    python benchmarks/bench_faults.py --runs 3 --only partition stale

The faults run the test suite's own scripts (``tests/mp_scripts``) in fresh
processes, exactly as the tests do, and read what they report. "Lost" counts
calls that ended with neither a result nor a named error, and load-test
messages that never arrived or arrived twice: it must be 0 everywhere. The
bad inputs run in one two-node world in strict mode: each is sent 20 times to
an actor on the other node, the median time to its named error is printed,
and the actor must answer correctly afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import actorch

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "transport"))  # the partition faults run test_network_partition's runner

from _mp import Script, finish_all, run_script, script_argv, start_world, wait_for_file  # noqa: E402

GRACE = 1.0  # stop_grace of the fault scripts
DEFAULT_GRACE = 10.0  # actorch.run's default, used by the other scripts


@dataclass
class Fault:
    name: str
    bound: float
    measure: Callable[[Path], tuple[float, int]]
    """Runs the fault once in a fresh temporary folder; returns (seconds measured, messages lost)."""


def lost_unless_error(*outcomes: dict[str, Any] | None) -> int:
    return sum(1 for outcome in outcomes if outcome is None or "error" not in outcome)


def node_lost(mode: str) -> Callable[[Path], tuple[float, int]]:
    def measure(tmp: Path) -> tuple[float, int]:
        run = run_script("node_lost.py", mode, str(tmp), timeout=75)
        r = run.result("node_lost")
        return r["pending"]["since_kill"], lost_unless_error(r["pending"], r["new_call"]) + (run.returncode != 0)

    return measure


def partition(which: str) -> Callable[[Path], tuple[float, int]]:
    def measure(tmp: Path) -> tuple[float, int]:
        import netns  # noqa: PLC0415 - only where namespaces can be made
        from test_network_partition import run_partitioned  # noqa: PLC0415

        with netns.host_pair() as pair:
            run = run_partitioned(pair, tmp, "cut")
        r = run.rank0.result("partition")
        lost = lost_unless_error(r["pending"], r["new_call"])
        if which == "worker exits":
            return run.rank1.ended_at - run.partitioned_at, lost + (run.rank1.returncode != 1)
        return r["pending"]["since_partition"], lost

    return measure


def stuck(key: str) -> Callable[[Path], tuple[float, int]]:
    def measure(tmp: Path) -> tuple[float, int]:
        run = run_script("faults.py", "stuck", str(tmp), timeout=75)
        r = run.result("stuck")
        if key == "shutdown":
            return run.result("shutdown")["seconds"], run.returncode != 0
        return r[key], lost_unless_error(r["forever_outcome"])

    return measure


def blocked_local(tmp: Path) -> tuple[float, int]:
    run = run_script("faults.py", "blocked", str(tmp), timeout=75)
    return run.result("shutdown")["seconds"], run.returncode != 0


def blocked_watchdog(tmp: Path) -> tuple[float, int]:
    leader, worker = finish_all(start_world("member.py", 2, "blocked", str(tmp)), timeout=60)
    return worker.ended_at - leader.ended_at, (leader.returncode, worker.returncode) != (0, 1)


def rank0_killed(tmp: Path) -> tuple[float, int]:
    script = Script(script_argv("faults.py", "rank0", str(tmp)))
    try:
        wait_for_file(tmp / "ready", script, timeout=60)
        pids = json.loads((tmp / "ready").read_text())
        killed = time.monotonic()
        script.signal_leader(signal.SIGKILL)
        while not all(gone(pid) for pid in pids) and time.monotonic() < killed + 30:
            time.sleep(0.01)
        took = time.monotonic() - killed
        script.finish(timeout=10)
    finally:
        script.kill()
    return took, sum(not (tmp / f"on_stop_rank{rank}").exists() for rank in (1, 2))


def stale(tmp: Path) -> tuple[float, int]:
    ranks = start_world("member.py", 2, "stale", str(tmp))
    try:
        wait_for_file(tmp / "ready", ranks[0], timeout=60)
        pid = int((tmp / "ready").read_text())
        os.kill(pid, signal.SIGSTOP)
        time.sleep(4.0)
        continued = time.monotonic()
        os.kill(pid, signal.SIGCONT)
        (tmp / "continued").write_text("continued\n")
        worker = ranks[1].finish(timeout=30)
        leader = ranks[0].finish(timeout=30)
    finally:
        for rank in ranks:
            rank.kill()
    return worker.ended_at - continued, lost_unless_error(leader.result("lost")["outcome"]) + (worker.returncode != 1)


def expelled(tmp: Path) -> tuple[float, int]:
    leader, worker = finish_all(start_world("member.py", 2, "expelled", str(tmp)), timeout=60)
    lost = leader.result("lost")
    return worker.ended_at - lost["at"], lost_unless_error(lost["outcome"]) + (worker.returncode != 1)


def main_raises(tmp: Path) -> tuple[float, int]:
    run = run_script("main_raises.py", str(tmp), timeout=45)
    return run.result("raised")["seconds_after_raise"], run.returncode != 1


def ctrl_c(tmp: Path) -> tuple[float, int]:
    script = Script(script_argv("sleeper.py", str(tmp)))
    try:
        wait_for_file(tmp / "ready", script, timeout=60)
        sent = time.monotonic()
        script.signal_leader(signal.SIGINT)
        run = script.finish(timeout=30)
    finally:
        script.kill()
    return run.ended_at - sent, run.returncode == 0


def load(tmp: Path) -> tuple[float, int]:
    run = run_script("load.py", "200000", "64", "32", timeout=240)
    r = run.result("load")
    tally = r["tally"]
    unanswered = sum(caller["expected_calls"] - caller["answered_once"] for caller in r["callers"])
    return r["seconds"], sum(tally["missing"]) + tally["duplicates"] + unanswered


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


SHUTDOWN = 4 * DEFAULT_GRACE + 12.0  # docs/concepts/launching.md: what run() may take after main
FAULTS = {
    "kill": Fault("worker SIGKILLed: its pending call fails", 1.0, node_lost("pid")),
    "kill-in-handler": Fault("worker kills itself inside a handler: the call fails", 1.0, node_lost("handler")),
    "sigstop": Fault("worker SIGSTOPped (no close): its pending call fails", 3.0, node_lost("stop")),
    "partition": Fault("silent network partition: the pending call fails", 3.0, partition("call fails")),
    "partition-exit": Fault("silent network partition: the cut-off worker exits", 6.0, partition("worker exits")),
    "never-returns": Fault("handler that never returns: stop() returns", GRACE + 1.0, stuck("forever_stop_seconds")),
    "on-stop-hangs": Fault("on_stop that hangs: stop() returns", GRACE + 1.0, stuck("stop_seconds")),
    "stuck-shutdown": Fault(
        "stuck and cancellation-swallowing handlers: run() returns after main",
        4 * GRACE + 12.0,
        stuck("shutdown"),
    ),
    "blocked-local": Fault("event loop blocked on a local worker: run() returns", 2 * GRACE + 7.0, blocked_local),
    "blocked-watchdog": Fault(
        "event loop blocked under torchrun: its watchdog exits it after rank 0 left", 2 * GRACE + 5.0, blocked_watchdog
    ),
    "rank0": Fault("rank 0 SIGKILLed: every worker exits", 1.0 + GRACE + 2.0, rank0_killed),
    "stale": Fault("stale worker (SIGSTOP 4 s, SIGCONT): it exits", 2 * GRACE + 5.0, stale),
    "expelled": Fault("worker counted lost while alive: it exits", 2 * GRACE + 5.0, expelled),
    "main-raises": Fault("main raises: run() re-raises after shutdown", SHUTDOWN, main_raises),
    "ctrl-c": Fault("Ctrl-C to rank 0: the whole system exits", SHUTDOWN, ctrl_c),
    "load": Fault("100,000 calls + 100,000 tells, 64-message mailbox", 240.0, load),
}


def run_faults(names: list[str], runs: int) -> None:
    print(f"{'fault':<72} {'bound':>7} {'median':>8} {'worst':>8}  lost")
    for key in names:
        fault = FAULTS[key]
        seconds: list[float] = []
        lost = 0
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="actorch-fault-") as folder:
                try:
                    took, lost_here = fault.measure(Path(folder))
                except Exception as exc:  # report it and go on with the others
                    print(f"{fault.name:<72} failed: {type(exc).__name__}: {str(exc)[:200]}")
                    break
            seconds.append(took)
            lost += int(lost_here)
        if seconds:
            print(
                f"{fault.name:<72} {fault.bound:>6.1f}s {statistics.median(seconds):>7.2f}s "
                f"{max(seconds):>7.2f}s  {lost}",
                flush=True,
            )


# --------------------------------------------------------------------------- bad inputs


class Target(actorch.Actor):
    async def add(self, a: int, b: int = 0) -> int:
        return a + b

    async def echo(self, value: Any) -> Any:
        return value

    async def nap(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _secret(self) -> int:
        return -1


BAD_INPUTS: list[tuple[str, str, Callable[[actorch.ActorSystem, Any, Any], Any]]] = [
    ("unknown endpoint", "EndpointError", lambda system, ref, stopped: ref.call("nope")),
    ("private endpoint", "EndpointError", lambda system, ref, stopped: ref.call("_secret")),
    ("dunder endpoint", "EndpointError", lambda system, ref, stopped: ref.call("__init__")),
    ("wrong arity", "EndpointError", lambda system, ref, stopped: ref.call(Target.add, 1, 2, 3)),
    ("unknown keyword", "EndpointError", lambda system, ref, stopped: ref.call(Target.add, 1, c=3)),
    ("unserialisable argument", "SerializationError", lambda system, ref, stopped: ref.call("echo", threading.Lock())),
    ("object refused in strict mode", "SerializationError", lambda system, ref, stopped: ref.call("echo", {1, 2})),
    (
        "tensor with no faithful form (MKL-DNN)",
        "SerializationError",
        lambda system, ref, stopped: ref.call(Target.echo, torch.ones(3).to_mkldnn()),
    ),
    (
        "message over max_message_size",
        "MessageTooLargeError",
        lambda system, ref, stopped: ref.call(Target.echo, torch.zeros(2 << 20, dtype=torch.uint8)),
    ),
    ("invalid name", "InvalidNameError", lambda system, ref, stopped: system.spawn(Target, name="Bad Name!", on=1)),
    ("taken name", "NameTakenError", lambda system, ref, stopped: system.spawn(Target, name="target", on=1)),
    ("ref to a stopped actor", "ActorStoppedError", lambda system, ref, stopped: stopped.call(Target.add, 1)),
]


async def bad_inputs_main(system: actorch.ActorSystem) -> list[tuple[str, str, float, bool]]:
    ref = await system.spawn(Target, name="target", on=1)
    stopped = await system.spawn(Target, on=1)
    await stopped.stop()
    rows = []
    for what, expected, attempt in BAD_INPUTS:
        times = []
        named = True
        for _ in range(20):
            started = time.perf_counter()
            try:
                await attempt(system, ref, stopped)
            except actorch.ActorchError as exc:
                named = named and type(exc).__name__ == expected
            else:
                named = False
            times.append(time.perf_counter() - started)
        rows.append((what, expected, statistics.median(times), named and await ref.call(Target.add, 2, 3) == 5))
    for _ in range(8):
        ref.tell(Target.nap, 0.2)
    try:
        ref.tell(Target.nap, 0.2)
    except actorch.MailboxFullError:
        full = True
    else:
        full = False
    await ref.call(Target.nap, 0)
    rows.append(("tell beyond mailbox_size", "MailboxFullError", 0.0, full and await ref.call(Target.add, 2, 3) == 5))
    return rows


def run_bad_inputs() -> None:
    rows = actorch.run(bad_inputs_main, world_size=2, strict=True, max_message_size=1 << 20, mailbox_size=8)
    print(f"\n{'bad input (strict mode, actor on another node)':<48} {'error at the caller':<22} median  ok")
    for what, expected, seconds, ok in rows:
        print(f"{what:<48} {expected:<22} {seconds * 1e3:>5.2f}ms  {'yes' if ok else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS), help="these faults only (and no bad inputs)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.runs} runs of each fault\n")
    run_faults(args.only or list(FAULTS), args.runs)
    if not args.only:
        run_bad_inputs()


if __name__ == "__main__":
    main()
