"""Live nodes that are only slow are never counted lost: a late joiner, an interpreter held for seconds.

The heartbeats must tell a starved or busy node from a frozen one (stopped
nodes are in ``test_multiprocess`` and ``test_faults``): here every node
stays alive, so any node counted lost is a false loss. Both tests read one
run of ``starved.py both``: the late join as the system starts, then the held
interpreters.
"""

from __future__ import annotations

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

FIRST_USE = 150  # pytest-timeout for tests that may run the shared script


@pytest.fixture(scope="module")
def starved(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """One run of ``starved.py both``, shared by the tests of this module."""
    return run_script("starved.py", "both", str(tmp_path_factory.mktemp("starved")), timeout=120)


@pytest.mark.timeout(FIRST_USE)
def test_starved_node_joining_late_leaves_every_node_alive(starved: Finished) -> None:
    run = starved
    run.assert_clean_exit(0)
    late = run.result("late")
    assert late["lost"] == [], run.report()
    assert [outcome.get("value") for outcome in late["values"]] == [11, 12], late
    assert "node lost" not in run.stderr, run.report()


@pytest.mark.timeout(FIRST_USE)
def test_starved_node_holding_its_interpreter_while_computing_is_not_lost(starved: Finished) -> None:
    run = starved
    run.assert_clean_exit(0)
    held = run.result("held")
    assert held["worker_held"] == {"value": None, "seconds": held["worker_held"]["seconds"]}, held
    assert held["lost_after_worker"] == [], run.report()
    assert held["meanwhile"], "rank 0 must have called rank 2 while rank 1 was held"
    assert all("value" in outcome for outcome in held["meanwhile"]), held["meanwhile"]
    assert [outcome.get("value") for outcome in held["after"]] == [1, len(held["meanwhile"]) + 1], held
    assert held["lost"] == [], run.report()
    assert "node lost" not in run.stderr, run.report()
