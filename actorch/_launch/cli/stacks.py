"""``actorch stacks``: where every node of a running system is, line by line.

Rank 0 gathers it on a thread (``GET /stacks``, see ``services/status``), so it answers
also when an event loop is blocked. For each node: whether its loop keeps up,
each actor's running handlers as await chains down to the line each is on
(with what it waits for), the loop's other tasks, and every thread's stack.
Frames read as in a Python traceback, outermost first. By default only the
user's own frames are shown (not actorch's, the standard library's or an
installed package's), and only the tasks and threads that have some, the
loop's thread aside (its handler shows where it is): what a stuck program
needs, in a few lines. ``--all`` shows every frame, task and thread.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from actorch._launch.cli.status import StatusUnavailable, fail_command, fetch_served, find_address

__all__ = ["format_stacks", "stacks_command"]


def stacks_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``actorch stacks``: print where every node is, as text or JSON; the exit code."""
    address = find_address(args, "stacks")
    try:
        found = fetch_served(address, "/stacks", timeout=30.0)
    except StatusUnavailable as exc:
        fail_command("stacks", str(exc), as_json=args.json, address=address)
    if args.json:
        print(json.dumps(found), flush=True)
    else:
        text = format_stacks(found, threads=not args.no_threads, tasks=not args.no_tasks, everything=args.all)
        print(text, end="", flush=True)
    return 0


LEFT_OUT = (
    "(your own frames only: actorch's, the standard library's and installed packages' are left out, and the tasks "
    "and threads that have none; actorch stacks --all shows them)"
)
"""The last line of ``actorch stacks`` without ``--all``."""


def format_stacks(found: dict[str, Any], *, threads: bool = True, tasks: bool = True, everything: bool = False) -> str:
    """The text ``actorch stacks`` prints for what ``GET /stacks`` answered.

    Only the user's own frames, and the tasks and threads that have some
    (not the loop's thread), unless ``everything``; ``threads`` and ``tasks``
    False leave those out altogether.
    """
    view = _View(everything)
    lines: list[str] = []
    for node in found["nodes"]:
        rank = node["rank"]
        if "lost" in node:
            lines.append(f"node {rank}: lost ({node['lost']})")
            continue
        if "unanswered" in node:
            lines.append(f"node {rank}: not answering ({node['unanswered']})")
            continue
        lines.append(f"node {rank} ({node['host']}, pid {node['pid']}): event loop {_loop_state(node['loop'])}")
        for actor in node["actors"]:
            queued = f", {actor['queued']} queued" if actor["queued"] else ""
            who = f"actor {actor['name']} ({actor['class']})" if actor["name"] else actor["label"]
            if not actor["handlers"]:
                lines.append(f"  {who}: idle{queued}")
                continue
            lines.append(f"  {who}{queued}")
            for handler in actor["handlers"]:
                lines.append(f"    handler {handler['endpoint']!r}, {_running(handler)}")
                lines.extend(_chain(view.frames(handler["chain"]), "      "))
        if tasks:
            lines += view.section("other tasks", [(_task_line(task), task["chain"], False) for task in node["tasks"]])
        if threads:
            listed = [(_thread_line(thread), thread["frames"], thread.get("loop", False)) for thread in node["threads"]]
            lines += view.section("threads", listed)
        lines.append("")
    if not everything:
        lines.append(LEFT_OUT)
    return "\n".join(lines) + "\n"


class _View:
    """What ``actorch stacks`` shows of chains: every frame, or the user's own only."""

    def __init__(self, everything: bool) -> None:
        self.everything = everything

    def frames(self, chain: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The frames of ``chain`` shown, and what it awaits (a frame that does not say whose it is: shown)."""
        return chain if self.everything else [frame for frame in chain if frame.get("user", True)]

    def section(self, title: str, entries: list[tuple[str, list[dict[str, Any]], bool]]) -> list[str]:
        """A titled list of tasks or threads, ``(heading, chain, runs the loop)`` each; only those with frames shown.

        The loop's thread is left out unless ``everything``: its handler or task shows where it is.
        """
        shown = [(heading, self.frames(chain)) for heading, chain, loop in entries if self.everything or not loop]
        shown = [(heading, frames) for heading, frames in shown if self.everything or _has_frames(frames)]
        if not shown:
            return []
        lines = [f"  {title} ({len(shown)})"]
        for heading, frames in shown:
            lines.append(f"    {heading}")
            lines.extend(_chain(frames, "      "))
        return lines


def _task_line(task: dict[str, Any]) -> str:
    return f"task {task['name']}{' (running now)' if task['running_now'] else ''}"


def _thread_line(thread: dict[str, Any]) -> str:
    return f"thread {thread['name']} (id {thread['id']})"


def _has_frames(chain: list[dict[str, Any]]) -> bool:
    return any("file" in frame for frame in chain)


def _loop_state(loop: dict[str, Any]) -> str:
    if not loop["responsive"]:
        return f"BLOCKED (not responding for {loop['behind']:.1f} s)"
    return f"responsive (lag {loop['lag'] * 1e3:.1f} ms, at most {loop['lag_max'] * 1e3:.1f} ms in the last minute)"


def _running(handler: dict[str, Any]) -> str:
    seconds = handler["seconds"]
    since = "not begun yet" if seconds is None else f"running for {seconds:.1f} s"
    return f"{since}, on the loop thread now" if handler["running_now"] else since


def _chain(frames: list[dict[str, Any]], indent: str) -> list[str]:
    """Frames as a traceback shows them; what a suspended chain waits for last."""
    lines = []
    for frame in frames:
        if "awaiting" in frame:
            lines.append(f"{indent}awaiting {frame['awaiting']}")
            continue
        lines.append(f'{indent}File "{frame["file"]}", line {frame["line"]}, in {frame["function"]}')
        if frame["code"]:
            lines.append(f"{indent}  {frame['code']}")
    return lines
