"""A script that calls ``actorch.run`` when it is imported: caught in the worker, named by rank 0.

A local worker is a new process (multiprocessing's ``spawn``) that imports the
main script to find its actor classes. A script that calls ``actorch.run`` at
its top level, outside ``if __name__ == "__main__":``, would then start a
system in every worker. The worker refuses, and leaves the reason in a report
file that rank 0 reads when it sees the worker exit during the start, so that
rank 0's own error names the cause and the fix rather than only an exit code.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys

from actorch._launch.services.runtime import runtime_dir

__all__ = ["WORKER_OF_ENV", "refuse_run_while_imported", "worker_report"]

WORKER_OF_ENV = "ACTORCH_WORKER_OF"
"""Set by rank 0 for the local workers it starts: its own pid, so a worker knows whom to report to."""


def refuse_run_while_imported() -> None:
    """Raise if this process is a spawned process still importing the main script (it has no main guard).

    Raises:
        RuntimeError: ``actorch.run`` was called while multiprocessing imports
            the main script in a new process; the message names the script
            and the fix.
    """
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    script = getattr(sys.modules.get("__mp_main__"), "__file__", None) or "the main script"
    message = (
        f"{script} calls actorch.run() when it is imported, and every worker process imports it: "
        'put the call under `if __name__ == "__main__":`'
    )
    if os.environ.get(WORKER_OF_ENV) in _starters():
        with contextlib.suppress(OSError):
            reports = runtime_dir() / "reports"
            reports.mkdir(mode=0o700, exist_ok=True)
            (reports / f"{os.getpid()}.txt").write_text(message)
    raise RuntimeError(message)


def worker_report(pid: int) -> str | None:
    """What the local worker ``pid`` reported before it exited, if anything (the report is removed)."""
    try:
        path = runtime_dir() / "reports" / f"{pid}.txt"
        found = path.read_text()
    except OSError:
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    return found


def _starters() -> tuple[str, ...]:
    """The pids that may have started this process: its parent, and the parent's parent (through a forkserver)."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/stat", encoding="ascii") as file:
            grandparent = file.read().rpartition(")")[2].split()[1]
    except (OSError, IndexError):
        return (str(parent),)
    return (str(parent), grandparent)
