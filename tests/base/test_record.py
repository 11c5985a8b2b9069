"""Run records (``actorch._base.record``) and ``actorch history``: written as a run goes, read after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _mp import run_script

from actorch._base import record as record_module
from actorch._base.record import RecordedLog, RunRecord, is_run_id, new_run_id, read_run, runs, summarize
from actorch._launch.cli.history import render_report, render_runs

ACTORCH = [sys.executable, "-m", "_actorch_cli"]


class Logged:
    """A logger that keeps what it is asked to log."""

    def __init__(self, lines: list[tuple[str, str, dict[str, Any]]] | None = None, bound: dict[str, Any] | None = None):
        self.lines = [] if lines is None else lines
        self.bound = bound or {}

    def bind(self, **values: Any) -> Logged:
        return Logged(self.lines, {**self.bound, **values})

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, {**self.bound, **fields}))


def history(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ACTORCH_RUNS_DIR": str(directory)}
    command = [*ACTORCH, "history", *args]
    return subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=60)


def test_run_record_appends_one_json_line_per_event_that_read_run_merges_in_time_order(tmp_path: Path) -> None:
    first, second = RunRecord("r1", 0, tmp_path).open(), RunRecord("r1", 1, tmp_path).open()
    first.write("run started", script="train.py")
    second.write("actor started", actor="a", statistics={"handled": 2})
    first.write("run ended", outcome="ok", odd=object())  # what JSON cannot hold goes as its str
    entries = read_run(tmp_path / "r1")
    assert [(entry["node"], entry["event"]) for entry in entries] == [
        (0, "run started"),
        (1, "actor started"),
        (0, "run ended"),
    ]
    assert entries[1]["statistics"] == {"handled": 2}
    assert entries[2]["odd"].startswith("<object object at")
    assert oct((tmp_path / "r1" / "node-0.jsonl").stat().st_mode & 0o777) == "0o600"


def test_read_run_skips_a_line_cut_short_by_a_kill(tmp_path: Path) -> None:
    record = RunRecord("cut", 0, tmp_path).open()
    record.write("run started")
    with open(record.path, "a", encoding="utf-8") as file:
        file.write('{"t": 1, "node": 0, "ev')
    assert [entry["event"] for entry in read_run(tmp_path / "cut")] == ["run started"]


def test_run_record_rotates_a_node_file_past_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_module, "MAX_NODE_BYTES", 400)
    record = RunRecord("big", 0, tmp_path).open()
    for index in range(20):
        record.write("tell failed", index=index, error="x" * 40)
    files = sorted(path.name for path in (tmp_path / "big").iterdir())
    assert files == ["node-0.1.jsonl", "node-0.jsonl"]
    assert all(path.stat().st_size <= 400 for path in (tmp_path / "big").iterdir())
    kept = [entry["index"] for entry in read_run(tmp_path / "big")]
    assert kept == sorted(kept)
    assert kept[-1] == 19, "the newest lines are kept"


def test_a_new_run_removes_the_oldest_past_keep_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_module, "KEEP_RUNS", 3)
    for index in range(5):
        (tmp_path / f"old{index}").mkdir()
        os.utime(tmp_path / f"old{index}", (index, index))
    RunRecord("new", 0, tmp_path).open()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new", "old3", "old4"]


def test_a_record_that_cannot_be_written_says_why_once_and_goes_on(tmp_path: Path) -> None:
    record = RunRecord("gone", 0, tmp_path).open()
    os.close(record._fd)  # as if the disk refused every write from now on
    record.write("node lost", peer=1)
    assert record.failed is not None
    assert record.failed.startswith(f"run record {record.path} not written: ")
    record.write("node lost", peer=2)  # nothing more is tried, nothing raises


@pytest.mark.parametrize("run", ["", "../up", "a/b", "-x", "x" * 129, 7, None])
def test_run_record_refuses_a_run_id_that_is_not_a_plain_name(tmp_path: Path, run: Any) -> None:
    assert not is_run_id(run)
    with pytest.raises(ValueError, match="a run id is letters, digits"):
        RunRecord(run, 0, tmp_path)


def test_new_run_id_sorts_by_start_and_names_the_script_and_process() -> None:
    made = new_run_id("/home/me/my train!.py", 4242, time.mktime((2026, 11, 27, 12, 13, 14, 0, 0, -1)))
    assert made == "20261127-121314-my-train-4242"
    assert is_run_id(made)
    assert is_run_id(new_run_id(""))


def test_recorded_log_keeps_info_and_above_and_the_chosen_debug_events(tmp_path: Path) -> None:
    record = RunRecord("logs", 3, tmp_path).open()
    inner = Logged()
    log = RecordedLog(inner, record).bind(node=3, actor="a")
    log.debug("call refused: actor stopped", endpoint="x")
    log.debug("actor started", cls="m:A")
    log.info("node joined", peer=1)
    log.warning("node lost", peer=2, why="silent")
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("on_stop failed")
    log.error("tell failed", exc_info=KeyError("k"))
    entries = read_run(tmp_path / "logs")
    assert [(entry["level"], entry["event"]) for entry in entries] == [
        ("debug", "actor started"),
        ("info", "node joined"),
        ("warning", "node lost"),
        ("error", "on_stop failed"),
        ("error", "tell failed"),
    ]
    assert all(entry["node"] == 3 and entry["actor"] == "a" for entry in entries)
    assert entries[3]["traceback"].endswith("ValueError: bad")
    assert entries[4]["traceback"] == "KeyError: 'k'"
    assert len(inner.lines) == 6, "every line still goes to the logger"
    assert inner.lines[0] == ("debug", "call refused: actor stopped", {"node": 3, "actor": "a", "endpoint": "x"})


def test_history_report_orders_events_names_each_node_loss_once_and_shows_errors_and_statistics(tmp_path: Path) -> None:
    zero, one = RunRecord("r", 0, tmp_path).open(), RunRecord("r", 1, tmp_path).open()
    zero.write("run started", script="train.py", argv=["--fast"], pid=10, host="h", cwd="/w")
    one.write("actor started", level="debug", actor="actor 'w' (W) on node 1")
    zero.write("node lost", level="warning", peer=2, why="silent")
    one.write("node lost", level="debug", peer=2, why="silent")
    one.write(
        "tell failed",
        level="error",
        actor="actor 'w' (W) on node 1",
        error="ValueError: no",
        exception="Traceback\nValueError: no",
    )
    stats = {
        "handled": 4,
        "restarts": 1,
        "queued_peak": 2,
        "endpoints": {"act": {"calls": 3, "errors": 1, "mean_s": 0.002}},
    }
    one.write("actor stopped", level="debug", actor="actor 'w' (W) on node 1", reason="stopped", statistics=stats)
    zero.write("run ended", outcome="ok")
    summary = summarize(tmp_path / "r", read_run(tmp_path / "r"))
    assert (summary.outcome, summary.script, summary.nodes, summary.errors) == ("ok", "train.py", {0, 1}, 1)
    report = render_report(summary, read_run(tmp_path / "r"))
    assert "  script   train.py --fast  (in /w)" in report
    assert "  outcome  ended: main returned" in report
    assert report.count("node lost") == 1
    timeline = report.split("what happened\n")[1].split("\n\n")[0].splitlines()
    assert [
        next(
            word
            for word in ("run started", "actor started", "node lost", "tell failed", "actor stopped", "run ended")
            if word in line
        )
        for line in timeline
    ] == [
        "run started",
        "actor started",
        "node lost",
        "tell failed",
        "actor stopped",
        "run ended",
    ]
    assert "errors\n" in report
    assert "      Traceback\n      ValueError: no" in report
    assert (
        "  actor 'w' (W) on node 1  stopped; handled 4, restarts 1, queued at most 2\n"
        "      act: 3 calls, 1 errors, 2.000 ms each"
    ) in report
    listed = render_runs([summary]).splitlines()
    assert listed[0].split() == ["RUN", "STARTED", "TOOK", "NODES", "OUTCOME", "ERRORS", "SCRIPT"]
    assert listed[1].split()[0] == "r"
    assert listed[1].split()[-4:] == ["2", "ok", "1", "train.py"]


def test_history_reads_an_interrupted_run_as_interrupted_with_its_kill_and_hooks_apart(tmp_path: Path) -> None:
    zero = RunRecord("r", 0, tmp_path).open()
    zero.write("run started", script="train.py", pid=10, host="h", cwd="/w")
    zero.write("main interrupted", by="Ctrl-C")
    handler = "handler 'nap' of actor 'sleeper' (Sleeper) on node 1 (running for 12.0 s)"
    zero.write("node killed", level="warning", peer=1, why=f"{handler} blocked its event loop past stop_grace (10 s)")
    stats = {"handled": 0, "restarts": 0, "queued_peak": 0, "hooks": {"on_start": 2, "on_stop": 1}, "endpoints": {}}
    zero.write("actor stopped", level="debug", actor="actor 'p' (P) on node 0", reason="shutdown", statistics=stats)
    zero.write("run ended", outcome="interrupted")
    summary = summarize(tmp_path / "r", read_run(tmp_path / "r"))
    assert (summary.outcome, summary.errors) == ("interrupted", 0)
    report = render_report(summary, read_run(tmp_path / "r"))
    assert "  outcome  ended: interrupted (Ctrl-C or SIGTERM), and shut down" in report
    assert "main interrupted  (by=Ctrl-C)" in report
    assert f"node killed  (peer=1, why={handler} blocked its event loop past stop_grace (10 s))" in report
    assert "errors\n" not in report
    assert (
        "actor 'p' (P) on node 0  shutdown; handled 0, restarts 0, queued at most 0; hooks on_start (2 times), on_stop"
        in report
    )
    assert render_runs([summary]).splitlines()[1].split()[-4:] == ["1", "interrupted", "0", "train.py"]


def test_history_command_lists_shows_and_refuses_as_a_user_would_read_it(tmp_path: Path) -> None:
    assert history(tmp_path).stdout.strip() == f"no runs recorded in {tmp_path}"
    for name, started in (("20261127-100000-a-1", 100.0), ("20261127-110000-b-2", 200.0)):
        RunRecord(name, 0, tmp_path).open().write("run started", script=f"{name}.py")
        os.utime(tmp_path / name, (started, started))
    listed = history(tmp_path)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [
        "20261127-110000-b-2",
        "20261127-100000-a-1",
    ]
    assert history(tmp_path, "last").stdout.startswith("run 20261127-110000-b-2\n")
    assert history(tmp_path, "a-1").stdout.startswith("run 20261127-100000-a-1\n")
    assert [run["run"] for run in json.loads(history(tmp_path, "--json").stdout)["runs"]] == [
        "20261127-110000-b-2",
        "20261127-100000-a-1",
    ]
    missing = history(tmp_path, "nope")
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "actorch history: no recorded run is named 'nope' (actorch history lists them)",
    )
    both = history(tmp_path, "20261127")
    assert both.returncode == 1
    assert both.stderr.startswith("actorch history: 2 runs match '20261127': ")
    assert json.loads(history(tmp_path, "nope", "--json").stdout)["exit_code"] == 1
    assert history(tmp_path, "--limit", "0").returncode == 2


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_run_records_itself_and_history_shows_it_even_after_kill_9_of_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTORCH_RUNS_DIR", str(tmp_path))
    ok = run_script("recorded.py", "ok-off", timeout=120)  # then a second run with record=False
    assert ok.returncode == 0, ok.report()
    assert ok.stdout.count("RESULT 42") == 2, ok.report()  # both runs went through
    [done] = runs(tmp_path)  # record=False wrote nothing
    assert (done.outcome, sorted(done.nodes), done.script.endswith("recorded.py")) == ("ok", [0, 1], True)
    entries = read_run(done.path)
    events = [(entry["node"], entry["event"]) for entry in entries if entry["event"] != "status served"]
    assert (0, "run started") in events
    assert (1, "actor started") in events
    assert (1, "tell failed") in events
    assert events.index((1, "actor stopped")) < events.index((0, "run ended"))
    [stopped] = [entry for entry in entries if entry["event"] == "actor stopped"]
    assert stopped["statistics"]["endpoints"]["double"]["calls"] == 3
    assert stopped["statistics"]["endpoints"]["double"]["errors"] == 1
    [failed] = [entry for entry in entries if entry["event"] == "tell failed"]
    assert failed["exception"].rstrip().endswith("ValueError: -1 is negative")
    assert "_engine" not in failed["exception"], "the runtime's frames are trimmed"

    killed = run_script("recorded.py", "killed", timeout=120)
    assert killed.returncode == -9, killed.report()
    newest = runs(tmp_path)[0]
    assert newest.run != done.run
    assert newest.outcome == "unknown"
    shown = history(tmp_path, "last")
    assert shown.returncode == 0, shown.stderr
    assert "no end recorded: rank 0 was killed, or the run goes on" in shown.stdout
    assert "tell failed: ValueError: -1 is negative" in shown.stdout
    assert "run started" in shown.stdout
