"""The reinforcement learning examples run as the RL guide says, in short versions.

They need Gymnasium and matplotlib (the ``examples`` extra) and skip without them.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from _mp import REPO, run_argv

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.timeout(200),
    pytest.mark.skipif(
        importlib.util.find_spec("gymnasium") is None or importlib.util.find_spec("matplotlib") is None,
        reason="the RL examples need Gymnasium and matplotlib: pip install -e '.[examples]'",
    ),
]

EPISODE = re.compile(r"^Episode (\d+)\tLast reward: ([\d.]+)\tAverage reward: ([\d.]+)$", re.MULTILINE)


def run_example(name: str, *args: str) -> str:
    finished = run_argv([sys.executable, str(REPO / "examples" / name), *args], timeout=150.0)
    finished.assert_clean_exit(0)
    return finished.stdout


@pytest.mark.parametrize("mode", ["--batch", "--no-batch"])
def test_reinforce_example_plays_learns_and_saves_its_curve(mode: str, tmp_path: Path) -> None:
    curve = tmp_path / "curve.png"
    out = run_example("reinforce.py", mode, "--episodes", "4", "--observers", "2", "--plot", str(curve))
    episodes = EPISODE.findall(out)
    assert [int(number) for number, _, _ in episodes] == [1, 2, 3, 4], out
    assert all(8.0 <= float(reward) <= 500.0 for _, reward, _ in episodes), "CartPole episodes last 8 to 500 steps"
    done = re.search(r"done: 4 episodes, 2 observers, batch=(\w+), .* (\d+) actions in", out)
    assert done, out
    assert done.group(1) == str(mode == "--batch")
    assert int(done.group(2)) >= 2 * 4 * 8
    assert curve.read_bytes().startswith(b"\x89PNG")


def test_reinforce_example_fixed_length_runs_take_exactly_their_steps(tmp_path: Path) -> None:
    args = ["--episodes", "2", "--observers", "2", "--steps", "30", "--plot", "", "--device", "cpu"]
    out = run_example("reinforce.py", *args)
    assert "done: 2 episodes, 2 observers, batch=True, device=cpu" in out
    assert " 120 actions in " in out, out


@pytest.mark.cuda
def test_reinforce_example_runs_its_policy_on_a_gpu_against_cpu_observers() -> None:
    out = run_example(
        "reinforce.py", "--episodes", "2", "--observers", "2", "--steps", "30", "--plot", "", "--device", "cuda"
    )
    assert [int(number) for number, _, _ in EPISODE.findall(out)] == [1, 2], out
    assert "done: 2 episodes, 2 observers, batch=True, device=cuda" in out
    assert " 120 actions in " in out, out


def test_batch_timing_example_prints_its_table_and_figure(tmp_path: Path) -> None:
    figure = tmp_path / "timing.png"
    args = ["--max-world-size", "3", "--episodes", "1", "--steps", "10", "--hidden", "32", "--plot", str(figure)]
    out = run_example("batch_timing.py", *args)
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", out, re.MULTILINE)
    assert [int(size) for size, _, _, _ in rows] == [2, 3], out
    assert all(float(batched) > 0 and float(plain) > 0 for _, batched, plain, _ in rows)
    assert "process start-up excluded" in out
    assert figure.read_bytes().startswith(b"\x89PNG")


PROGRESS = re.compile(
    r"^frames\s+([\d,]+)\s+version\s+(\d+)\s+episodes\s+([\d,]+)\s+return\s+([\d.]+) \(last (\d+)\)", re.MULTILINE
)
DONE = re.compile(
    r"^done: mean return ([\d.]+), ([\d,]+) frames, ([\d.]+) s, ([\d,]+) fps \((\d+) collectors? x (\d+) envs",
    re.MULTILINE,
)


def test_collect_train_example_learns_until_its_target_and_prints_its_figures() -> None:
    args = ["--target", "60", "--window", "10", "--max-frames", "40000", "--envs", "4", "--frames-per-batch", "128"]
    out = run_example("collect_train.py", *args, "--no-progress")
    lines = PROGRESS.findall(out)
    assert lines, out
    assert float(lines[-1][3]) >= 60.0, "the last line is the one that reached the target"
    assert "reached the target: mean return" in out, out
    assert "(target 60 over 10)" in out
    done = DONE.search(out)
    assert done, out
    assert float(done.group(1)) >= 60.0
    assert 0 < int(done.group(2).replace(",", "")) < 40000
    assert float(done.group(3)) > 0
    assert int(done.group(4).replace(",", "")) > 0
    assert done.group(5, 6) == ("2", "4")


def test_collect_train_example_stops_at_its_frame_budget_with_streamed_batches() -> None:
    args = ["--max-frames", "1024", "--workers", "1", "--envs", "2", "--frames-per-batch", "256", "--on-lag", "drop"]
    out = run_example("collect_train.py", *args, "--no-progress")
    assert "did not reach the target" in out, out
    done = DONE.search(out)
    assert done, out
    assert int(done.group(2).replace(",", "")) == 1024, "four batches of 256"
    assert done.group(5, 6) == ("1", "2")
    assert "max lag 1, 0 stale batches set aside" in out


@pytest.mark.skipif(
    importlib.util.find_spec("torchrl") is None, reason="the example needs TorchRL: pip install -e '.[bench]'"
)
def test_torchrl_ppo_example_learns_with_torchrls_loss_on_batches_of_actorch_collectors() -> None:
    out = run_example("torchrl_ppo.py", "--target", "60", "--max-frames", "60000", "--envs", "4")
    done = re.search(r"^mean return ([\d.]+) over the last (\d+) episodes after ([\d,]+) frames$", out, re.MULTILINE)
    assert done, out
    assert float(done.group(1)) >= 60.0, out
    assert int(done.group(2)) == 20
    assert 0 < int(done.group(3).replace(",", "")) < 60000
