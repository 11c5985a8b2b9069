"""The side-by-side benchmark and the CPU profile run end to end at a small size (no timing is asserted)."""

from __future__ import annotations

import re
import sys

import pytest
from _mp import REPO, run_argv

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]

NUMBER = r"[\d.]+"


def test_bench_rpc_prints_every_row_with_the_asyncio_floor_and_with_nothing_installed() -> None:
    argv = [sys.executable, str(REPO / "benchmarks" / "bench_rpc.py"), "--transport", "uv", "--lane", "on"]
    argv += ["--rounds", "1", "--bare"]
    argv += ["--calls", "50", "--in-flight", "100", "--bursts", "1", "--mb", "1"]
    finished = run_argv(argv, timeout=180.0)
    finished.assert_clean_exit(0)
    out = finished.stdout
    for label in ("(a) sequential no-op round trip", "(b) throughput, calls in flight", "(c) tensor round trip"):
        assert re.search(rf"^{re.escape(label)}\s+.+\s+{NUMBER}\s+[<>]= {NUMBER}$", out, re.MULTILINE), (
            f"no row {label}:\n{out}"
        )
    floor = re.search(
        rf"^\(a\) floor: torch RPC bridged only\s+(\d+) us\s+(\d+) us\s+({NUMBER})\s+actorch / floor: ({NUMBER})$",
        out,
        re.MULTILINE,
    )
    assert floor, f"no floor row:\n{out}"
    raw_us, floor_us, ratio, _ = (float(group) for group in floor.groups())
    assert raw_us > 0
    assert floor_us > 0
    assert ratio == pytest.approx(floor_us / raw_us, abs=0.02)
    for measure in ("(a)", "(b)", "(d)"):  # --bare: the same again, with no instrument on either node
        label = f"{measure} with nothing installed"
        assert re.search(rf"^{re.escape(label)}\s+{NUMBER}(?: us|/s)\s+{NUMBER}\s+of the default", out, re.MULTILINE), (
            f"no row {label}:\n{out}"
        )


def test_bench_rpc_runs_everything_with_opentelemetry_spans_of_the_sdk() -> None:
    pytest.importorskip(
        "opentelemetry.sdk.trace", reason="--otel sdk needs opentelemetry-sdk (pip install 'actorch[test]')"
    )
    argv = [sys.executable, str(REPO / "benchmarks" / "bench_rpc.py"), "--transport", "uv", "--lane", "on"]
    argv += ["--rounds", "1", "--calls", "50", "--in-flight", "100", "--bursts", "1", "--mb", "1", "--otel", "sdk"]
    finished = run_argv(argv, timeout=180.0)
    finished.assert_clean_exit(0)
    assert "OpenTelemetry spans on (sdk)" in finished.stdout
    label = "(a) sequential no-op round trip"
    assert re.search(rf"^{re.escape(label)}\s+.+\s+{NUMBER}\s+[<>]= {NUMBER}$", finished.stdout, re.MULTILINE)


def test_profile_cpu_reads_both_sides_of_every_way() -> None:
    argv = [sys.executable, str(REPO / "benchmarks" / "profile_cpu.py"), "--rounds", "1", "--calls", "50"]
    finished = run_argv(argv, timeout=180.0)
    finished.assert_clean_exit(0)
    for way in ("raw", "floor", "actorch"):
        row = re.search(rf"^{way}((?:\s+{NUMBER}){{5}})$", finished.stdout, re.MULTILINE)
        assert row, f"no row for {way}:\n{finished.stdout}"
        wall, *_ = (float(value) for value in row.group(1).split())
        assert wall > 0
