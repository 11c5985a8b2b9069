"""Reaping a child process from the event loop as soon as it has exited, however its threads end.

A ``multiprocessing`` process's sentinel becomes readable when the process's
files close, which can be before the process has finished exiting: while
other threads of it still end, it is not yet a zombie, and ``waitpid`` finds
nothing to reap. Reaping once when the sentinel fires would leave it a zombie
until something else happens to reap it. :func:`watch_exit` therefore reaps
when the sentinel fires and, if the process has not finished exiting, waits
on a pidfd (Linux), which becomes readable only once the whole process has
exited; where there is none, it asks again after a short and growing pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Protocol

__all__ = ["ChildProcess", "watch_exit"]

FIRST_POLL = 0.001
"""Seconds before asking again whether a process whose sentinel fired has exited, where there is no pidfd."""
LAST_POLL = 0.1
"""The longest pause between two such questions."""


class ChildProcess(Protocol):
    """A process this one started (a ``multiprocessing.Process``)."""

    @property
    def pid(self) -> int | None:
        """Its process id."""

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable once its files are closed, as it exits."""

    def is_alive(self) -> bool:
        """Whether it still runs; once it has exited, this reaps it."""


def watch_exit(
    process: ChildProcess, loop: asyncio.AbstractEventLoop, on_exit: Callable[[], object] | None = None
) -> None:
    """Reap ``process`` on ``loop`` as soon as it has exited, then call ``on_exit()`` there, if given."""
    _ExitWatch(process, on_exit, loop).start()


class _ExitWatch:
    """One process watched: its sentinel first, then its pidfd or a poll until it can be reaped."""

    __slots__ = ("_loop", "_on_exit", "_process")

    def __init__(
        self, process: ChildProcess, on_exit: Callable[[], object] | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._process = process
        self._on_exit = on_exit
        self._loop = loop

    def __repr__(self) -> str:
        return f"<ExitWatch pid {self._process.pid}>"

    def start(self) -> None:
        self._loop.add_reader(self._process.sentinel, self._sentinel_fired)

    def _sentinel_fired(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._process.sentinel)
        if not self._process.is_alive():
            self._exited()
            return
        pidfd = _open_pidfd(self._process.pid)
        if pidfd is None:
            self._loop.call_later(FIRST_POLL, self._poll, FIRST_POLL)
        else:
            self._loop.add_reader(pidfd, self._pidfd_ready, pidfd)

    def _pidfd_ready(self, pidfd: int) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(pidfd)
        os.close(pidfd)
        self._poll(0.0)  # the whole process has exited: this reaps it at once

    def _poll(self, pause: float) -> None:
        if self._process.is_alive():
            pause = min(max(2 * pause, FIRST_POLL), LAST_POLL)
            self._loop.call_later(pause, self._poll, pause)
            return
        self._exited()

    def _exited(self) -> None:
        if self._on_exit is not None:
            self._on_exit()


def _open_pidfd(pid: int | None) -> int | None:
    """A pidfd of ``pid`` (readable once it has exited), or None where the system offers none."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pid is None or pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:  # an old kernel, or a sandbox that forbids it: poll instead
        return None
    return fd
