"""PyTorch's RPC tutorials ported to actorch run as docs/guides/tutorials.md says, in short versions.

They need nothing beyond torch. No timing is asserted: only what the runs learn and print.
"""

from __future__ import annotations

import re
import sys

import pytest
from _mp import REPO, run_argv

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]


def run_script(*argv: str) -> str:
    finished = run_argv([sys.executable, str(REPO / argv[0]), *argv[1:]], timeout=150.0)
    finished.assert_clean_exit(0)
    return finished.stdout


def test_model_parallel_rnn_example_learns_and_trains_the_servers_layers() -> None:
    out = run_script("examples/model_parallel_rnn.py", "--quick")
    losses = [float(loss) for loss in re.findall(r"^\s+epoch\s+\d+\s+loss ([\d.]+)$", out, re.MULTILINE)]
    assert len(losses) == 5, out
    assert losses[-1] < 0.8 * losses[0], "the loss went down"
    moved = re.search(r"parameters moved by ([\d.]+) \(embedding\) and ([\d.]+) \(decoder\)", out)
    assert moved, out
    assert float(moved.group(1)) > 0, "the optimizer stepped the remote embedding"
    assert float(moved.group(2)) > 0, "the optimizer stepped the remote decoder"
    assert "done: 5 epochs" in out


def test_pipeline_example_learns_with_one_and_several_micro_batches() -> None:
    out = run_script("examples/pipeline.py", "--quick")
    runs = re.findall(
        r"^number of splits = (\d+), execution time = [\d.]+ s \([\d.]+ s per batch\), "
        r"loss ([\d.]+) -> ([\d.]+), accuracy [\d.]+% -> ([\d.]+)%$",
        out,
        re.MULTILINE,
    )
    assert [int(splits) for splits, _, _, _ in runs] == [1, 4], out
    for _, first, last, accuracy in runs:
        assert float(last) < float(first), "the loss went down"
        assert float(accuracy) > 20.0, "above chance (10 %)"


@pytest.mark.bench
def test_bench_pipeline_quick_measures_both_sides() -> None:
    out = run_script("benchmarks/bench_pipeline.py", "--quick")
    number = r"\s+([\d.]+)"
    row = rf"^\s+(\d+){number} s{number} s\s+\S+{number}%{number}%{number} s{number} s{number} s{number} s{number}$"
    rows = re.findall(row, out, re.MULTILINE)
    assert [int(found[0]) for found in rows] == [1, 4], out
    for _, _, _, raw_share, ours_share, *seconds, _ in rows:
        assert 0 <= int(raw_share) <= 100
        assert 0 <= int(ours_share) <= 100
        assert all(float(value) > 0 for value in seconds), "both stages computed and every step took time"
