"""Elastic systems over real torch RPC: joining from other processes, leaving, dying, coming back, tokens, churn.

The tests of growing, of churn and of an agent's observers read one shared
run of ``tests/mp_scripts/elastic.py shared`` (a system start costs seconds per
process); the token test runs its own mode, whose system ends with a join racing
its shutdown. Rank 0 starts the joiners itself with ``python joiner.py`` and the system's address and token in
their environment, as a user would. Every joiner carries the run's marker, so
the clean-exit check also finds a joiner left behind.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from _mp import Finished, pid_gone, run_script

pytestmark = pytest.mark.multiprocess

FIRST_USE = 300  # pytest-timeout for tests that may run the shared script


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """One run of ``elastic.py shared``: grow, churn and agent, one after the other in one system."""
    return run_script("elastic.py", "shared", str(tmp_path_factory.mktemp("elastic")), timeout=270)


@pytest.mark.timeout(FIRST_USE)
def test_nodes_join_leave_gracefully_die_and_come_back(shared: Finished) -> None:
    run = shared
    run.assert_clean_exit(0)

    joined = run.result("joined")
    rank_a, rank_b = sorted(joined["ranks"])
    assert (rank_a, rank_b) == (2, 3)  # fresh ranks after the launch's own two
    assert {label for _, label in joined["nodes"]} == {None, "a", "b"}
    assert joined["world_size"] == 4

    spawned = run.result("spawned")
    assert spawned["where_a"][1] == spawned["pids"][str(spawned["where_a"][0])]  # it runs in the joiner's process
    assert spawned["from_old_node"] == spawned["where_a"]  # node 1 resolves a newcomer's name
    assert spawned["from_new_node"][0] == 1  # and a newcomer resolves an old node's
    assert spawned["events"] == ["NodeJoined"]

    left = run.result("left")
    assert left["running"]["value"] == "slept 0.5"  # the running call finished
    assert left["told"] == ["queued"]  # the queued tell was handled before the actor stopped
    assert left["on_stop"] == "1"  # on_stop ran, after the tell
    assert left["stuck"]["error"]["type"] == "ActorStoppedError"  # what outlasted stop_grace
    assert left["call_after"]["error"]["type"] == "ActorStoppedError"
    assert "left the system" in left["call_after"]["error"]["message"]
    assert left["spawn_after"]["error"]["type"] == "PlacementError"
    assert "work/a" not in left["names"]
    assert len(left["nodes"]) == 3
    assert left["lost"] == []
    assert left["world_size"] == 3
    assert left["exit_code"] == 0
    assert left["events"][-1] == "NodeLeft"
    assert "NodeLost" not in left["events"]
    assert left["seconds"] < 10

    killed = run.result("killed")
    assert killed["names"] == []  # the killed node's name vanished
    assert killed["call_after"]["error"]["type"] == "NodeLostError"
    assert killed["old_still_answers"][0] == 1
    assert killed["events"][-1] == "NodeLost"

    again = run.result("rejoined")
    assert again["rank"] > max(rank_a, rank_b)  # ranks are never reused
    assert again["where"][0] == again["rank"]
    assert again["from_old_node"] == again["where"]
    assert again["events"] == ["NodeJoined"]

    terminated = run.result("terminated")
    assert terminated["exit_code"] == 0  # SIGTERM made it leave, not die
    assert terminated["on_stop"] == "0"
    assert terminated["names"] == []
    assert terminated["call_after"]["error"]["type"] == "ActorStoppedError"
    assert again["rank"] not in terminated["nodes"]
    assert terminated["events"] == ["NodeJoined", "NodeLeft"]


@pytest.mark.timeout(120)
def test_a_wrong_or_missing_token_is_refused_and_a_join_racing_shutdown_ends(tmp_path: Path) -> None:
    run = run_script("elastic.py", "tokens", str(tmp_path), timeout=90)
    run.assert_clean_exit(0)
    refused = run.result("refused")
    assert refused["codes"] == {"wrong": 3, "missing": 3}
    assert refused["outputs"]["wrong"].startswith("JOINERROR the system refused this node: wrong join token")
    assert "no join token (set ACTORCH_JOIN_TOKEN)" in refused["outputs"]["missing"]
    assert "Traceback" not in refused["outputs"]["wrong"] + refused["outputs"]["missing"]
    assert refused["nodes"] == [0]  # neither got in
    assert refused["join_env"] == ["ACTORCH_ADDRESS", "ACTORCH_JOIN_TOKEN"]
    assert run.stderr.count('"event": "node refused"') == 2
    assert "wrong join token" in run.stderr
    assert "not-the-token" not in run.stderr

    misuse = run.result("misuse")
    assert misuse["leave_rank0"]["error"]["type"] == "ValueError"
    assert misuse["leave_unknown"]["error"]["type"] == "ValueError"

    # The late joiner asked as rank 0 began to end: it was refused, or let in just before and ended with the system.
    pid = int((tmp_path / "late.pid").read_text())
    deadline = time.monotonic() + 25
    while not pid_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not pid_gone(pid):
        os.kill(pid, 9)
        pytest.fail("a joiner racing the shutdown was still waiting 25 s later")
    late = (tmp_path / "late.out").read_text()
    assert "JOINERROR" in late or late == "", late
    assert "frame #" not in late  # torch's C++ stack dump is not the user's to read


@pytest.mark.timeout(FIRST_USE)
def test_no_message_is_lost_or_duplicated_while_nodes_join_and_leave(shared: Finished) -> None:
    run = shared
    run.assert_clean_exit(0)
    churn = run.result("churn")
    assert churn["answered"] == churn["received"] == 16_000
    assert churn["lost"] == 0
    assert churn["duplicated"] == 0
    assert churn["in_order"]
    assert [cycle["codes"] for cycle in churn["churned"]] == [[0, 0], [0, 0]]
    assert len({rank for cycle in churn["churned"] for rank in cycle["ranks"]}) == 4
    assert churn["nodes"] == [0, 1]


@pytest.mark.timeout(FIRST_USE)
def test_an_agent_finds_observers_on_a_node_that_joined_and_forgets_them_when_it_leaves(shared: Finished) -> None:
    run = shared
    run.assert_clean_exit(0)
    agent = run.result("agent")
    assert agent["observers"] == [2, 4, 2]
    assert agent["episodes"] == [1, 2, 3]
    assert agent["steps"] == [16, 32, 16]
    assert agent["exit_code"] == 0
