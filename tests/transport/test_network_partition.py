"""A silent network partition between two hosts: a worker cut off without a close is lost in bounded time.

The two hosts are Linux network namespaces joined by a veth pair (see
``netns``); rank 0 runs in one, rank 1 in the other, each started the way
torchrun starts a script on its machine (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Then every packet between them is dropped, without a FIN or an
RST: only actorch's heartbeats can tell. The same two hosts also carry one
multi-host join (a node on host b joins an elastic system on host a) and the
walk-through of docs/multi-host.md (``actorch run`` on each host). The tests
skip where namespaces cannot be made (not root, no CAP_SYS_ADMIN, no iproute2).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netns
import pytest
from _mp import SCRIPTS, Finished, Script, finish_all, script_argv

pytestmark = pytest.mark.multiprocess

PARTITION_BOUND = 3.0
"""Seconds within which a silent peer is lost (liveness_timeout 2.5 s by default, heartbeats every 0.5 s)."""
STOP_GRACE = 10.0
"""``actorch.run``'s default ``stop_grace``: how long a stopping worker lets a told handler finish."""
EXIT_SLACK = 3.0
"""Seconds a worker may take, past the loss (and any grace), to stop its actors, leave torch RPC and exit.

Handlers serving calls of the lost rank 0 are cancelled at once (nobody waits
for them); only told work gets ``stop_grace``.
"""
LOST_CONTROLLER_EXIT_CODE = 1
"""A worker's exit code when it ended because rank 0 was lost (0 is for an orderly end led by rank 0)."""
SHUTDOWN_BOUND = 5.0
"""Seconds ``actorch.run`` may take on rank 0 to return after ``main`` did."""
MASTER_PORT = 29500  # each run has fresh namespaces: nothing else can hold the port there
START_TIMEOUT = 60.0
RUN_TIMEOUT = 45.0
TEST_TIMEOUT = 180  # pytest-timeout: a start, a wait for the loss and both ends, and the leftover checks


@pytest.fixture(scope="module")
def can_make_namespaces() -> None:
    reason = netns.unavailable_reason()
    if reason is not None:
        pytest.skip(f"no network namespaces for a partition test: {reason}")


@pytest.fixture
def pair(can_make_namespaces: None) -> Iterator[netns.HostPair]:
    with netns.host_pair() as hosts:
        yield hosts


@dataclass
class PartitionRun:
    """What the two ranks did around the partition, and what the link saw."""

    rank0: Finished
    rank1: Finished
    partitioned_at: float
    counters_at_partition: list[dict[str, int]]
    counters_at_end: list[dict[str, int]]
    """Packet counters of both veth ends when the link was cut and when it was healed (or at the end)."""
    dropped: list[int]
    """Packets each end's partition qdisc dropped."""
    left_in_namespaces: list[int]

    def report(self) -> str:
        return self.rank0.report() + self.rank1.report()

    def rank1_at(self, check: str) -> float:
        """Seconds from the partition to ``check`` of rank 1 (its ``at`` time)."""
        at: float = self.rank1.result(check)["at"]
        return at - self.partitioned_at


def rank_env(rank: int) -> dict[str, str]:
    """What torchrun would set for ``rank``, and nothing more.

    actorch itself makes TensorPipe and Gloo listen on the interface that routes
    to MASTER_ADDR (the veth); left to themselves they would take the address
    the host name resolves to, loopback here, and the other host could not
    reach it.
    """
    return {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": netns.ADDRESS_A,
        "MASTER_PORT": str(MASTER_PORT),
    }


def wait_for(path: Path, scripts: list[Script], timeout: float) -> None:
    """Wait until a script writes ``path``; fail early if a rank exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        exited = [script for script in scripts if script.proc.poll() is not None]
        if exited or time.monotonic() >= deadline:
            reports = "".join(script.finish(5).report() for script in scripts)
            why = "a rank exited" if exited else f"{timeout} s passed"
            raise AssertionError(f"{why} before {path.name} was written{reports}")
        time.sleep(0.01)


def run_partitioned(pair: netns.HostPair, tmp_path: Path, mode: str) -> PartitionRun:
    """Start rank 0 on host a and rank 1 on host b, cut the link under a pending call, and collect both.

    In ``heal`` mode the link comes back once each rank has lost the other,
    while rank 1 is still stopping (it lets its handlers run for ``stop_grace``).
    """
    scripts = [
        Script(host.exec_argv(script_argv("partition.py", mode, str(tmp_path)), rank_env(rank)))
        for rank, host in enumerate(pair.hosts)
    ]
    try:
        wait_for(tmp_path / "pending", scripts, START_TIMEOUT)
        partitioned_at = pair.partition()
        counters_at_partition = [host.counters() for host in pair.hosts]
        (tmp_path / "partitioned").write_text(repr(partitioned_at))
        if mode == "heal":
            wait_for(tmp_path / "lost", scripts, RUN_TIMEOUT)
            wait_for(tmp_path / "rank1_lost", scripts, RUN_TIMEOUT)
            counters_at_end = [host.counters() for host in pair.hosts]
            dropped = [host.dropped() for host in pair.hosts]
            pair.heal()
            (tmp_path / "healed").write_text(repr(time.monotonic()))
            rank0, rank1 = finish_all(scripts, RUN_TIMEOUT)
        else:
            rank0, rank1 = finish_all(scripts, RUN_TIMEOUT)
            counters_at_end = [host.counters() for host in pair.hosts]
            dropped = [host.dropped() for host in pair.hosts]
        left_in_namespaces = pair.kill_processes()
    finally:
        for script in scripts:
            script.kill()
    return PartitionRun(
        rank0, rank1, partitioned_at, counters_at_partition, counters_at_end, dropped, left_in_namespaces
    )


def error_of(outcome: dict[str, Any], run: PartitionRun) -> dict[str, Any]:
    assert "error" in outcome, f"expected an exception, got {outcome}{run.report()}"
    error: dict[str, Any] = outcome["error"]
    return error


def assert_rank0_lost_rank1_in_time(run: PartitionRun) -> dict[str, Any]:
    """The pending call failed with NodeLostError naming node 1 within the bound; rank 0 ended cleanly."""
    run.rank0.assert_clean_exit(0)
    assert run.rank0.returned() == "main finished"
    ready = run.rank0.result("ready")
    assert ready["pending_done"] is False, "the call must still be pending when the link is cut"
    assert ready["remote"][0] == 1
    assert ready["listed"] == ["partition/local", "partition/remote"]
    r = run.rank0.result("partition")
    pending = error_of(r["pending"], run)
    assert "NodeLostError" in pending["mro"], f"expected NodeLostError, got {pending}"
    assert "node 1" in pending["message"]
    assert "not heard from" in pending["message"], "only the heartbeats can tell a silent partition"
    since = r["pending"]["since_partition"]
    assert since <= PARTITION_BOUND, f"the pending call failed {since:.2f} s after the partition{run.report()}"
    assert since > 1.0, f"the call failed {since:.2f} s after the cut: before the liveness timeout could pass"
    assert list(r["lost_nodes"]) == ["1"]
    shutdown = run.rank0.result("shutdown")
    assert shutdown["seconds"] < SHUTDOWN_BOUND, f"run() took {shutdown['seconds']:.1f} s to return after main"
    return r


def assert_rank1_ended_by_itself(run: PartitionRun, grace: float = 0.0) -> None:
    """Rank 1 lost rank 0 within the bound and exited by itself, ``grace`` plus a bound later, with code 1."""
    assert not run.rank1.timed_out, f"rank 1 did not exit by itself and was killed{run.report()}"
    assert run.rank1.returncode == LOST_CONTROLLER_EXIT_CODE, f"rank 1 exited with {run.rank1.returncode}{run.report()}"
    assert not run.rank1.leftovers, f"rank 1 left processes behind{run.report()}"
    lost = run.rank1_at("rank1_lost_controller")
    assert lost <= PARTITION_BOUND, f"rank 1 lost rank 0 {lost:.2f} s after the partition{run.report()}"
    assert "not heard from" in run.rank1.result("rank1_lost_controller")["why"]
    run.rank1.result("rank1_run_ended")
    exited = run.rank1.ended_at - run.partitioned_at
    bound = PARTITION_BOUND + grace + EXIT_SLACK
    assert exited < bound, f"rank 1 exited {exited:.1f} s after the partition (bound {bound:g} s){run.report()}"
    assert run.left_in_namespaces == [], f"processes were still running in the namespaces{run.report()}"


@pytest.mark.timeout(TEST_TIMEOUT)
def test_silent_partition_loses_the_cut_off_worker_in_bounded_time_on_both_sides(
    pair: netns.HostPair, tmp_path: Path
) -> None:
    run = run_partitioned(pair, tmp_path, "cut")
    r = assert_rank0_lost_rank1_in_time(run)
    new_call = error_of(r["new_call"], run)
    assert "NodeLostError" in new_call["mro"]
    assert "node 1" in new_call["message"]
    assert r["new_call"]["seconds"] < 0.1, "a call to a lost node must fail at once"
    assert "error" not in r["new_tell"], "a tell to a lost node is logged, not raised"
    assert r["listed"] == ["partition/local"], "the lost node's names must disappear"
    assert_rank1_ended_by_itself(run)
    assert run.rank1.result("rank1_hang_cancelled"), "rank 1 must cancel the handler rank 0 no longer waits for"
    assert run.counters_at_end == run.counters_at_partition, "a packet (an exiting rank's FIN or RST too) got across"
    assert all(dropped > 0 for dropped in run.dropped), f"both ends must have tried to send: {run.dropped}"


@pytest.mark.timeout(TEST_TIMEOUT)
def test_partition_healed_after_the_loss_keeps_the_worker_lost_and_both_sides_end(
    pair: netns.HostPair, tmp_path: Path
) -> None:
    run = run_partitioned(pair, tmp_path, "heal")
    r = assert_rank0_lost_rank1_in_time(run)
    assert r["healed_at"] is not None
    new_call = error_of(r["new_call"], run)
    assert "NodeLostError" in new_call["mro"], "a lost node stays lost when its link comes back"
    assert r["listed"] == ["partition/local"], "a lost node's names must not come back with its link"
    assert_rank1_ended_by_itself(run, grace=STOP_GRACE)
    assert run.rank1_at("rank1_run_ended") > r["healed_at"] - run.partitioned_at, "rank 1 must still run at the heal"
    assert run.counters_at_end == run.counters_at_partition, "a packet crossed the partition before the heal"


def finish_on_hosts(pair: netns.HostPair, scripts: list[Script]) -> tuple[list[Finished], list[int]]:
    """Collect scripts started in the namespaces (killing what outlives the bound), and what still ran there."""
    try:
        finished = finish_all(scripts, RUN_TIMEOUT + START_TIMEOUT)
        return finished, pair.kill_processes()
    finally:
        for script in scripts:
            script.kill()


@pytest.mark.timeout(TEST_TIMEOUT)
def test_a_node_joins_an_elastic_system_from_the_other_host(pair: netns.HostPair, tmp_path: Path) -> None:
    """Rank 0 on host a listens on its veth address; ``actorch.serve`` on host b joins it and hosts an actor."""
    token = {"ACTORCH_JOIN_TOKEN": "two-hosts-token"}
    leader = Script(
        pair.hosts[0].exec_argv(
            script_argv("elastic.py", "remote", str(tmp_path)),
            {"ELASTIC_HOST": netns.ADDRESS_A, "ELASTIC_PORT": str(MASTER_PORT), **token},
        )
    )
    joiner = Script(
        pair.hosts[1].exec_argv(
            script_argv("joiner.py", "host-b", "60"), {"ACTORCH_ADDRESS": f"{netns.ADDRESS_A}:{MASTER_PORT}", **token}
        )
    )
    (rank0, rank1), left_in_namespaces = finish_on_hosts(pair, [leader, joiner])
    rank0.assert_clean_exit(0)
    rank1.assert_clean_exit(0)
    remote = rank0.result("remote")
    assert remote["rank"] == 1
    assert remote["where"][0] == 1
    assert remote["found"] == remote["where"]
    assert remote["reverse"] == remote["where"]  # host b resolves the name through rank 0's registry too
    assert left_in_namespaces == []


@pytest.mark.timeout(TEST_TIMEOUT)
def test_the_multi_host_walk_through_finds_an_actor_on_host_b_from_host_a(pair: netns.HostPair) -> None:
    """docs/multi-host.md's commands, one ``actorch run`` per host, torchrun's static rendezvous between them."""
    launchers = [
        Script(
            host.exec_argv(
                [
                    sys.executable,
                    "-m",
                    "actorch",
                    "run",
                    "-n",
                    "1",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(rank),
                    "--master-addr",
                    netns.ADDRESS_A,
                    "--master-port",
                    str(MASTER_PORT),
                    str(SCRIPTS / "two_hosts.py"),
                ]
            )
        )
        for rank, host in enumerate(pair.hosts)
    ]
    (host_a, host_b), left_in_namespaces = finish_on_hosts(pair, launchers)
    host_a.assert_clean_exit(0)
    host_b.assert_clean_exit(0)
    found = host_a.result("two_hosts")
    assert found["world_size"] == 2
    assert found["where"] == [1, found["pids"]["1"]]  # rank 1, in host b's namespace
    assert found["value"] == 42
    assert "RETURNED 'found'" in host_a.stdout
    assert left_in_namespaces == []


SILENT_LANE_BOUND = 2.5 + 0.5 + 1.0
"""Seconds within which a node whose fast lane went silent is lost: the liveness timeout, one heartbeat, slack."""


def test_a_silent_fast_lane_loses_its_node_and_fails_the_call_waiting_on_it(pair: netns.HostPair) -> None:
    # torch RPC keeps answering (pings, watches): only the lane's own connection says the link is dead.
    finished = Script(pair.hosts[0].exec_argv(script_argv("silent_lane.py"))).finish(RUN_TIMEOUT)
    result = finished.result("silent_lane")
    error = result["outcome"].get("error")
    assert error is not None, finished.report()
    assert error["type"] == "NodeLostError", finished.report()
    assert "fast lane acknowledged nothing for" in error["message"], finished.report()
    assert result["seconds"] <= SILENT_LANE_BOUND, finished.report()
    assert result["lane_bundles"] > 0
    assert list(result["lost"]) == ["1"]
