"""Durable snapshots between real processes: rank 0 killed with SIGKILL under ``actorch run --max-restarts 1``.

One run of ``mp_scripts/durable.py``: three named relocatable actors save as
they go into a snapshot directory; rank 0 kills itself in the middle of the
run; torchrun's agent starts the whole group again, and the same spawns find
each actor's last snapshot by its name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _mp import SCRIPTS, run_argv

pytestmark = pytest.mark.multiprocess

RUN_TIMEOUT = 150


@pytest.mark.timeout(RUN_TIMEOUT + 20)
def test_after_rank_0_is_killed_the_restarted_job_continues_each_actor_from_its_last_snapshot(tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    argv = [sys.executable, "-m", "actorch", "run", "-n", "3", "--max-restarts", "1", "--snapshots", str(snapshots)]
    run = run_argv([*argv, str(SCRIPTS / "durable.py"), str(tmp_path)], timeout=RUN_TIMEOUT)
    run.assert_clean_exit(0)
    assert {key: run.result("spawned0")[key] for key in ("tally", "replay", "params")} == {
        "tally": 0,
        "replay": 0,
        "params": 0,
    }
    assert {key: run.result("before")[key] for key in ("tally", "replay", "params")} == {
        "tally": 57,
        "replay": 57,
        "params": 11,
    }
    resumed = run.result("spawned1")
    assert resumed["tally"] == 55, "saved every 5: the 2 additions after the last save are lost, only they"
    assert resumed["replay"] == 50, "saved every 10 transitions: the last 7 are lost"
    assert resumed["params"] == 8, "saved every 4 pushes: the last 3 steps are lost"
    assert run.result("kept")["transitions"] == [float(index) for index in range(50)]
    assert "RETURNED 58" in run.stdout, run.report()
    assert sorted(path.name for path in snapshots.iterdir()) == ["params", "replay", "tally"]
    for folder in snapshots.iterdir():
        assert len(list(folder.iterdir())) == 2, "the last two snapshots of each actor are kept"
    print(f"restarted job answering {run.result('restarted')['seconds']:.1f} s after rank 0 was killed")
