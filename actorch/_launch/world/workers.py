"""The local worker processes of a launch: how one ended, killing those lost or left, reaping them all at the end."""

from __future__ import annotations

import time
from typing import Any

from actorch._launch.world.guard import worker_report

__all__ = ["JOIN_TIMEOUT", "exit_of", "kill_lost", "kill_workers", "reap_workers"]

JOIN_TIMEOUT = 10.0
"""Seconds the launch waits for each local process to exit once the system has ended, before it kills it."""


def kill_workers(workers: list[Any]) -> str:
    """Kill the local workers that are still alive and reap them (for 1 s at most); say how many."""
    alive = [worker for worker in workers if worker.is_alive()]
    for worker in alive:
        worker.kill()
    deadline = time.monotonic() + 1.0
    for worker in alive:
        worker.join(max(0.0, deadline - time.monotonic()))
    return f"killed {len(alive)} local worker{'' if len(alive) == 1 else 's'}"


def reap_workers(workers: list[Any]) -> None:
    """Wait for the local workers to exit once the system has ended (``JOIN_TIMEOUT`` each), then kill the rest."""
    for worker in workers:
        worker.join(JOIN_TIMEOUT)
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(1.0)


def exit_of(worker: Any) -> str:
    """How a local worker ended during the start: its exit code, and the reason it reported, if any."""
    report = worker_report(worker.pid)
    return f"{worker.name} exited with code {worker.exitcode}" + (f": {report}" if report else "")


def kill_lost(workers: list[Any], rank: int) -> None:
    """Kill a local worker process that was lost while still running (stopped, cut off).

    Its names and calls are already gone; killed, it cannot come back as a
    stale node, and shutdown need not wait for it. Ranks that joined from
    elsewhere are not this process's to kill.
    """
    if not 1 <= rank <= len(workers):
        return
    worker = workers[rank - 1]
    if worker.is_alive():
        worker.kill()
