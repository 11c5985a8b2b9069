"""Run records: what happened in a system, written by each node as it happens, read after the job.

Each node appends one JSON object per line to ``<runs dir>/<run id>/node-<rank>.jsonl``:
its start, the nodes it saw join and get lost, its actors started, restarted,
failed and stopped (with their final statistics), and errors with their
tracebacks. A line is one ``os.write`` to a file opened for appending, so what
was written is on disk even if the process is killed with ``kill -9`` a moment
later. Lines are rare (nothing is written per message), so writing costs
nothing a call could measure.

A record is bounded: a node's file that passes ``MAX_NODE_BYTES`` is renamed
``node-<rank>.1.jsonl`` (replacing an older one) and a new one begun, and a new
run removes the oldest runs past ``KEEP_RUNS``. The directory is
``$ACTORCH_RUNS_DIR``, else ``$XDG_STATE_HOME/actorch/runs``, else
``~/.local/state/actorch/runs``. This module imports nothing heavy: the
``actorch history`` command reads records with it and starts at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "KEEP_RUNS",
    "MAX_NODE_BYTES",
    "RECORDED_DEBUG",
    "RECORD_ENV",
    "RUNS_DIR_ENV",
    "RecordedLog",
    "RunRecord",
    "RunSummary",
    "is_run_id",
    "new_run_id",
    "read_run",
    "runs",
    "runs_dir",
    "summarize",
    "traceback_text",
]

RUNS_DIR_ENV = "ACTORCH_RUNS_DIR"
"""Environment variable naming the directory of run records."""

RECORD_ENV = "ACTORCH_RECORD"
"""Environment variable that turns run records off when it says ``0``."""

MAX_NODE_BYTES = 8 << 20
"""Bytes one node's record file may reach before it is rotated (two files at most per node)."""

KEEP_RUNS = 100
"""Runs kept in the runs directory; a new run removes the oldest past this many."""

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def runs_dir() -> Path:
    """This user's directory of run records (not made here)."""
    given = os.environ.get(RUNS_DIR_ENV)
    if given:
        return Path(given)
    state = os.environ.get("XDG_STATE_HOME")
    base = Path(state) if state else Path.home() / ".local" / "state"
    return base / "actorch" / "runs"


def is_run_id(value: object) -> bool:
    """Whether ``value`` can name a run: letters, digits, ``.``, ``_`` and ``-``, at most 128, no path."""
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None


def new_run_id(script: str, pid: int | None = None, started: float | None = None) -> str:
    """A run id that sorts by start time: ``20261127-121314-train-4242`` (script name, pid of the launch)."""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(script).stem).strip("-")[:40] or "run"
    when = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if started is None else started))
    return f"{when}-{stem}-{os.getpid() if pid is None else pid}"


def traceback_text(error: BaseException) -> str:
    """``error``'s traceback as text, with its notes (a remote error's traceback is in its notes)."""
    return "".join(traceback.format_exception(error)).rstrip()


class RunRecord:
    """One node's record of a run: JSON lines appended as things happen.

    A record that cannot be written (a full disk, a removed directory) says so
    once through ``on_error`` and writes nothing more: the system goes on.
    """

    def __init__(self, run: str, rank: int, directory: Path | None = None) -> None:
        if not is_run_id(run):
            raise ValueError(f"a run id is letters, digits, '.', '_' and '-' (at most 128), not {run!r}")
        self.run = run
        self.rank = rank
        self.folder = (directory or runs_dir()) / run
        self.path = self.folder / f"node-{rank}.jsonl"
        self.failed: str | None = None
        self._lock = threading.Lock()  # the heartbeat thread may write beside the loop
        self._fd: int | None = None
        self._written = 0

    def open(self) -> RunRecord:
        """Make the run's folder and this node's file; remove the oldest runs past ``KEEP_RUNS``."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._written = os.fstat(self._fd).st_size
        _prune(self.folder.parent, keep=self.folder.name)
        return self

    def write(self, event: str, **fields: Any) -> None:
        """Append ``event`` with ``fields`` (made JSON with ``str`` where they are not) as one line."""
        if self._fd is None:
            return
        entry = {"t": round(time.time(), 6), "node": self.rank, "event": event, **fields}
        line = (json.dumps(entry, default=str, ensure_ascii=False) + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            try:
                if self._written + len(line) > MAX_NODE_BYTES:
                    self._rotate()
                os.write(self._fd, line)
                self._written += len(line)
            except OSError as exc:
                self.failed = f"run record {self.path} not written: {exc}"
                self._close_fd()

    def close(self) -> None:
        """Write nothing more."""
        with self._lock:
            self._close_fd()

    def _rotate(self) -> None:
        assert self._fd is not None
        os.replace(self.path, self.path.with_suffix(".1.jsonl"))
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._written = 0

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _prune(folder: Path, keep: str) -> None:
    """Remove the oldest run folders of ``folder`` past ``KEEP_RUNS`` (never ``keep``)."""
    try:
        folders = sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in folders[: max(0, len(folders) - KEEP_RUNS)]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


@dataclass
class RunSummary:
    """One run as ``actorch history`` lists it."""

    run: str
    path: Path
    started: float | None = None
    ended: float | None = None
    outcome: str = "unknown"  # "ok", "failed", "interrupted" (Ctrl-C, SIGTERM), or "unknown" (no end: killed, running)
    script: str = ""
    nodes: set[int] = field(default_factory=set)
    errors: int = 0


def read_run(folder: Path) -> list[dict[str, Any]]:
    """Every line of every node's record of the run in ``folder``, in time order (unreadable lines skipped)."""
    entries: list[dict[str, Any]] = []
    for path in sorted(folder.glob("node-*.jsonl")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(entry, dict) and isinstance(entry.get("t"), int | float):
                entries.append(entry)
    entries.sort(key=lambda entry: (entry["t"], entry.get("node", 0)))
    return entries


def summarize(folder: Path, entries: list[dict[str, Any]]) -> RunSummary:
    """What ``actorch history`` lists of the run in ``folder``."""
    summary = RunSummary(folder.name, folder)
    for entry in entries:
        summary.nodes.add(int(entry.get("node", 0)))
        event = entry.get("event")
        if event == "run started":
            summary.started = entry["t"]
            summary.script = str(entry.get("script", ""))
        elif event == "run ended":
            summary.ended = entry["t"]
            summary.outcome = str(entry.get("outcome", "unknown"))
        elif entry.get("level") == "error" or event == "main failed":
            summary.errors += 1
    if summary.started is None and entries:
        summary.started = entries[0]["t"]
    return summary


def runs(directory: Path | None = None) -> list[RunSummary]:
    """The runs recorded in ``directory`` (default: ``runs_dir()``), newest first."""
    folder = directory or runs_dir()
    try:
        found = [path for path in folder.iterdir() if path.is_dir()]
    except OSError:
        return []
    summaries = [summarize(path, read_run(path)) for path in found]
    return sorted(summaries, key=lambda summary: summary.started or 0.0, reverse=True)


RECORDED_DEBUG = frozenset({"actor started", "actor stopped", "node joined", "node lost"})
"""Events logged at debug that a record keeps anyway (everything at info and above is kept)."""


class RecordedLog:
    """A node's logger that also writes what it logs at info and above to the node's run record.

    The runtime logs the events a run record keeps (nodes lost, actors failed,
    restarted, relocated...) already: recording them where they are logged
    keeps one place per event. ``bind`` gives another such logger.
    """

    def __init__(self, inner: Any, record: RunRecord, context: dict[str, Any] | None = None) -> None:
        self._inner = inner
        self._record = record
        self._context = context or {}

    def bind(self, **values: Any) -> RecordedLog:
        """A logger with ``values`` bound, recording to the same record."""
        return RecordedLog(self._inner.bind(**values), self._record, {**self._context, **values})

    def debug(self, event: str, *args: Any, **fields: Any) -> Any:
        """Log at debug; kept in the record only if it is one of ``RECORDED_DEBUG``."""
        if event in RECORDED_DEBUG:
            self._keep("debug", event, fields)
        return self._inner.debug(event, *args, **fields)

    def info(self, event: str, *args: Any, **fields: Any) -> Any:
        """Log at info, and keep it."""
        self._keep("info", event, fields)
        return self._inner.info(event, *args, **fields)

    def warning(self, event: str, *args: Any, **fields: Any) -> Any:
        """Log at warning, and keep it."""
        self._keep("warning", event, fields)
        return self._inner.warning(event, *args, **fields)

    def error(self, event: str, *args: Any, **fields: Any) -> Any:
        """Log at error, and keep it (with the traceback of ``exc_info`` if given)."""
        self._keep("error", event, fields)
        return self._inner.error(event, *args, **fields)

    def exception(self, event: str, *args: Any, **fields: Any) -> Any:
        """Log at error with the exception being handled, and keep both."""
        self._keep("error", event, {**fields, "exc_info": True})
        return self._inner.exception(event, *args, **fields)

    def _keep(self, level: str, event: str, fields: dict[str, Any]) -> None:
        kept = {**self._context, **fields}
        kept.pop("node", None)  # the record's own
        exc_info = kept.pop("exc_info", None)
        error = sys.exc_info()[1] if exc_info is True else exc_info
        if isinstance(error, BaseException):
            kept["traceback"] = traceback_text(error)
        self._record.write(event, level=level, **kept)
