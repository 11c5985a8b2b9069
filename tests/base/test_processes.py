"""Whether a process a file names by pid still runs: gone, a zombie, or its pid reused count as not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from actorch._base.processes import alive, started


def test_a_process_is_gone_once_it_ended_even_before_it_is_reaped() -> None:
    assert alive(os.getpid())
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while alive(zombie.pid) and time.monotonic() < deadline:  # ended, not yet waited for: a zombie
        time.sleep(0.01)
    assert not alive(zombie.pid)
    zombie.wait()
    assert not alive(zombie.pid)


def test_a_pid_that_started_at_another_time_is_another_process() -> None:
    start = started(os.getpid())
    assert start is not None
    assert alive(os.getpid(), start)
    assert not alive(os.getpid(), start + 1), "the pid was reused by a process that started later"
    assert started(1 << 30) is None
