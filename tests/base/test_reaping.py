"""A child process is reaped as soon as it has exited, also when its sentinel fired while it was still exiting.

The sentinel of a ``multiprocessing`` process fires when its files close,
which can come before the process has finished exiting (its other threads
still end). These tests stand in for that moment with a real child whose
"sentinel" is a pipe closed while the child still runs: the watch must reap
the child once it really exits, through a pidfd where the system has one and
by asking again where it has none.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actorch._base import reaping
from actorch._base.reaping import watch_exit


class EarlySentinel:
    """A child process whose sentinel fires at once, while it still runs for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.popen = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
        self.sentinel, writer = os.pipe()
        os.close(writer)  # readable (end of file) from now on, as if the child's files had closed
        self.polls = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def is_alive(self) -> bool:
        self.polls += 1
        return self.popen.poll() is None

    def close(self) -> None:
        os.close(self.sentinel)
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


async def reaped(child: EarlySentinel) -> int:
    """Watch ``child`` until the watch says it has exited; its exit code then."""
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    watch_exit(child, loop, lambda: exited.set_result(child.popen.returncode))
    async with asyncio.timeout(30):
        code: int = await exited
    return code


async def test_watch_exit_reaps_a_process_still_exiting_when_its_sentinel_fired() -> None:
    child = EarlySentinel(0.5)
    try:
        assert await reaped(child) == 0
        assert state(child.pid) == "gone", "reaped: no zombie left"
        if hasattr(os, "pidfd_open"):
            assert child.polls == 2, "once when the sentinel fired, once when the pidfd said it had exited"
    finally:
        child.close()


async def test_watch_exit_asks_again_where_the_system_has_no_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reaping, "_open_pidfd", lambda pid: None)
    child = EarlySentinel(0.5)
    try:
        assert await reaped(child) == 0
        assert state(child.pid) == "gone"
        assert child.polls > 2, "it asked again until the process had exited"
    finally:
        child.close()


async def test_watch_exit_calls_back_at_once_for_a_process_that_has_exited() -> None:
    child = EarlySentinel(0.0)
    try:
        child.popen.wait()
        assert await reaped(child) == 0
        assert child.polls == 1
    finally:
        child.close()
