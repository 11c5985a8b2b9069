"""run()'s options for long work, over real torch RPC: long handlers, rpc_timeout, setup, replies as they are ready.

The tests of a handler past the RPC timeout, of replies and of a failing set-up
read one run of ``launch_options.py shared`` (their worlds, one after the other
in one process); the others need a process of their own.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from _mp import Finished, run_script

pytestmark = [pytest.mark.multiprocess]

FIRST_USE = 200  # pytest-timeout for tests that may run the shared script


@pytest.fixture(scope="module")
def shared() -> Finished:
    """One run of ``launch_options.py shared``: long 6 2, replies, setup-fails."""
    return run_script("launch_options.py", "shared", timeout=170.0)


@pytest.mark.timeout(FIRST_USE)
def test_handler_computing_past_the_rpc_timeout_answers_and_loses_no_node(shared: Finished) -> None:
    run = shared  # the handler computes 6 s, past run(rpc_timeout=2)
    run.assert_clean_exit(0)
    assert run.returned()["long"] == {"result": "done", "seconds": pytest.approx(6.0, abs=5.0), "lost": []}, (
        run.report()
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_handler_computing_40_seconds_without_awaiting_answers_with_the_default_options() -> None:
    run = run_script("launch_options.py", "long", "40", timeout=150.0)
    run.assert_clean_exit(0)
    returned = run.returned()
    assert returned["result"] == "done", run.report()
    assert returned["lost"] == [], run.report()


@pytest.mark.timeout(120)
def test_setup_runs_on_every_node_before_its_actors_are_built() -> None:
    run = run_script("launch_options.py", "setup", timeout=90.0)
    run.assert_clean_exit(0)
    returned = run.returned()
    for flavour, world_size in (("sync", 3), ("async", 2)):
        nodes = returned[flavour]["nodes"]
        assert [node["marker"] for node in nodes] == [f"set up on {rank}" for rank in range(world_size)]
        for node in nodes:
            torch.manual_seed(1000 + node["rank"])
            assert node["draw"] == pytest.approx(torch.rand(1).item()), (flavour, node)
    # tune_gc (on for "sync"): what lived once each node had started is out of the collector's reach,
    # and the young and the old generations are collected less often; off, a fresh worker keeps Python's defaults
    tuned = returned["sync"]["nodes"]
    assert all(node["frozen"] > 10_000 and (node["young"], node["old"]) == (3_000, 100) for node in tuned), returned
    assert returned["async"]["nodes"][1]["frozen"] == 0, returned["async"]  # rank 0 ran the first world too
    assert (returned["async"]["nodes"][1]["young"], returned["async"]["nodes"][1]["old"]) == (700, 10), returned


@pytest.mark.timeout(FIRST_USE)
def test_setup_that_raises_on_a_worker_stops_the_system_from_starting(shared: Finished) -> None:
    run = shared
    run.assert_clean_exit(0)
    failed = run.returned()["setup-fails"]["failed"]
    assert failed["type"] == "RuntimeError"
    assert failed["message"] == "actor system failed to start: actorch-node1 exited with code 1"


@pytest.mark.timeout(FIRST_USE)
def test_replies_to_calls_sent_together_leave_as_each_is_ready_on_either_lane(shared: Finished) -> None:
    run = shared
    run.assert_clean_exit(0)
    for lane, returned in run.returned()["replies"].items():
        spans, arrived = returned["spans"], returned["arrived"]
        # the clock is the machine's: each reply reached the caller before the handler after next began
        assert arrived[0] < spans[2][0], (lane, returned)
        assert arrived == sorted(arrived)
        sent = returned["lane_bundles"]
        if lane == "lane":
            assert min(sent) > 0, f"both nodes send on the fast lane: {sent}"
        else:
            assert sent == [0, 0], "fast_lane=False: everything goes through torch RPC"


@pytest.mark.timeout(150)
def test_log_level_reaches_every_node_and_a_second_run_in_the_process_takes_its_own() -> None:
    run = run_script("launch_options.py", "log-level", timeout=120.0)
    run.assert_clean_exit(0)
    returned = run.returned()
    assert (returned["debug"], returned["error"]) == (2, 2), returned
    assert returned["loud"] == (
        "log_level must be one of 'debug', 'info', 'warning', 'error', 'critical' (in any case), "
        "or None for $ACTORCH_LOG_LEVEL (else 'warning'), not 'loud'"
    )
    _, at_debug, at_error = re.split(r"^RUN AT \w+$", run.stderr, flags=re.MULTILINE)
    for text, nodes in ((at_debug, [0, 1]), (at_error, [])):
        entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        failed = [entry for entry in entries if entry["event"] == "handler failed"]
        assert sorted(entry["node"] for entry in failed) == nodes, run.report()
        assert all(entry["level"] == "debug" for entry in failed)
