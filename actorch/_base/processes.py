"""Whether a process of this host is still the one a file named: not gone, not a zombie, its pid not reused.

Runtime files name a running system's processes by pid, and shared-memory
segments name their maker; both outlive the process. ``/proc`` (Linux) tells
a zombie, which still has its pid, and a pid reused by a later process, which
started at another time; elsewhere only whether the pid exists can be told.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["alive", "started"]


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); None where there are none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rpartition(")")[2].split()  # the command name may hold spaces and parentheses


def started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux), to tell a reused pid; None if unknown."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def alive(pid: int, start: int | None = None) -> bool:
    """Whether ``pid`` is still a running process of this user (and the one that started at ``start``, if given).

    A process of another user under that pid counts as gone: the files that
    name pids are this user's, so the pid was reused.
    """
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no /proc: existence is all that can be told
    if fields[0] in ("Z", "X"):
        return False
    return start is None or int(fields[19]) == start
