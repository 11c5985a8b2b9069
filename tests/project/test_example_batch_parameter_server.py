"""The batch-updating parameter server example runs in sync rounds and its loss goes down."""

from __future__ import annotations

import re
import sys

import pytest
from _mp import REPO, run_argv

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]

EXAMPLE = REPO / "examples" / "batch_parameter_server.py"
ITERATION = re.compile(r"^  iteration\s+(\d+)\s+version\s+(\S+)\s+loss\s+(.+)$", re.MULTILINE)
DONE = re.compile(r"^done: (\d+) iterations, server version (\d+), mean loss ([\d.]+) -> ([\d.]+), ", re.MULTILINE)


def test_batch_parameter_server_example_steps_in_rounds_and_lowers_the_loss() -> None:
    finished = run_argv([sys.executable, str(EXAMPLE), "--trainers", "2", "--iterations", "8"], timeout=150.0)
    finished.assert_clean_exit(0)
    out = finished.stdout
    iterations = ITERATION.findall(out)
    assert [int(i) for i, _, _ in iterations] == list(range(1, 9)), out
    # Both trainers trained each iteration on one version, the one the previous round produced.
    assert [version for _, version, _ in iterations] == [str(v) for v in range(8)], out
    assert all(len(losses.split()) == 2 for _, _, losses in iterations), out
    done = DONE.search(out)
    assert done, out
    assert (int(done.group(1)), int(done.group(2))) == (8, 8), out  # one step per round of 2 pushes
    first, last = float(done.group(3)), float(done.group(4))
    assert last < 0.9 * first, out
