"""Shared memory between real processes of one host: a killed node gives back its lends, loses its files and copies."""

from __future__ import annotations

import os

import pytest
from _mp import run_script

from actorch._base.channels.segments import SHM_DIR, host_identity

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(host_identity() is None, reason="no /dev/shm on this machine"),
]


@pytest.mark.timeout(120)
def test_a_killed_node_gives_back_what_it_was_lent_and_its_segment_files_are_removed() -> None:
    run = run_script("shm_reclaim.py", timeout=100)
    run.assert_clean_exit(0)
    r = run.result("reclaimed")
    assert r["before"]["lent"] >= 3, "the keeper on rank 1 held what rank 0 sent it"
    assert r["before"]["theirs"], "rank 1 made segments of its own"
    assert r["lent_after"] == 0, "what the lost node held came back"
    assert r["theirs_after"] == [], "its peers removed the lost node's files"
    assert r["kept_sums"] == [0.0, float(1 << 18), float(2 << 18)], "what rank 0 kept from it still reads right"
    left = [name for name in os.listdir(SHM_DIR) for pid in r["pids"] if name.startswith(f"actorch-{pid}-")]
    assert left == [], "no segment file outlives the run"


@pytest.mark.timeout(120)
def test_a_sender_killed_with_its_staged_copy_half_landed_is_refused_at_once_and_its_receiver_serves_on() -> None:
    run = run_script("staged_sender_lost.py", timeout=100)
    run.assert_clean_exit(0)
    r = run.result("sender-lost")
    assert r["kept"] == 0, "the tensor whose copy never landed was not handed to the actor"
    assert r["seconds"] < r["stall"] / 2, "refused when the sender was seen gone, not after the stall bound"
    assert "the sender's process" in run.stderr
    assert "is gone" in run.stderr
