"""``actorch stacks``: where every node of a running system is, line by line.

Rank 0 gathers it on a thread (``GET /stacks``, see ``status``), so it answers
also when an event loop is blocked. For each node: whether its loop keeps up,
each actor's running handlers as await chains down to the line each is on
(with what it waits for), the loop's other tasks, and every thread's stack.
Frames read as in a Python traceback, outermost first.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from actorch._launch.cli_status import StatusUnavailable, fail_command, fetch_served, find_address

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
        print(format_stacks(found, threads=not args.no_threads, tasks=not args.no_tasks), end="", flush=True)
    return 0


def format_stacks(found: dict[str, Any], *, threads: bool = True, tasks: bool = True) -> str:
    """The text ``actorch stacks`` prints for what ``GET /stacks`` answered."""
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
                lines.extend(_chain(handler["chain"], "      "))
        if tasks and node["tasks"]:
            lines.append(f"  other tasks ({len(node['tasks'])})")
            for task in node["tasks"]:
                now = " (running now)" if task["running_now"] else ""
                lines.append(f"    task {task['name']}{now}")
                lines.extend(_chain(task["chain"], "      "))
        if threads:
            lines.append(f"  threads ({len(node['threads'])})")
            for thread in node["threads"]:
                lines.append(f"    thread {thread['name']} (id {thread['id']})")
                lines.extend(_chain(thread["frames"], "      "))
        lines.append("")
    return "\n".join(lines) + "\n"


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
