"""The examples run as their docs pages say, in short versions; those needing scikit-learn skip without it."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from _mp import REPO, run_argv

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]

needs_sklearn = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None, reason="the example needs scikit-learn: pip install -e '.[examples]'"
)


def run_example(name: str, *args: str) -> str:
    finished = run_argv([sys.executable, str(REPO / "examples" / name), *args], timeout=150.0)
    finished.assert_clean_exit(0)
    return finished.stdout


@pytest.mark.smoke
def test_quickstart_example_runs() -> None:
    assert "a.call(Counter.add, 5) -> 15" in run_example("quickstart.py")


def test_replay_example_fills_samples_and_learns() -> None:
    out = run_example("replay.py", "--seconds", "2")
    done = re.search(r"done in .*?([\d,]+) transitions in .*?([\d,]+) samples/s out", out)
    assert done, out
    assert int(done.group(1).replace(",", "")) > 0
    assert int(done.group(2).replace(",", "")) > 0


@needs_sklearn
def test_parameter_server_example_beats_chance_in_both_modes() -> None:
    out = run_example("parameter_server.py", "--epochs", "3")
    accuracies = [float(a) for a in re.findall(r"test accuracy\s+([\d.]+)%", out)]
    assert len(accuracies) == 6, out
    assert min(accuracies[2], accuracies[5]) > 50.0  # chance is 10 %


@needs_sklearn
def test_dist_autograd_example_beats_chance() -> None:
    out = run_example("dist_autograd.py", "--epochs", "2")
    accuracies = [float(a) for a in re.findall(r"test accuracy\s+([\d.]+)%", out)]
    assert len(accuracies) == 2, out
    assert accuracies[-1] > 50.0


def test_stream_learner_example_learns_from_a_sample_stream_while_explorers_watch() -> None:
    out = run_example("stream_learner.py", "--quick")
    done = re.search(
        r"done in .*?([\d,]+) learning steps, ([\d,]+) samples/s from the stream, ([\d,]+) transitions", out
    )
    assert done, out
    assert int(done.group(1).replace(",", "")) == 150
    assert int(done.group(3).replace(",", "")) > 0
    followed = [int(count.replace(",", "")) for count in re.findall(r"followed ([\d,]+) versions through watch", out)]
    assert len(followed) == 2, out
    assert min(followed) >= 2, "each explorer saw the model change"
    rewards = re.findall(r"mean reward (-?[\d.]+) early, (-?[\d.]+) late", out)
    assert rewards, out
