"""Replay buffer shards in real worker processes, talking torch RPC over 127.0.0.1 in strict mode.

One run of ``mp_scripts/replay_shards.py`` (rank 0 plus two workers) is shared
by the tests of this module; it runs in its own session (see ``_mp``), so a hang
fails the tests and no process outlives them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

RUN_TIMEOUT = 150.0
FIRST_USE = 240  # pytest-timeout for tests that may run the shared script


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    directory: Path = tmp_path_factory.mktemp("replay")
    return run_script("replay_shards.py", str(directory), timeout=RUN_TIMEOUT)


def raised(outcome: dict[str, Any], *classes: str) -> dict[str, Any]:
    assert "error" in outcome, f"expected an exception, got {outcome}"
    error: dict[str, Any] = outcome["error"]
    assert set(classes) <= set(error["mro"]), f"expected {classes}, got {error['mro']}: {error['message']}"
    return error


@pytest.mark.timeout(FIRST_USE)
def test_replay_run_exits_cleanly_and_leaves_no_process(replay_run: Finished) -> None:
    replay_run.assert_clean_exit(0)
    assert replay_run.returned() == {"main": "returned", "checks": 4}, replay_run.report()


@pytest.mark.timeout(FIRST_USE)
def test_replay_shards_filled_by_actors_on_two_workers_are_sampled_from_rank0(replay_run: Finished) -> None:
    r = replay_run.result("prioritized")
    pids = r["pids"]
    assert len(set(pids)) == 3, "every rank is its own process"
    assert r["filled"] == [[1, pids[1], 300], [2, pids[2], 100]], "each filler ran beside its shard"
    assert r["sizes"] == [300, 100]
    assert r["data_matches_indices"] is True, "a sampled item's data must be what its index points at"
    assert r["first_share"] == pytest.approx(0.75, abs=0.03), "shards are drawn in proportion to their mass"
    assert r["total"] == 400


@pytest.mark.timeout(FIRST_USE)
def test_replay_priorities_updated_from_rank0_reshape_sampling_across_processes(replay_run: Finished) -> None:
    r = replay_run.result("prioritized")
    assert r["masses"] == [300.0, 300.0]
    assert r["first_share_after_update"] == pytest.approx(0.5, abs=0.03)
    assert r["probabilities_ok"] is True, "merged probabilities are global: local x shard mass / total"


@pytest.mark.timeout(FIRST_USE)
def test_replay_uniform_client_extend_round_robins_over_processes(replay_run: Finished) -> None:
    r = replay_run.result("uniform")
    assert r["held"] == 100
    assert r["sizes"] == [50, 50]
    assert r["even_to_first"] == [0]
    assert r["odd_to_second"] == [1]
    assert r["weights"] is None


@pytest.mark.timeout(FIRST_USE)
def test_replay_group_error_names_the_stopped_shard_across_processes(replay_run: Finished) -> None:
    r = replay_run.result("group_error")
    sample = r["sample"]
    assert "wrong" not in sample, f"expected GroupError, got {sample}"
    assert sample["failed"] == [1]
    assert "shard 1" in sample["message"]
    assert "replay/2" in sample["message"]
    assert [member["type"] for member in sample["members"]] == ["ActorStoppedError"]
    assert "replay shard 1" in sample["notes"][0][0]
    assert sample["kept"] == ["Sample", "ActorStoppedError"], "the healthy shard's sample is kept in results"
    assert "replay/2" in raised(r["size"], "GroupError", "ActorchError")["message"]


@pytest.mark.timeout(FIRST_USE)
def test_replay_snapshot_restores_on_another_process_and_refuses_corrupt_files(replay_run: Finished) -> None:
    r = replay_run.result("snapshot")
    assert r["written"] == r["file_size"]
    assert r["same_indices"] is True
    assert r["same_data"] is True
    assert r["same_weights"] is True
    assert "truncated" in raised(r["refused"], "SnapshotError", "RemoteError", "ValueError")["message"]
    assert "restores only 'uniform'" in raised(r["wrong_kind"], "SnapshotError", "RemoteError")["message"]
