"""The agent/observer benchmark runs end to end in its smoke mode (no timing is asserted)."""

from __future__ import annotations

import re
import sys

import pytest
from _mp import REPO, run_argv

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]


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


def test_bench_collect_quick_measures_the_actorch_sides_and_says_how_to_add_torchrls() -> None:
    bench = str(REPO / "benchmarks" / "bench_collect.py")
    argv = [sys.executable, bench, "--quick", "--torchrl-python", sys.executable]
    finished = run_argv([*argv, "--sides", "agent K=1", "local K=8", "torchrl rpc"], timeout=180.0)
    finished.assert_clean_exit(0)
    out = finished.stdout
    for side in ("agent K=1", "local K=8"):
        row = re.search(rf"^{side}\s+([\d,]+)\s+(\d+) us$", out, re.MULTILINE)
        assert row, f"no row for {side}:\n{out}"
        assert int(row.group(1).replace(",", "")) > 0
    if "torchrl rpc" not in out:  # TorchRL is not installed here: the bench says how to add it
        assert "pip install -e '.[bench]'" in finished.stderr
