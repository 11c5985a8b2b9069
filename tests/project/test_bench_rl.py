"""The agent/observer and collector benchmarks run end to end in their smoke modes (no timing is asserted).

Marked ``bench`` (most of a minute each) and left out of the default run: ``pytest -m bench``.
"""

from __future__ import annotations

import re
import sys

import pytest
from _mp import REPO, run_argv

pytestmark = [pytest.mark.multiprocess, pytest.mark.bench, pytest.mark.timeout(300)]


def test_bench_rl_quick_measures_all_four_sides() -> None:
    finished = run_argv([sys.executable, str(REPO / "benchmarks" / "bench_rl.py"), "--quick"], timeout=180.0)
    finished.assert_clean_exit(0)
    out = finished.stdout
    for side in ("actorch batched", "actorch unbatched", "raw batched", "raw unbatched"):
        row = re.search(rf"^{side}\s+([\d,]+)\s+([\d.]+)x$", out, re.MULTILINE)
        assert row, f"no row for {side}:\n{out}"
        assert int(row.group(1).replace(",", "")) > 0
        assert float(row.group(2)) > 0
    assert re.search(r"^raw batched\s+[\d,]+\s+1\.00x$", out, re.MULTILINE)


def test_bench_collect_quick_measures_both_workloads_against_the_limit_and_says_how_to_add_torchrl() -> None:
    bench = str(REPO / "benchmarks" / "bench_collect.py")
    sides = ["limit K=8", "collector K=8", "agent K=1", "torchrl rpc K=1", "collector by value K=8"]
    argv = [sys.executable, bench, "--quick", "--torchrl-python", sys.executable, "--sides", *sides]
    finished = run_argv(argv, timeout=280.0)
    finished.assert_clean_exit(0)
    out = finished.stdout
    assert "frames/s delivered to the learner after warm-up" in out
    # side, frames/s, of limit, CPU/frame, x plain, faults, cores, learner (and MB/s for pixels)
    row = r"^{side}\s+([\d,]+)\s+(\d+%|-)\s+(\d+) us\s+([\d.]+|-)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)(\s+\d+)?$"
    for workload, measured in (("cartpole", sides[:3]), ("pixels", [*sides[:2], sides[4]])):
        table = out[out.index(f"\n{workload}: frames/s") :]
        for side in measured:
            found = re.search(row.format(side=side), table, re.MULTILINE)
            assert found, f"no row for {side} in {workload}:\n{out}"
            assert int(found.group(1).replace(",", "")) > 0
            assert int(found.group(3)) > 0
            assert (found.group(8) is not None) == (workload == "pixels")
        assert re.search(r"^limit K=8\s+[\d,]+\s+100%\s+\d+ us\s+1\.00", table, re.MULTILINE)
    if "torchrl rpc K=1" not in out:  # TorchRL is not installed here: the bench says how to add it
        assert "pip install -e '.[bench]'" in finished.stderr
