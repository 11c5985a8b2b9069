"""Draw a timeline file (``system.trace``, ``run(trace=)``, ``actorch run --trace``) as a picture.

ui.perfetto.dev is the viewer to explore one; this draws a window of it as a
PNG where no browser is at hand (a report, a CI artifact, these docs):

    python docs/draw_timeline.py run.json run.png --start-ms 1200 --ms 40

A row per track (grouped by node), a bar per span coloured by kind, a line
from each call to the handler it reached. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLOURS = {"call": "#4c78a8", "handler": "#f58518", "tell": "#54a24b", "stream": "#b279a2", "item": "#e45756"}


def draw(document: dict[str, Any], out: str, start_ms: float, span_ms: float | None, title: str) -> None:
    """Draw the spans of ``document`` between ``start_ms`` and ``span_ms`` later (or its end) into ``out``."""
    events = document["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    nodes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    spans = [e for e in events if e["ph"] == "X"]
    end_ms = start_ms + span_ms if span_ms else max((e["ts"] + e["dur"]) / 1000 for e in spans)
    shown = [e for e in spans if e["ts"] / 1000 < end_ms and (e["ts"] + e["dur"]) / 1000 > start_ms]
    used = sorted({(e["pid"], e["tid"]) for e in shown})
    row = {track: index for index, track in enumerate(used)}
    figure, axes = plt.subplots(figsize=(12, 0.45 * len(used) + 1.4))
    for event in shown:
        y = row[(event["pid"], event["tid"])]
        axes.barh(y, max(event["dur"] / 1000, 0.02), left=event["ts"] / 1000, height=0.6, color=COLOURS[event["cat"]])
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for finish in (e for e in events if e["ph"] == "f" and e["id"] in starts):
        start = starts[finish["id"]]
        ends = (start["pid"], start["tid"]), (finish["pid"], finish["tid"])
        if start_ms <= start["ts"] / 1000 <= end_ms and ends[0] in row and ends[1] in row:
            xs = [start["ts"] / 1000, finish["ts"] / 1000]
            axes.plot(xs, [row[ends[0]], row[ends[1]]], color="#555555", linewidth=0.6)
    labels = [f"{nodes[pid].split(' (')[0]}: {names[(pid, tid)]}" for pid, tid in used]
    axes.set_yticks(range(len(used)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlim(start_ms, end_ms)
    axes.set_xlabel("ms since the trace began")
    axes.set_title(title, fontsize=10)
    for kind, colour in COLOURS.items():
        axes.barh(-10, 0, color=colour, label=kind)
    axes.set_ylim(len(used) - 0.5, -0.5)
    axes.legend(loc="lower right", fontsize=8, ncols=len(COLOURS))
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def main() -> None:
    """Read the command line, draw."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="a timeline file")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--start-ms", type=float, default=0.0, help="where the window starts")
    parser.add_argument("--ms", type=float, help="how long the window is (default: to the end)")
    parser.add_argument("--title", default="", help="a title over the picture")
    args = parser.parse_args()
    with open(args.trace) as file:
        document = json.load(file)
    draw(document, args.out, args.start_ms, args.ms, args.title)


if __name__ == "__main__":
    main()
