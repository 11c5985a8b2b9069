"""How responsive a node's event loop is: a timer every half second that notes how late it fired.

A loop that runs handlers back to back, or one handler that never yields,
fires its timers late: the lateness is the time a message that arrives now
waits before anything looks at it. The probe is one timer per node, so it costs
the message path nothing. A loop that is blocked fires nothing at all; from
another thread that shows as a probe overdue (``behind``), which is how
``actorch stacks`` and the status server tell a blocked loop without its help.
Every probe's lateness also goes into a histogram for Prometheus, whose
scrapes, seconds apart, would miss the spikes between them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from actorch._engine.metrics import PROMETHEUS_BOUNDS_NS, Histogram

__all__ = ["BLOCKED_AFTER", "PROBE_INTERVAL", "LoopLag"]

PROBE_INTERVAL = 0.5
"""Seconds between two probes of the loop."""
BLOCKED_AFTER = 1.0
"""Seconds a probe may be overdue before the loop counts as blocked (not responsive)."""
_KEPT = 120  # probes the worst lag is taken over: the last minute


class LoopLag:
    """A node's loop probe: the last lateness, the worst of the last minute, how overdue the next one is, every one."""

    __slots__ = ("_due", "_handle", "_loop", "_recent", "lags", "last", "probes")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due = loop.time() + PROBE_INTERVAL
        self._handle: asyncio.TimerHandle | None = None
        self._recent: deque[float] = deque(maxlen=_KEPT)
        self.last = 0.0
        self.probes = 0
        self.lags = Histogram(PROMETHEUS_BOUNDS_NS)  # every probe's lateness

    def __repr__(self) -> str:
        return f"<LoopLag last={self.last * 1e3:.1f} ms behind={self.behind() * 1e3:.0f} ms>"

    def start(self) -> None:
        """Probe from now on (on the loop's thread)."""
        self._due = self._loop.time() + PROBE_INTERVAL
        self._handle = self._loop.call_at(self._due, self._probe)

    def stop(self) -> None:
        """Probe no more."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _probe(self) -> None:
        now = self._loop.time()
        self.last = late = now - self._due
        self._recent.append(late)
        self.probes += 1
        self.lags.observe(max(int(late * 1e9), 0))  # a timer may fire a clock tick early
        self._due = now + PROBE_INTERVAL
        self._handle = self._loop.call_at(self._due, self._probe)

    def behind(self) -> float:
        """Seconds the next probe is overdue (0 while the loop keeps up); any thread may ask."""
        if self._handle is None:
            return 0.0
        return max(self._loop.time() - self._due, 0.0)  # the loop's clock is time.monotonic: read from any thread

    def snapshot(self) -> dict[str, Any]:
        """The loop's state as plain data: ``lag`` (last), ``lag_max`` (last minute), ``behind``, ``responsive``.

        And ``lags``: the histogram of every probe's lateness (``Histogram.snapshot``).
        """
        behind = self.behind()
        recent = list(self._recent)
        return {
            "lag": self.last,
            "lag_max": max([*recent, behind], default=0.0),
            "behind": behind,
            "responsive": behind < BLOCKED_AFTER,
            "lags": self.lags.snapshot(),
        }
