"""Per-endpoint counters and handler-time histograms, cheap enough to leave on.

Every message an actor handles (call, tell, stream, batch run) is counted
under its endpoint with how long its handler took and whether it raised. Times
go into a sparse histogram of quarter-octave buckets of nanoseconds: a bucket
is four bits of the duration's magnitude, so recording is an integer
``bit_length`` and a dict increment, and a quantile read from it is within
about 19 % of the true one. ``actorch status`` and the Prometheus exporter
read them through the node service.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EndpointStats", "bucket_of", "bucket_upper"]

_SUB = 2  # bits below the leading one that pick the bucket within an octave (4 per octave)
_MASK = (1 << _SUB) - 1


def bucket_of(ns: int) -> int:
    """The histogram bucket of a duration of ``ns`` nanoseconds."""
    bits = ns.bit_length()
    if bits <= _SUB + 1:
        return ns  # under 8 ns: one bucket per value
    return (bits << _SUB) | ((ns >> (bits - _SUB - 1)) & _MASK)


def bucket_upper(bucket: int) -> int:
    """The largest duration in nanoseconds that falls in ``bucket``."""
    bits = bucket >> _SUB
    if bits <= _SUB + 1:
        return bucket
    low = (1 << (bits - 1)) | ((bucket & _MASK) << (bits - _SUB - 1))
    return low + (1 << (bits - _SUB - 1)) - 1


class EndpointStats:
    """One endpoint's messages handled, errors, total handler time and its histogram."""

    __slots__ = ("buckets", "calls", "errors", "total_ns")

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.total_ns = 0
        self.buckets: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"<EndpointStats calls={self.calls} errors={self.errors}>"

    def record(self, ns: int, failed: bool, count: int = 1) -> None:
        """Count ``count`` messages whose handler took ``ns`` nanoseconds (together), and whether it raised."""
        self.calls += count
        self.total_ns += ns
        if failed:
            self.errors += count
        bits = ns.bit_length()  # bucket_of(ns), written out: this runs for every message
        bucket = ns if bits <= _SUB + 1 else (bits << _SUB) | ((ns >> (bits - _SUB - 1)) & _MASK)
        buckets = self.buckets
        buckets[bucket] = buckets.get(bucket, 0) + 1

    def quantile(self, q: float) -> float | None:
        """The handler time (seconds) under which a fraction ``q`` of the recorded runs fell; None if none ran."""
        runs = sum(self.buckets.values())
        if not runs:
            return None
        rank = q * runs
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return bucket_upper(bucket) / 1e9
        return bucket_upper(max(self.buckets)) / 1e9

    def snapshot(self) -> dict[str, Any]:
        """What travels to ``actorch status`` and the exporter (plain data)."""
        return {
            "calls": self.calls,
            "errors": self.errors,
            "seconds": self.total_ns / 1e9,
            "p50": self.quantile(0.5),
            "p99": self.quantile(0.99),
            "buckets": [[bucket_upper(bucket) / 1e9, count] for bucket, count in sorted(self.buckets.items())],
        }
