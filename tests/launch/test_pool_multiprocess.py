"""Node processes on demand between real processes: added, placed on, owned by an actor, and always ended.

``mp_scripts/pool.py grow`` runs every check of one static system that grows;
``pool.py reap`` has processes leave and actors' own processes stop, twenty in
a row, and follows each until it is gone: none may stay a zombie; ``pool.py
hold`` is a one-process system that starts a node and an actor's own process,
then waits for the test to interrupt or kill it: Ctrl-C, SIGTERM and
SIGKILL of rank 0 must each leave no process behind. ``mp_scripts/agent.py``
and ``actorch serve --pool`` test the host agent across two network
namespaces where the suite may make them (root), and over loopback otherwise.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netns
import pytest
from _mp import SCRIPTS, Finished, Script, finish_all, free_port, script_argv, wait_for_file
from pool import REAP_ROUNDS

from actorch._launch.world.interrupts import TERMINATE_EXIT_CODE

pytestmark = pytest.mark.multiprocess

LEFT_WITHIN = 10.0
"""Seconds the processes a killed rank 0 started may take to notice and end (stop_grace 1 s, and the exit)."""


def pids_alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, not zombies)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


@pytest.mark.timeout(240)
def test_a_static_system_adds_nodes_places_on_them_and_gives_actors_processes_of_their_own() -> None:
    run = Script(script_argv("pool.py", "grow")).finish(200)
    run.assert_clean_exit(0)
    assert run.returned() == {"main": "returned", "checks": 4}

    placed = run.result("add_and_place")
    assert placed["static"] is False  # run(world_size=2): not elastic, but it grows
    added = placed["added"]
    assert sorted(rank for rank, *_ in added) == [2, 3]
    for _, label, _pid, parent, resources in added:
        assert (label, parent) == ("env", 0)
        assert resources["env_slots"] == 2.0
        assert resources["cpus"] >= 1
        assert resources["memory"] > 0
    assert placed["waited"] == [0, 1, 2, 3], "wait_nodes(4) returns once the added nodes joined"
    assert sorted(entry["rank"] for entry in placed["where"]) == [2, 2, 3, 3], "two env slots on each added node"
    assert {entry["env"] for entry in placed["where"]} == {"set"}, "add_nodes(env=...) reaches the new processes"
    refused = placed["full"]["error"]
    assert refused["type"] == "PlacementError"
    for part in ("node 0: label None, not 'env'", "node 1: label None", "node 2: 0 env_slots free", "held by envs/"):
        assert part in refused["message"], refused["message"]
    assert placed["again"] == 2, "the slot envs/0 held came back when it stopped"

    own = run.result("own_processes")
    assert sorted(own["ranks"]) == [4, 5]
    assert len(set(own["pids"])) == 2
    first, second = own["ranks"]  # own/0 and own/1, in the order the processes joined
    assert own["owners"] == {"0": None, "1": None, "2": None, "3": None, str(first): "own/0", str(second): "own/1"}
    assert own["schema"] == 5
    env_node = own["env_node"]
    assert env_node["parent"] == 0
    assert env_node["free"]["env_slots"] == 0.0
    assert sum(held["env_slots"] for held in env_node["held"].values()) == 2.0
    assert own["gone_from_nodes"], "an actor's own process leaves the system when the actor stops"
    assert own["child"] == {"value": 7, "seconds": own["child"]["seconds"]}, "its actor may start processes"
    print(f"two 1 s CPU-bound actors in processes of their own: {own['work_seconds']:.2f} s")  # the benchmark's figure

    left = run.result("leave")
    assert left["left"] == 2
    assert left["refused"]["error"]["type"] == "UnsupportedError", "the launch's own nodes cannot leave a static system"

    together = run.result("leave_together")
    assert [one["left"] for one in together["rounds"]] == [[None, None, None]] * 2
    gone = {rank for one in together["rounds"] for rank in one["ranks"]}
    assert len(gone) == 6
    assert not gone & set(together["live"]), "the six that left are no longer nodes of the system"
    assert run.logs("node did not hear that this one leaves") == [], (
        "nodes that joined together heard each other leave: each knew the others once add_nodes returned"
    )


REAPED_WITHIN = 3.0
"""Seconds a process that left may be seen a zombie before its parent reaps it (left alone, one stayed 30 s and more;
reaped at once, it goes within milliseconds, or a second on a saturated machine)."""


def assert_reaped(followed: dict[str, Any], what: str) -> None:
    assert followed["gone"], f"{what} was still there a minute after it left: {followed}"
    assert followed["zombie"] < REAPED_WITHIN, f"{what} stayed a zombie: {followed}"


@pytest.mark.timeout(400)
def test_processes_that_leave_are_reaped_at_once_and_stop_waits_for_an_actors_own_process() -> None:
    run = Script(script_argv("pool.py", "reap")).finish(380)
    run.assert_clean_exit(0)
    assert run.returned() == {"rounds": REAP_ROUNDS}
    reaped = run.result("reap")
    assert len(reaped["workers"]) == 2
    for followed in reaped["workers"]:
        assert_reaped(followed, "a launch worker that left an elastic system")
    for index, round_ in enumerate(reaped["rounds"]):
        assert_reaped(round_["left"], f"round {index}: an added node that left")
        assert_reaped(round_["stopped"], f"round {index}: an actor's own process")
        assert not round_["stopped"]["listed"], f"round {index}: stop() returned while the actor's node was listed"


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Script, list[int]]]:
    """``pool.py hold``, once it has started its node, its actor's own process and a third, and their pids."""
    script = Script(script_argv("pool.py", "hold", str(tmp_path)))
    try:
        wait_for_file(tmp_path / "pids", script, timeout=120)
        yield script, json.loads((tmp_path / "pids").read_text())
    finally:
        script.kill()


def assert_all_ended(run: Finished, pids: list[int]) -> None:
    assert not run.timed_out, f"the run did not end{run.report()}"
    assert not run.leftovers, f"processes were left behind{run.report()}"
    assert pids_alive(pids) == [], run.report()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("how", "code"),
    [("ctrl-c", -signal.SIGINT), ("sigterm", TERMINATE_EXIT_CODE), ("sigkill", -signal.SIGKILL)],
)
def test_processes_started_on_demand_end_with_rank_0_however_it_ends(
    held: tuple[Script, list[int]], how: str, code: int
) -> None:
    script, pids = held
    assert len(pids) == 3  # a node, an actor's own process, and a node still starting
    assert len(pids_alive(pids)) == 3
    if how == "ctrl-c":
        script.signal_group(signal.SIGINT)  # as a terminal does: every process of the group gets it
    elif how == "sigterm":
        script.signal_leader(signal.SIGTERM)
    else:
        script.signal_leader(signal.SIGKILL)
    run = script.finish(60)
    assert run.returncode == code, run.report()  # Ctrl-C: run() raised KeyboardInterrupt once all had ended
    if how == "sigkill":  # nobody leads the end: the processes notice rank 0 is gone, and end by themselves
        deadline = time.monotonic() + LEFT_WITHIN
        while pids_alive(pids) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert_all_ended(run, pids)


def agent_argv() -> list[str]:
    return [sys.executable, "-m", "actorch", "serve", "--pool", "--name", "host-b", "--resource", "b_slots=3"]


@pytest.mark.timeout(300)
def test_a_host_agent_starts_node_processes_and_actors_own_processes_on_its_host(tmp_path: Path) -> None:
    """Over two network namespaces when the suite runs as root, else both "hosts" on loopback."""
    token = {"ACTORCH_JOIN_TOKEN": "agent-test-token"}
    path = {"PYTHONPATH": f"{SCRIPTS}:{SCRIPTS.parent.parent}"}
    reason = netns.unavailable_reason()
    if reason is None:
        with netns.host_pair() as pair:
            leader = Script(
                pair.a.exec_argv(
                    script_argv("agent.py"), {"AGENT_HOST": netns.ADDRESS_A, "AGENT_PORT": "29500", **token}
                )
            )
            agent = Script(
                pair.b.exec_argv(agent_argv(), {"ACTORCH_ADDRESS": f"{netns.ADDRESS_A}:29500", **token, **path})
            )
            try:
                rank0, host_b = finish_all([leader, agent], 240)
                left_in_namespaces = pair.kill_processes()
            finally:
                leader.kill()
                agent.kill()
        assert left_in_namespaces == [], "processes were still running in the namespaces"
    else:
        port = str(free_port())
        leader = Script(script_argv("agent.py"), {"AGENT_HOST": "127.0.0.1", "AGENT_PORT": port, **token})
        agent = Script(agent_argv(), {"ACTORCH_ADDRESS": f"127.0.0.1:{port}", **token, **path})
        try:
            rank0, host_b = finish_all([leader, agent], 240)
        finally:
            leader.kill()
            agent.kill()
    rank0.assert_clean_exit(0)
    host_b.assert_clean_exit(0)
    found = rank0.result("agent")
    agent_rank, label, pool, slots = found["agent"]
    assert (label, pool, slots) == ("host-b", True, 3.0)
    assert [(parent, label) for _, parent, label in found["added"]] == [(agent_rank, "b-env")] * 2
    assert found["own_node"] == [["b/own", agent_rank]]
    assert found["where"]["placed"]["rank"] in [rank for rank, _, _ in found["added"]]
    if reason is None:  # the processes run on the other host: in host b's network namespace, not rank 0's
        assert found["where"]["own"]["netns"] != found["here"]
        assert found["where"]["placed"]["netns"] == found["where"]["own"]["netns"]
    assert "no host agent on 'host-c'" in found["unknown"]
    assert "node 1 (host-b)" in found["unknown"]
