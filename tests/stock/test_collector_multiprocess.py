"""Collectors on workers and a Collection on rank 0 over real torch RPC: batches by reference on one host.

All checks share one run of ``mp_scripts/collect_shared.py`` (see ``_mp``: it
runs in its own session, a hang fails the test and no process outlives it).
"""

from __future__ import annotations

import os

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

FIRST_USE = 240  # pytest-timeout for tests that may start the shared run


@pytest.fixture(scope="module")
def shared_run() -> Finished:
    """One run of ``collect_shared.py`` (3 processes) shared by the tests of this module."""
    return run_script("collect_shared.py", timeout=150.0)


@pytest.mark.timeout(FIRST_USE)
def test_collect_shared_run_returns_and_leaves_no_process(shared_run: Finished) -> None:
    shared_run.assert_clean_exit(0)
    assert shared_run.returned() == {"main": "returned", "checks": 5}, shared_run.report()


@pytest.mark.timeout(FIRST_USE)
def test_collection_takes_batches_of_workers_on_its_host_through_shared_memory(shared_run: Finished) -> None:
    r = shared_run.result("streamed")
    assert r["intact"] == [True] * 12, "every batch is what its collector played, though leases are reused"
    assert r["by_reference"] == r["batches"] >= 12
    assert 2 <= r["files"] <= 8, "a few leases per collector (the window and one), reused"


@pytest.mark.timeout(FIRST_USE)
def test_no_shared_memory_is_left_once_the_system_has_ended(shared_run: Finished) -> None:
    pids = shared_run.result("streamed")["pids"]
    left = [name for name in os.listdir("/dev/shm") for pid in pids if name.startswith(f"actorch-{pid}-")]
    assert left == []


@pytest.mark.timeout(FIRST_USE)
def test_collection_in_wait_mode_takes_batches_through_shared_memory_too(shared_run: Finished) -> None:
    r = shared_run.result("waited")
    assert r["intact"] == [True] * 6
    assert sum(r["by_reference"]) >= 6


@pytest.mark.timeout(FIRST_USE)
def test_collector_sends_batches_by_value_to_a_reader_that_asks_for_no_handover(shared_run: Finished) -> None:
    r = shared_run.result("unasked")
    assert r["intact"] == [True, True]
    assert r["by_reference"] == 0


@pytest.mark.timeout(FIRST_USE)
def test_collection_without_shared_memory_takes_every_batch_by_value(shared_run: Finished) -> None:
    r = shared_run.result("by_value")
    assert r["intact"] == [True] * 4
    assert r["by_reference"] == 0


@pytest.mark.timeout(FIRST_USE)
def test_a_collector_refused_shared_memory_sends_by_value_and_warns_once(shared_run: Finished) -> None:
    r = shared_run.result("refused")
    assert all(r["intact"]), "nothing is lost: the refused collector's batches come by value"
    assert len(r["intact"]) >= 8
    assert r["sources"] == 2, "both collectors' batches were taken"
    (refused, by_reference, batches), (other_refused, other_by_reference, other_batches) = r["refused"]
    assert batches >= 1
    assert refused in (batches, batches + 1), "each batch played was refused its lease (the last may be given up)"
    assert by_reference == 0
    assert other_refused == 0
    assert other_by_reference == other_batches >= 1
    [warning] = shared_run.logs("shared memory refused: batches go by value")
    assert "shm_pool" in warning["why"]
    assert "--shm-size" in warning["hint"]
    assert warning["collector"]
    assert warning["node"] == 1, "the line names where it was written (add_call_context)"
    assert warning["endpoint"] == "batches"
    assert warning["call"].startswith("0x")
    assert warning["actor"].startswith("actor PidCollector#")
