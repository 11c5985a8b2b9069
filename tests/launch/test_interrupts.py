"""Ctrl-C and SIGTERM on a two-process system: orderly while ``main`` awaits, forced in bounded time when stuck.

Each test runs ``mp_scripts/interrupt.py`` in its own session, sends SIGINT
the way a terminal does (to rank 0, or to the whole process group), or SIGTERM
as a scheduler does, and checks the exit code, the line on stderr and that no
process is left behind.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest
from _mp import SCRIPTS, Finished, Script, script_argv, torchrun_argv, wait_for_file

from actorch._base.record import read_run, runs
from actorch._launch.world.interrupts import INTERRUPT_EXIT_CODE, TERMINATE_EXIT_CODE
from actorch._launch.world.lead import PING_WAIT

pytestmark = pytest.mark.multiprocess

GRACE = 1.0
"""The scripts' ``stop_grace``, where the test does not need a long one."""
STUCK_BOUND = GRACE + 2.0
"""The documented bound for a stuck ``main``: ``stop_grace + 1`` s to take Ctrl-C, 1 s to kill the workers."""
MARGIN = 5.0
"""Slack for a loaded two-core machine; the bounds themselves are what the docs promise."""
FORCED_LINE = f"exits with code {INTERRUPT_EXIT_CODE}"
FIRST_LINE = "actorch: Ctrl-C: stopping in order; "
"""How the line the first Ctrl-C writes at once begins."""


BLOCKED_WORKER_ENDS = "ends: handler 'block' of actor 'sleeper' (Stuck) on node 1 (running for "
"""What the worker whose loop the handler blocks says as it ends, at rank 0's word."""
ACTORCH_RUN = [sys.executable, "-m", "_actorch_cli", "run", "-n", "2"]


class Start(Protocol):
    def __call__(self, mode: str, stop_grace: float, *, torchrun: bool = False, cli: bool = False) -> Script: ...


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start ``interrupt.py MODE STOP_GRACE`` and wait until its world is up; kill what is left afterwards.

    ``torchrun``: under ``torch.distributed.run``; ``cli``: under ``actorch run -n 2``.
    """
    scripts: list[Script] = []

    def started(mode: str, stop_grace: float, *, torchrun: bool = False, cli: bool = False) -> Script:
        args = (mode, str(stop_grace), str(tmp_path))
        if cli:  # its run's record apart, for the test to read
            runs = {"ACTORCH_RUNS_DIR": str(tmp_path / "runs")}
            script = Script([*ACTORCH_RUN, str(SCRIPTS / "interrupt.py"), *args], env=runs)
        else:
            script = Script(torchrun_argv("interrupt.py", *args) if torchrun else script_argv("interrupt.py", *args))
        scripts.append(script)
        wait_for_file(tmp_path / "ready", script, timeout=60)
        return script

    try:
        yield started
    finally:
        for script in scripts:
            script.kill()


def ctrl_c(script: Script, target: str) -> float:
    """Send SIGINT as a terminal would (``group``) or to rank 0 alone; when it was sent."""
    sent = time.monotonic()
    if target == "group":
        script.signal_group(signal.SIGINT)
    else:
        script.signal_leader(signal.SIGINT)
    return sent


def assert_forced(run: Finished, reason: str) -> None:
    assert not run.timed_out, f"Ctrl-C did not end the run{run.report()}"
    assert run.returncode == INTERRUPT_EXIT_CODE, run.report()
    assert reason in run.stderr, run.report()
    assert "killed 1 local worker" in run.stderr, run.report()
    assert not run.leftovers, f"processes were left behind{run.report()}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["leader", "group"])
def test_ctrl_c_ends_a_system_whose_main_is_stuck_in_torch_within_the_bound(
    target: str, start: Start, tmp_path: Path
) -> None:
    script = start("stuck", GRACE)
    sent = ctrl_c(script, target)
    run = script.finish(timeout=60)
    assert_forced(run, f"Ctrl-C did not reach main within {GRACE + 1:g} s")
    took = run.ended_at - sent
    assert took < STUCK_BOUND + MARGIN, f"the run ended {took:.1f} s after Ctrl-C{run.report()}"
    assert not (tmp_path / "on_stop_rank1").exists(), "a forced end kills the workers; no orderly stop"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["stuck", "worker_stuck"])
def test_ctrl_c_pressed_twice_ends_a_stuck_system_at_once(mode: str, start: Start) -> None:
    # With stop_grace=30, the first Ctrl-C alone would wait 31 s for main, or 30 s for the worker's handler.
    script = start(mode, 30.0)
    ctrl_c(script, "leader")
    time.sleep(0.5)
    second = ctrl_c(script, "leader")
    run = script.finish(timeout=60)
    assert_forced(run, "actorch: a second Ctrl-C; killed 1 local worker")
    took = run.ended_at - second
    assert took < 1.0 + MARGIN, f"the run ended {took:.1f} s after the second Ctrl-C{run.report()}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["leader", "group"])
def test_first_ctrl_c_says_what_it_waits_for_and_a_blocked_worker_ends_within_stop_grace(
    target: str, start: Start, tmp_path: Path
) -> None:
    grace = 3.0  # long enough that the shutdown's whole bound (2 x 3 + 5 s) would overrun the one tested
    script = start("worker_stuck", grace)
    sent = ctrl_c(script, target)
    run = script.finish(timeout=60)
    assert not run.timed_out, f"Ctrl-C did not end the run{run.report()}"
    assert run.returncode == -signal.SIGINT, f"it ended in order, not by force{run.report()}"
    assert FORCED_LINE not in run.stderr, run.report()
    (said,) = [line for line in run.stderr.splitlines() if line.startswith(FIRST_LINE)]
    assert "waiting for handler 'block' of actor 'sleeper' (Stuck) on node 1 (running for " in said, said
    assert f"handlers get stop_grace ({grace:g} s) to end" in said, said
    assert said.endswith("; Ctrl-C again ends it now"), said
    # written at once: before rank 0 gave up on the blocked worker, stop_grace into the shutdown
    blocked = "node did not answer shutdown: its event loop is blocked"
    assert blocked in run.stderr, run.report()
    assert run.stderr.index(FIRST_LINE) < run.stderr.index(blocked), run.report()
    assert (tmp_path / "on_stop_rank0").exists(), f"rank 0's own actors stopped in order{run.report()}"
    assert not run.leftovers, f"processes were left behind{run.report()}"
    # rank 0 names the handler that blocks the worker as it kills it (the worker itself says so too, unless
    # rank 0's own kill of its local worker came first on a loaded machine)
    [killed] = run.logs("node killed")
    assert "handler 'block' of actor 'sleeper' (Stuck) on node 1" in killed["why"], killed
    took = run.ended_at - sent
    assert took < grace + PING_WAIT + 3.0, f"the run ended {took:.1f} s after Ctrl-C{run.report()}"


@pytest.mark.timeout(120)
def test_ctrl_c_under_actorch_run_ends_a_worker_blocked_in_a_handler_at_rank_0s_word_naming_the_handler(
    start: Start, tmp_path: Path
) -> None:
    # The terminal's Ctrl-C reaches torchrun's agent (actorch run) and every rank; the agent would kill a
    # rank still running 30 s later, the worker's watchdog 2 x stop_grace + 5 s after it loses rank 0.
    run = start("worker_stuck", 3.0, cli=True)
    ctrl_c(run, "group")
    finished = run.finish(timeout=60)
    assert not finished.timed_out, f"Ctrl-C did not end the run{finished.report()}"
    assert finished.returncode == INTERRUPT_EXIT_CODE, finished.report()
    assert finished.stderr.rstrip().splitlines()[-1] == "actorch run: interrupted", finished.report()
    (said,) = [line for line in finished.stderr.splitlines() if line.startswith(FIRST_LINE)]
    assert "waiting for handler 'block' of actor 'sleeper' (Stuck) on node 1" in said, said
    # rank 0 gave up on the blocked node stop_grace into the shutdown and had it end, as it kills a local worker
    assert BLOCKED_WORKER_ENDS in finished.stderr, finished.report()
    assert "did not exit within" not in finished.stderr, f"the watchdog, not rank 0, ended it{finished.report()}"
    assert (tmp_path / "on_stop_rank0").exists(), f"rank 0's own actors stopped in order{finished.report()}"
    assert not finished.leftovers, f"processes were left behind{finished.report()}"

    # The run's record reads an interruption as one, keeps the kill, and ends after the shutdown.
    (recorded,) = runs(tmp_path / "runs")
    assert (recorded.outcome, recorded.errors) == ("interrupted", 0)
    entries = read_run(recorded.path)
    events = [(entry["node"], entry["event"]) for entry in entries]
    assert (0, "main failed") not in events
    [interrupted] = [entry for entry in entries if entry["event"] == "main interrupted"]
    assert interrupted["by"] == "Ctrl-C"
    [killed] = [entry for entry in entries if entry["event"] == "node killed"]
    assert killed["peer"] == 1
    assert "handler 'block' of actor 'sleeper' (Stuck) on node 1" in killed["why"]
    assert events.index((0, "main interrupted")) < events.index((0, "node killed")) < events.index((0, "run ended"))
    [stopped] = [entry for entry in entries if entry["event"] == "actor stopped" and entry["node"] == 0]
    assert (stopped["statistics"]["handled"], stopped["statistics"]["hooks"]) == (0, {"on_start": 1, "on_stop": 1})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["leader", "group"])
def test_ctrl_c_while_main_awaits_still_shuts_the_system_down_in_order(
    target: str, start: Start, tmp_path: Path
) -> None:
    script = start("awaiting", GRACE)
    sent = ctrl_c(script, target)
    run = script.finish(timeout=60)
    assert not run.timed_out, f"Ctrl-C did not end the run{run.report()}"
    # KeyboardInterrupt left run(), the script re-raised it, and Python ended by SIGINT
    assert run.returncode == -signal.SIGINT, run.report()
    assert run.result("interrupted")["type"] == "KeyboardInterrupt"
    assert FORCED_LINE not in run.stderr, run.report()
    assert not run.leftovers, f"processes were left behind{run.report()}"
    for rank in (0, 1):
        assert (tmp_path / f"on_stop_rank{rank}").exists(), f"on_stop on rank {rank} did not run{run.report()}"
    took = run.ended_at - sent
    assert took < 4 * GRACE + 12.0 + MARGIN, f"the shutdown took {took:.1f} s{run.report()}"


@pytest.mark.timeout(150)
def test_ctrl_c_under_torchrun_forces_a_stuck_rank_0_and_the_worker_follows(start: Start, tmp_path: Path) -> None:
    # torchrun's agent takes the terminal's Ctrl-C and sends SIGINT once to every rank's process group
    agent = start("stuck", GRACE, torchrun=True)
    sent = ctrl_c(agent, "leader")
    run = agent.finish(timeout=90)
    assert not run.timed_out, f"Ctrl-C did not end the run{run.report()}"
    assert f"Ctrl-C did not reach main within {GRACE + 1:g} s" in run.stderr, run.report()
    # the worker ignores SIGINT, loses rank 0 and shuts itself down in order
    assert "rank 0 was lost; this node shut down" in run.stderr, run.report()
    assert (tmp_path / "on_stop_rank1").exists(), f"on_stop on rank 1 did not run{run.report()}"
    assert run.returncode != 0, "an interrupted run must not report success"
    assert not run.leftovers, f"processes were left behind{run.report()}"
    took = run.ended_at - sent
    # rank 0's bound, then a worker's for losing rank 0 (1 s + stop_grace + 2 s)
    assert took < STUCK_BOUND + GRACE + 3.0 + MARGIN, f"the run ended {took:.1f} s after Ctrl-C{run.report()}"


@pytest.mark.timeout(150)
def test_ctrl_c_under_torchrun_while_main_awaits_stops_every_rank_in_order(start: Start, tmp_path: Path) -> None:
    agent = start("awaiting", GRACE, torchrun=True)
    ctrl_c(agent, "leader")
    run = agent.finish(timeout=90)
    assert not run.timed_out, f"Ctrl-C did not end the run{run.report()}"
    assert FORCED_LINE not in run.stderr, f"the agent's one SIGINT must not count as Ctrl-C twice{run.report()}"
    assert run.result("interrupted")["type"] == "KeyboardInterrupt"
    for rank in (0, 1):
        assert (tmp_path / f"on_stop_rank{rank}").exists(), f"on_stop on rank {rank} did not run{run.report()}"
    assert not run.leftovers, f"processes were left behind{run.report()}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["leader", "group"])
def test_sigterm_to_rank_0_stops_every_actor_in_order(target: str, start: Start, tmp_path: Path) -> None:
    # A scheduler signals rank 0 (a container's first process), or every process of the job (SLURM).
    script = start("awaiting", GRACE)
    if target == "group":
        script.signal_group(signal.SIGTERM)
    else:
        script.signal_leader(signal.SIGTERM)
    run = script.finish(timeout=4 * GRACE + 12.0 + MARGIN)  # the orderly shutdown's bound
    assert not run.timed_out, f"SIGTERM did not end the run{run.report()}"
    assert run.returncode == TERMINATE_EXIT_CODE, run.report()
    assert "exits with code" not in run.stderr, f"the run was ended by force{run.report()}"
    assert "Traceback" not in run.stderr, run.report()
    for rank in (0, 1):
        assert (tmp_path / f"on_stop_rank{rank}").exists(), f"on_stop on rank {rank} did not run{run.report()}"
    assert not run.leftovers, f"processes were left behind{run.report()}"
