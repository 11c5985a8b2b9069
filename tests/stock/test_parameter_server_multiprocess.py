"""The parameter server over real torch RPC: sharded sync rounds, gated pulls, RRefs (strict mode)."""

from __future__ import annotations

import pytest
from _mp import Finished, run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]


@pytest.fixture(scope="module")
def training() -> Finished:
    """One strict-mode run of ``training.py`` (3 processes) shared by this module's tests."""
    return run_script("training.py", "--strict", timeout=150.0)


def test_training_run_returns_and_leaves_no_process(training: Finished) -> None:
    training.assert_clean_exit(0)
    assert training.returned() == {"main": "returned"}, training.report()


def test_parameter_server_sync_round_across_processes_averages_both_trainers(training: Finished) -> None:
    results = training.result("sync_shards")["results"]
    for result in results:
        assert result["versions"] == [1, 1]
        # lr 0.5 times the mean of the gradients 1 and 3: every parameter moved by 1.
        assert result["moved"] == pytest.approx(dict.fromkeys(result["moved"], 1.0))
    assert sorted(results[0]["moved"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]


def test_parameter_client_pull_across_processes_skips_unchanged_shards(training: Finished) -> None:
    gated = training.result("gated_pull")
    assert gated["full"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert gated["again"] is None
    assert gated["versions"] == [1, 1]
    assert gated["direct"]["value"] is None


def test_parameter_server_rrefs_drive_distributed_autograd(training: Finished) -> None:
    rrefs = training.result("rrefs")
    assert rrefs["step"]["value"] == {"rrefs": 4, "owners": [1]}, rrefs
    assert rrefs["changed"] is True
