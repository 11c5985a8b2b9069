"""``actorch history``: the runs this user's systems recorded, and one of them as a readable report.

A run's record is the JSON lines its nodes wrote as things happened
(``actorch._base.record``). The list gives each run's start, length, nodes,
outcome and error count; the report gives what happened in time order, the
errors with their tracebacks, and each actor's final statistics. A run whose
rank 0 was killed has no end in its record: its outcome is ``unknown`` and the
report shows everything written up to the kill. Only light modules are
imported here: the command answers at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from actorch._base.record import RunSummary, read_run, runs, runs_dir

__all__ = ["history_command", "render_report", "render_runs"]

_SKIPPED = frozenset({"node closed", "status served"})
"""Events a report leaves out of its timeline: every run has them and they say nothing of what happened."""


def history_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """List the recorded runs, or show ``args.run`` (an id, a prefix of one, or ``last``); the exit code."""
    directory = Path(args.dir) if args.dir else runs_dir()
    found = runs(directory)
    if args.run is None:
        shown = found[: args.limit]
        if args.json:
            print(json.dumps({"runs": [_summary_json(summary) for summary in shown]}))
        elif not shown:
            print(f"no runs recorded in {directory}")
        else:
            print(render_runs(shown))
        return 0
    chosen = _choose(found, args.run)
    if isinstance(chosen, str):
        if args.json:
            print(json.dumps({"error": chosen, "exit_code": 1}))
        print(f"actorch history: {chosen}", file=sys.stderr)
        return 1
    entries = read_run(chosen.path)
    if args.json:
        print(json.dumps({"run": _summary_json(chosen), "entries": entries}, default=str))
    else:
        print(render_report(chosen, entries))
    return 0


def _choose(found: list[RunSummary], wanted: str) -> RunSummary | str:
    """The run ``wanted`` names, or why none is chosen."""
    if not found:
        return "no runs recorded"
    if wanted == "last":
        return found[0]
    exact = [summary for summary in found if summary.run == wanted]
    matches = exact or [summary for summary in found if summary.run.startswith(wanted) or wanted in summary.run]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return f"no recorded run is named {wanted!r} (actorch history lists them)"
    names = ", ".join(summary.run for summary in matches[:5])
    return f"{len(matches)} runs match {wanted!r}: {names}{', ...' if len(matches) > 5 else ''}; give more of the id"


def _summary_json(summary: RunSummary) -> dict[str, Any]:
    return {
        "run": summary.run,
        "path": str(summary.path),
        "started": summary.started,
        "ended": summary.ended,
        "outcome": summary.outcome,
        "script": summary.script,
        "nodes": sorted(summary.nodes),
        "errors": summary.errors,
    }


def _when(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _took(summary: RunSummary) -> str:
    if summary.started is None or summary.ended is None:
        return "-"
    return f"{summary.ended - summary.started:.1f} s"


def render_runs(summaries: list[RunSummary]) -> str:
    """The runs as a table, newest first."""
    rows = [("RUN", "STARTED", "TOOK", "NODES", "OUTCOME", "ERRORS", "SCRIPT")]
    rows += [
        (
            summary.run,
            _when(summary.started),
            _took(summary),
            str(len(summary.nodes)),
            summary.outcome,
            str(summary.errors),
            summary.script,
        )
        for summary in summaries
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def render_report(summary: RunSummary, entries: list[dict[str, Any]]) -> str:
    """One run as a report: what ran, what happened in order, the errors in full, each actor's final statistics."""
    start = summary.started if summary.started is not None else (entries[0]["t"] if entries else 0.0)
    lines = [f"run {summary.run}", f"  record   {summary.path}"]
    opening = next((entry for entry in entries if entry.get("event") == "run started"), None)
    if opening is not None:
        argv = " ".join(str(arg) for arg in opening.get("argv", []))
        lines.append(
            f"  script   {opening.get('script', '')}{' ' + argv if argv else ''}  (in {opening.get('cwd', '?')})"
        )
        lines.append(f"  rank 0   pid {opening.get('pid', '?')} on {opening.get('host', '?')}")
    lines.append(f"  started  {_when(summary.started)}, took {_took(summary)}, {len(summary.nodes)} nodes")
    ending = {
        "ok": "ended: main returned",
        "failed": "ended: failed",
        "interrupted": "ended: interrupted (Ctrl-C or SIGTERM), and shut down",
        "unknown": "no end recorded: rank 0 was killed, or the run goes on",
    }
    lines.append(f"  outcome  {ending.get(summary.outcome, summary.outcome)}")
    lines += ["", "what happened"]
    errors: list[tuple[float, dict[str, Any]]] = []
    seen: set[tuple[str, Any]] = set()
    for entry in entries:
        event = str(entry.get("event", "?"))
        if event in _SKIPPED:
            continue
        if event in ("node joined", "node lost"):
            key = (event, entry.get("peer"))
            if key in seen:
                continue  # every node records what it saw: once is enough here
            seen.add(key)
        offset = entry["t"] - start
        lines.append(f"  {offset:+9.3f} s  node {entry.get('node', '?')}  {event}{_details(entry)}")
        if "traceback" in entry or "exception" in entry:
            errors.append((offset, entry))
    if errors:
        lines += ["", "errors"]
        for offset, entry in errors:
            lines.append(
                f"  {offset:+9.3f} s  node {entry.get('node', '?')}  {entry.get('event')}: {entry.get('error', '')}"
            )
            text = str(entry.get("traceback") or entry.get("exception"))
            lines += [f"      {line}" for line in text.splitlines()]
    table = _actor_table(entries)
    if table:
        lines += ["", "actors (final statistics)", *table]
    return "\n".join(lines)


_DETAIL_KEYS = (
    "actor",
    "peer",
    "by",
    "handler",
    "why",
    "reason",
    "error",
    "outcome",
    "cls",
    "host",
    "pid",
    "restarts",
    "attempt",
)


def _details(entry: dict[str, Any]) -> str:
    """The fields of ``entry`` a timeline line shows, in a fixed order."""
    shown = [f"{key}={entry[key]}" for key in _DETAIL_KEYS if entry.get(key) not in (None, "")]
    return f"  ({', '.join(shown)})" if shown else ""


def _actor_table(entries: list[dict[str, Any]]) -> list[str]:
    """One line per stopped actor: handled (by its endpoints), restarts, hooks; then each endpoint's numbers.

    An endpoint's numbers are its calls, errors and mean handler time.
    """
    rows: list[str] = []
    for entry in entries:
        if entry.get("event") != "actor stopped":
            continue
        stats = entry.get("statistics") or {}
        endpoints = stats.get("endpoints") or {}
        parts = [
            f"{name}: {each.get('calls', 0)} calls, {each.get('errors', 0)} errors, "
            f"{1e3 * each.get('mean_s', 0.0):.3f} ms each"
            for name, each in sorted(endpoints.items())
        ]
        hooks = stats.get("hooks") or {}
        ran = ", ".join(name if count == 1 else f"{name} ({count} times)" for name, count in sorted(hooks.items()))
        rows.append(
            f"  {entry.get('actor', '?')}  {entry.get('reason', '?')}; handled {stats.get('handled', 0)}, "
            f"restarts {stats.get('restarts', 0)}, queued at most {stats.get('queued_peak', 0)}"
            + (f"; hooks {ran}" if ran else "")
        )
        rows += [f"      {part}" for part in parts]
    return rows
