"""Group calls over real torch RPC: rank 0 plus two spawned workers, one group member on each.

All checks share one run of ``mp_scripts/group_basics.py`` (see ``_mp``: it runs
in its own session, a hang fails the test and no process outlives it).
"""

from __future__ import annotations

from typing import Any

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

RUN_TIMEOUT = 150.0
FIRST_USE = 240  # pytest-timeout for tests that may start the shared run


@pytest.fixture(scope="module")
def group_run() -> Finished:
    """One run of ``group_basics.py`` (3 processes) shared by the tests of this module."""
    return run_script("group_basics.py", timeout=RUN_TIMEOUT)


def mro_of(error: dict[str, Any]) -> list[str]:
    mro: list[str] = error["mro"]
    return mro


@pytest.mark.timeout(FIRST_USE)
def test_group_run_returns_and_leaves_no_process(group_run: Finished) -> None:
    group_run.assert_clean_exit(0)
    assert group_run.returned() == {"main": "returned", "checks": 6}, group_run.report()


@pytest.mark.timeout(FIRST_USE)
def test_group_call_reaches_every_rank_in_member_order(group_run: Finished) -> None:
    r = group_run.result("fan_out")
    assert [tag for tag, _, _ in r["where"]] == [0, 1, 2]
    assert [rank for _, rank, _ in r["where"]] == [0, 1, 2]
    pids = [pid for _, _, pid in r["where"]]
    assert pids[0] == r["main_pid"]
    assert len(set(pids)) == 3, "each member runs in its own process"
    assert r["by_name"] == [0, 1, 2]
    assert r["repr"] == "<ActorGroup of 3: actor 'fan/0' on node 0, actor 'fan/1' on node 1, actor 'fan/2' on node 2>"


@pytest.mark.timeout(FIRST_USE)
def test_group_call_runs_members_concurrently_across_processes(group_run: Finished) -> None:
    r = group_run.result("concurrent")
    assert r["tags"] == [0, 1, 2], "each member waits for the others: the calls must run at the same time"
    assert r["seconds"] < 5.0


@pytest.mark.timeout(FIRST_USE)
def test_group_tell_reaches_every_rank_and_partitioned_tell_sends_shares(group_run: Finished) -> None:
    r = group_run.result("tell")
    assert r["plain"] == [list(range(20))] * 3
    assert r["shares"] == [[[0]], [[1]], []]


@pytest.mark.timeout(FIRST_USE)
def test_partitioned_call_splits_and_reduces_across_processes(group_run: Finished) -> None:
    r = group_run.result("partition_reduce")
    assert r["close"] is True, f"loss {r['loss']} != whole-batch loss {r['expected']}"
    assert r["rows"] == [4, 3, 3]
    assert len(set(r["pids"])) == 3
    assert r["total"] == {"rows": 10, "sum": float(sum(range(20)))}


@pytest.mark.timeout(FIRST_USE)
def test_group_error_across_processes_names_members_and_keeps_results(group_run: Finished) -> None:
    r = group_run.result("errors")
    assert r["failed_members"] == [1, 2]
    assert r["first"] == 0
    refused, stopped = r["errors"]
    assert {"RemoteError", "ValueError"} <= set(mro_of(refused))
    assert refused["message"] == "worker 1 refuses"
    assert "ActorStoppedError" in mro_of(stopped)
    assert r["message"].startswith(
        "2 of 3 calls to 'fail_if' failed: member 1 (actor 'err/1' on node 1): ValueError: worker 1 refuses; "
        "member 2 (actor 'err/2' on node 2): ActorStoppedError: cannot call 'fail_if' of "
    )
    remote_note, member_note = r["notes"][0]
    assert remote_note.startswith("Raised in 'fail_if' of actor 'err/1' (")
    assert member_note == "in member 1 (actor 'err/1' on node 1), one of the calls to 'fail_if'"
    assert r["notes"][1] == ["in member 2 (actor 'err/2' on node 2), one of the calls to 'fail_if'"]


@pytest.mark.timeout(FIRST_USE)
def test_group_call_deadline_cancels_members_on_every_rank(group_run: Finished) -> None:
    r = group_run.result("deadline")
    assert "TimeoutError" in mro_of(r["outcome"]["error"])
    assert r["seconds"] < 3.0
    assert r["histories"] == [["started", "cancelled"]] * 3
