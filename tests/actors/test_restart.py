"""``restart``: what failures count against a ``Restart`` policy (``count_failure``), and its backoff."""

from __future__ import annotations

import time
from collections import deque

from actorch._actors.restart import Restart, count_failure


def test_count_failure_counts_the_failures_within_the_policy_s_window() -> None:
    long_ago = time.monotonic() - 120.0
    history = deque([long_ago])
    assert count_failure(history, Restart(within=60.0)) == 1  # the old one no longer counts, and is dropped
    assert list(history) != [long_ago]
    assert len(history) == 1


def test_count_failure_counts_every_failure_without_a_window() -> None:
    history = deque([time.monotonic() - 3600.0])
    assert count_failure(history, Restart(within=None)) == 2
    assert count_failure(history, Restart(within=None)) == 3


def test_restart_waits_longer_after_each_failure_up_to_its_longest() -> None:
    policy = Restart(backoff=0.5, factor=2.0, max_backoff=1.5)
    assert [policy.delay(failures) for failures in (1, 2, 3)] == [0.5, 1.0, 1.5]
