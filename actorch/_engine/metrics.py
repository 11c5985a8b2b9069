"""Per-endpoint counters and histograms of handler times and mailbox waits: the instrument every node has.

The :class:`Metrics` instrument counts every message an actor handles (call,
tell, stream, batch run) under its endpoint, with how long its handler took
and whether it raised; one that had to wait in its actor's mailbox adds how
long it waited there. What it counts is kept with the actor's cell
(``Cell.metrics``), so that it lives and goes with the actor. Times
go into histograms of fixed buckets of nanoseconds (``FINE_BOUNDS_NS``):
thirteen to a decade from 1 µs to 10⁵ s, so that recording is one ``bisect``
and two adds, and a quantile read from one is within 25 % of the true one. The
buckets Prometheus gets (``PROMETHEUS_BOUNDS_NS``) are some of those bounds,
so that its cumulative counts are exact sums of fine ones. ``actorch status``
and the Prometheus exporter read them through the node service.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from actorch._engine.instruments import ActorView, Handling, Instrument

__all__ = [
    "FINE_BOUNDS_NS",
    "PROMETHEUS_BOUNDS_NS",
    "EndpointStats",
    "Histogram",
    "Metrics",
    "bucket_of",
    "bucket_upper",
    "stats_of",
]

_MANTISSAS = (100, 125, 150, 175, 200, 250, 300, 350, 400, 500, 600, 700, 800)  # per decade, in hundredths
FINE_BOUNDS_NS: tuple[int, ...] = (
    *(mantissa * 10**exponent // 100 for exponent in range(3, 14) for mantissa in _MANTISSAS),
    10**14,
)
"""Upper bounds (ns, inclusive) of the buckets of handler times and mailbox waits; a last bucket holds the rest.

Neighbours are at most 25 % apart: 1 µs, 1.25 µs, 1.5 µs ... 80,000 s, 100,000 s.
"""

PROMETHEUS_BOUNDS_NS: tuple[int, ...] = (
    *(tenths * 10**exponent for exponent in range(3, 9) for tenths in (10, 25, 50)),
    10 * 10**9,
    30 * 10**9,
    60 * 10**9,
    300 * 10**9,
)
"""The ``le`` bounds (ns) Prometheus gets: 10 µs to 5 minutes, 1-2.5-5 to a decade; each one of the fine bounds."""


def bucket_of(ns: int, bounds: tuple[int, ...] = FINE_BOUNDS_NS) -> int:
    """The bucket a duration of ``ns`` nanoseconds falls in: the first whose bound holds it (``len(bounds)``: none)."""
    return bisect_left(bounds, ns)


def bucket_upper(bucket: int, bounds: tuple[int, ...] = FINE_BOUNDS_NS) -> int | None:
    """The largest duration (ns) that falls in ``bucket``; None for the last one, which has no bound."""
    return bounds[bucket] if bucket < len(bounds) else None


class Histogram:
    """Durations counted by bucket of fixed upper bounds (nanoseconds), and their sum.

    Only the buckets something fell in are held (most endpoints see a few),
    so that a histogram costs a small dict, not one slot per bound.
    """

    __slots__ = ("bounds", "counts", "total_ns")

    def __init__(self, bounds: tuple[int, ...] = FINE_BOUNDS_NS) -> None:
        self.bounds = bounds
        self.counts: dict[int, int] = {}  # by bucket (index into bounds): how many fell in it
        self.total_ns = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} count={self.count} seconds={self.total_ns / 1e9:g}>"

    @property
    def count(self) -> int:
        """How many durations were counted."""
        return sum(self.counts.values())

    def observe(self, ns: int) -> None:
        """Count one duration of ``ns`` nanoseconds."""
        counts = self.counts
        bucket = bisect_left(self.bounds, ns)
        counts[bucket] = counts.get(bucket, 0) + 1
        self.total_ns += ns

    def quantile(self, q: float) -> float | None:
        """The duration (seconds) under which a fraction ``q`` of those counted fell, as a bucket bound; None if none.

        One that falls in the last bucket, which has no bound, reads as the last bound.
        """
        runs = self.count
        if not runs:
            return None
        rank = q * runs
        seen = 0
        bounds = self.bounds
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return bounds[min(bucket, len(bounds) - 1)] / 1e9
        return bounds[min(max(self.counts), len(bounds) - 1)] / 1e9

    def buckets(self) -> list[list[Any]]:
        """The buckets something fell in, as ``[upper bound in seconds, count]`` pairs (bound None: the last)."""
        bounds = self.bounds
        return [
            [bounds[bucket] / 1e9 if bucket < len(bounds) else None, count]
            for bucket, count in sorted(self.counts.items())  # one copy: another thread may read it (stacks)
        ]

    def snapshot(self) -> dict[str, Any]:
        """As plain data: ``count``, ``seconds`` (the sum) and ``buckets``."""
        buckets = self.buckets()
        return {"count": sum(count for _, count in buckets), "seconds": self.total_ns / 1e9, "buckets": buckets}


class EndpointStats(Histogram):
    """One endpoint's messages handled, errors, and histograms of its handler runs and of their mailbox waits.

    A batch run of several calls is one handler run (one count in the
    histogram) and as many messages (``calls``). ``waits`` counts only the
    runs that waited in the mailbox; those that started at once are the rest
    of the runs, and waited nothing.
    """

    __slots__ = ("calls", "errors", "waits")

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.errors = 0
        self.waits: Histogram | None = None  # made on the first run that waited

    def __repr__(self) -> str:
        return f"<EndpointStats calls={self.calls} errors={self.errors}>"

    def record(self, ns: int, failed: bool, count: int = 1, waited: int = 0) -> None:
        """Count ``count`` messages whose handler took ``ns`` nanoseconds (together), and whether it raised.

        ``waited``: nanoseconds the run waited in the mailbox before it started (0: it started at once).
        """
        self.calls += count
        if failed:
            self.errors += count
        counts = self.counts  # observe(ns), written out: this runs for every message
        bucket = bisect_left(FINE_BOUNDS_NS, ns)
        counts[bucket] = counts.get(bucket, 0) + 1
        self.total_ns += ns
        if waited:
            waits = self.waits
            if waits is None:
                waits = self.waits = Histogram()
            counts = waits.counts  # waits.observe(waited), written out likewise
            bucket = bisect_left(FINE_BOUNDS_NS, waited)
            counts[bucket] = counts.get(bucket, 0) + 1
            waits.total_ns += waited

    def snapshot(self) -> dict[str, Any]:
        """What travels to ``actorch status`` and the exporter (plain data).

        ``waits`` is there once a run has waited in the mailbox.
        """
        shown: dict[str, Any] = {
            "calls": self.calls,
            "errors": self.errors,
            "seconds": self.total_ns / 1e9,
            "p50": self.quantile(0.5),
            "p99": self.quantile(0.99),
            "buckets": self.buckets(),
        }
        if self.waits is not None:
            shown["waits"] = self.waits.snapshot()
        return shown


def stats_of(actor: ActorView, endpoint: str) -> EndpointStats:
    """What the actor's ``endpoint`` handled so far (made on its first message)."""
    metrics: dict[str, EndpointStats] = actor.metrics
    stats = metrics.get(endpoint)
    if stats is None:
        stats = metrics[endpoint] = EndpointStats()
    return stats


class Metrics(Instrument):
    """The instrument of every node: each endpoint's messages, errors, handler times and mailbox waits.

    ``actorch status``, the Prometheus exporter and a run's history read what
    it counts; ``Cell.statistics`` counts what the mailbox itself knows. A
    run's wait in the mailbox is read from its message when the run ends, in
    the one hook (``handled``): a second hook per message would cost more
    than the recording. Its hook runs unguarded (``guarded``): it is the
    runtime's own, and alone on its hook it is called directly.
    """

    __slots__ = ()

    guarded = False

    def handled(self, actor: ActorView, handling: Handling, ended: int, failed: bool, count: int) -> None:
        """Count ``count`` messages of a handler run, its time, whether it raised, and its wait in the mailbox."""
        started, queued_at = handling.started, handling.queued_at
        (actor.metrics.get(handling.endpoint) or stats_of(actor, handling.endpoint)).record(
            ended - started, failed, count, queued_at and started - queued_at
        )
