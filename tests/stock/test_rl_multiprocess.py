"""Agent and observers over real torch RPC: rank 0 hosts the agent, each worker an observer.

All checks share one run of ``mp_scripts/rl_play.py`` (see ``_mp``: it runs in
its own session, a hang fails the test and no process outlives it).
"""

from __future__ import annotations

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

RUN_TIMEOUT = 150.0
FIRST_USE = 240  # pytest-timeout for tests that may start the shared run


@pytest.fixture(scope="module")
def rl_run() -> Finished:
    """One run of ``rl_play.py`` (3 processes) shared by the tests of this module."""
    return run_script("rl_play.py", timeout=RUN_TIMEOUT)


@pytest.mark.timeout(FIRST_USE)
def test_rl_run_returns_and_leaves_no_process(rl_run: Finished) -> None:
    rl_run.assert_clean_exit(0)
    assert rl_run.returned() == {"main": "returned", "checks": 5}, rl_run.report()


@pytest.mark.timeout(FIRST_USE)
def test_agent_answers_observers_on_workers_with_batched_forwards_on_rank_0(rl_run: Finished) -> None:
    r = rl_run.result("batched")
    assert len(set(r["pids"])) == 2
    assert r["main_pid"] not in r["pids"], "each observer runs in its worker's process"
    assert r["observers"] == 2
    assert r["steps"] == [16, 24]
    assert r["forwards"] == [2] * 20, "one forward per step for both observers"


@pytest.mark.timeout(FIRST_USE)
def test_agent_unbatched_runs_one_forward_per_state_across_processes(rl_run: Finished) -> None:
    r = rl_run.result("plain")
    assert r["steps"] == 16
    assert r["forwards"] == [1] * 16


@pytest.mark.timeout(FIRST_USE)
def test_agent_learns_the_corridor_across_processes(rl_run: Finished) -> None:
    r = rl_run.result("learning")
    assert min(r["last"]) > r["first"], r
    assert sum(r["last"]) / len(r["last"]) >= 7.0, r


@pytest.mark.timeout(FIRST_USE)
def test_observer_spawned_later_joins_the_next_episode(rl_run: Finished) -> None:
    r = rl_run.result("joins")
    assert r["observers"] == 3
    assert r["names"] == ["rl/observers/1", "rl/observers/1b", "rl/observers/2"]
    assert r["forwards"] == [3] * 8


@pytest.mark.timeout(FIRST_USE)
def test_observer_that_breaks_fails_its_episode_then_the_others_play_on(rl_run: Finished) -> None:
    r = rl_run.result("broken")
    assert "RemoteError" in r["outcome"]["error"]["mro"]
    message = r["outcome"]["error"]["message"]
    assert message.startswith("1 of 4 calls to 'play' failed: member 3 (actor 'rl/observers/broken' on node 2)")
    assert r["after"] == 3
