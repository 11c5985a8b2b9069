"""Collectors on workers and a Collection on rank 0 over real torch RPC: batches by reference on one host.

All checks share one run of ``mp_scripts/collect_shared.py`` (see ``_mp``: it
runs in its own session, a hang fails the test and no process outlives it).
"""

from __future__ import annotations

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
    assert shared_run.returned() == {"main": "returned", "checks": 3}, shared_run.report()


@pytest.mark.timeout(FIRST_USE)
def test_collection_takes_batches_of_workers_on_its_host_through_shared_memory(shared_run: Finished) -> None:
    r = shared_run.result("streamed")
    assert r["intact"] == [True] * 12, "every batch is what its collector played, though slots are reused"
    assert r["by_reference"] == r["batches"] >= 12
    assert 2 <= r["files"] <= 6, "a few slots per collector (the window and one), reused round robin"
    assert r["left"] == [], "the slots went with the collectors"


@pytest.mark.timeout(FIRST_USE)
def test_collection_in_wait_mode_takes_batches_through_shared_memory_too(shared_run: Finished) -> None:
    r = shared_run.result("waited")
    assert r["intact"] == [True] * 6
    assert sum(r["by_reference"]) >= 6


@pytest.mark.timeout(FIRST_USE)
def test_collector_sends_batches_by_value_to_a_reader_on_another_host(shared_run: Finished) -> None:
    r = shared_run.result("elsewhere")
    assert r["intact"] == [True, True]
    assert r["by_reference"] == 0
