"""Injected faults, each with the bound it was promised: stuck handlers, hung ``on_stop``, stuck loops, dead rank 0.

SIGKILL and SIGSTOP of a worker mid-call are in ``test_multiprocess``; a network
partition between two namespaces is in ``test_network_partition``. Every test here also
checks that no process is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from _mp import Script, finish_all, pid_gone, run_script, script_argv, start_world, wait_for_file

pytestmark = pytest.mark.multiprocess

GRACE = 1.0  # the scripts' stop_grace
SHUTDOWN_BOUND = 2 * (2 * GRACE + 1.0) + 2.0
"""What run() may take after main returns with stuck handlers everywhere (workers, then rank 0), plus slack."""


@pytest.mark.timeout(90)
def test_stuck_handlers_and_a_hanging_on_stop_do_not_stop_a_stop_or_a_shutdown(tmp_path: Path) -> None:
    run = run_script("faults.py", "stuck", str(tmp_path), timeout=75)
    run.assert_clean_exit(0)
    r = run.result("stuck")
    assert "error" not in r["stop"], r["stop"]
    assert r["on_stop_began"] is True
    # a hanging on_stop is cancelled after stop_grace; so is a handler that never returns
    assert GRACE - 0.2 < r["stop_seconds"] < GRACE + 1.5, r
    assert GRACE - 0.2 < r["forever_stop_seconds"] < GRACE + 1.5, r
    assert "ActorStoppedError" in r["forever_outcome"]["error"]["mro"]
    shutdown = run.result("shutdown")
    assert shutdown["seconds"] < SHUTDOWN_BOUND, shutdown
    assert "tasks ignored cancellation" in run.stderr, "the stubborn handler is reported, then abandoned"
    assert (tmp_path / "on_stop_rank2").exists(), "actors beside a stuck one still stop cleanly"


@pytest.mark.timeout(90)
def test_rank_0_kills_a_local_worker_whose_event_loop_is_blocked(tmp_path: Path) -> None:
    run = run_script("faults.py", "blocked", str(tmp_path), timeout=75)
    run.assert_clean_exit(0)
    blocked_pid = run.result("blocked")["pid"]
    shutdown = run.result("shutdown")
    # rank 0 waits 2 * stop_grace + 5 s for the blocked node's answer, then kills it
    assert shutdown["seconds"] < 2 * GRACE + 5.0 + 2.0, shutdown
    assert "node did not answer shutdown" in run.stderr
    assert (tmp_path / "on_stop_rank2").exists()
    assert pid_gone(blocked_pid)


@pytest.mark.timeout(90)
def test_a_worker_whose_loop_blocks_as_its_transport_comes_up_keeps_its_heartbeat(tmp_path: Path) -> None:
    # Peers send the moment a node's torch RPC agent is up; the heartbeat must
    # not wait for that node's loop to resume its transport's start.
    run = run_script("faults.py", "slow_start", str(tmp_path), timeout=75)
    run.assert_clean_exit(0)
    r = run.result("slow_start")
    assert "value" in r["spawn"], run.report()
    assert (tmp_path / "unblocked").exists(), f"rank 1's loop was never blocked: {r}"
    assert "node lost" not in run.stderr, run.report()


@pytest.mark.timeout(90)
def test_a_worker_whose_event_loop_is_blocked_exits_at_rank_0s_word_or_through_its_watchdog(tmp_path: Path) -> None:
    ranks = start_world("member.py", 2, "blocked", str(tmp_path))
    try:
        leader, blocked = finish_all(ranks, timeout=60)
    finally:
        for rank in ranks:
            rank.kill()
    leader.assert_clean_exit(0)
    blocked.assert_clean_exit(1)
    # Rank 0's shutdown asks a thread of the node to end it, naming the handler that blocks its loop; where that
    # word does not arrive before rank 0 is gone, the watchdog ends it.
    asked = "blocks its event loop" in blocked.stderr and "which rank 0 ends without it" in blocked.stderr
    assert asked or "did not exit within 7 s after rank 0 was lost" in blocked.stderr, blocked.report()
    # the watchdog is armed when rank 0 leaves, and fires 2 * stop_grace + 5 s later
    assert blocked.ended_at - leader.ended_at < 2 * GRACE + 5.0 + 2.0, blocked.report()


@pytest.mark.timeout(90)
def test_workers_shut_themselves_down_when_rank_0_is_killed(tmp_path: Path) -> None:
    script = Script(script_argv("faults.py", "rank0", str(tmp_path)))
    try:
        wait_for_file(tmp_path / "ready", script, timeout=60)
        pids = json.loads((tmp_path / "ready").read_text())
        killed = time.monotonic()
        script.signal_leader(signal.SIGKILL)
        deadline = killed + 30
        while not all(pid_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        took = time.monotonic() - killed
        run = script.finish(timeout=10)
    finally:
        script.kill()
    assert all(pid_gone(pid) for pid in pids), f"workers outlived rank 0 by 30 s{run.report()}"
    assert took < 1.0 + GRACE + 2.0, f"workers took {took:.1f} s to go after rank 0 was killed{run.report()}"
    assert run.returncode == -signal.SIGKILL
    assert not run.leftovers, run.report()
    for rank in (1, 2):
        assert (tmp_path / f"on_stop_rank{rank}").exists(), f"on_stop on rank {rank} did not run{run.report()}"
    assert run.stderr.count("rank 0 was lost; this node shut down") == 2, run.report()


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("mode", "code"), [("ok", 0), ("fails", 1)])
def test_every_rank_exit_code_says_whether_main_failed(mode: str, code: int, tmp_path: Path) -> None:
    runs = finish_all(start_world("member.py", 2, mode, str(tmp_path)), timeout=60)
    for rank, run in enumerate(runs):
        run.assert_clean_exit(code)
        if rank == 0 and mode == "fails":
            assert "RuntimeError: main fails on purpose" in run.stderr


@pytest.mark.timeout(120)
def test_a_stale_node_is_refused_and_shuts_itself_down(tmp_path: Path) -> None:
    ranks = start_world("member.py", 2, "stale", str(tmp_path))
    try:
        wait_for_file(tmp_path / "ready", ranks[0], timeout=60)
        stale_pid = int((tmp_path / "ready").read_text())
        os.kill(stale_pid, signal.SIGSTOP)
        time.sleep(4.0)  # past the 2.5 s liveness timeout: rank 0 counts it lost
        continued = time.monotonic()
        os.kill(stale_pid, signal.SIGCONT)
        (tmp_path / "continued").write_text("continued\n")
        stale = ranks[1].finish(timeout=30)
        gone_after = stale.ended_at - continued
        leader = ranks[0].finish(timeout=30)
    finally:
        for rank in ranks:
            rank.kill()
    leader.assert_clean_exit(0)
    lost = leader.result("lost")
    assert "NodeLostError" in lost["outcome"]["error"]["mro"]
    assert lost["lost"] == [1]
    assert not stale.timed_out, stale.report()
    assert stale.returncode == 1, f"a node that lost rank 0 exits with code 1{stale.report()}"
    assert gone_after < 2 * GRACE + 5.0, f"the stale node took {gone_after:.1f} s to leave{stale.report()}"
    caller = json.loads((tmp_path / "caller.json").read_text())
    assert caller["calls"] > 0
    assert caller["ended"] is not None, "the stale node's calls must stop: lost, or cancelled with their caller"
    assert caller["ended"]["type"] in ("NodeLostError", "CancelledError"), caller
    refused = leader.result("refused")["count"]
    assert leader.stderr.count("messages refused from a lost or unknown node") == (1 if refused else 0)


@pytest.mark.timeout(90)
def test_a_node_counted_lost_while_alive_hears_so_and_leaves(tmp_path: Path) -> None:
    ranks = start_world("member.py", 2, "expelled", str(tmp_path))
    try:
        leader, stale = finish_all(ranks, timeout=60)
    finally:
        for rank in ranks:
            rank.kill()
    leader.assert_clean_exit(0)
    stale.assert_clean_exit(1)
    lost = leader.result("lost")
    assert "NodeLostError" in lost["outcome"]["error"]["mro"]
    assert "not heard from" in lost["outcome"]["error"]["message"]
    caller = json.loads((tmp_path / "caller.json").read_text())
    assert caller["ended"]["type"] in ("NodeLostError", "CancelledError"), caller
    assert "counts this node lost" in stale.stderr, stale.report()
    # it hears at once through the call it keeps pending on rank 0; a batch it sent meanwhile is refused
    refused = leader.result("refused")["count"]
    assert leader.stderr.count("messages refused from a lost or unknown node") == (1 if refused else 0)
