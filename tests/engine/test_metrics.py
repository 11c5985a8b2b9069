"""The histograms the nodes keep, an endpoint's counters, and the metrics instrument that fills them."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest

from actorch._engine.message import CallContext, Message
from actorch._engine.metrics import (
    FINE_BOUNDS_NS,
    PROMETHEUS_BOUNDS_NS,
    EndpointStats,
    Histogram,
    Metrics,
    bucket_of,
    bucket_upper,
    stats_of,
)


def test_fine_bounds_grow_by_at_most_a_quarter_from_a_microsecond_to_a_day_and_more() -> None:
    assert FINE_BOUNDS_NS[0] == 1_000
    assert FINE_BOUNDS_NS[-1] == 10**14
    assert all(low < high <= low * 1.25 for low, high in itertools.pairwise(FINE_BOUNDS_NS))


def test_every_prometheus_bound_is_a_fine_bound() -> None:
    assert set(PROMETHEUS_BOUNDS_NS) <= set(FINE_BOUNDS_NS)
    assert list(PROMETHEUS_BOUNDS_NS) == sorted(PROMETHEUS_BOUNDS_NS)
    assert PROMETHEUS_BOUNDS_NS[0] == 10_000  # 10 µs
    assert PROMETHEUS_BOUNDS_NS[-1] == 300 * 10**9  # 5 minutes


@pytest.mark.parametrize("ns", [0, 1, 999, 1000, 1001, 1250, 1251, 123_456_789, 10**12, 10**14])
def test_a_duration_falls_in_the_first_bucket_whose_bound_holds_it(ns: int) -> None:
    bucket = bucket_of(ns)
    upper = bucket_upper(bucket)
    assert upper is not None
    assert ns <= upper
    assert bucket == 0 or FINE_BOUNDS_NS[bucket - 1] < ns


def test_a_duration_past_every_bound_falls_in_the_last_bucket_which_has_no_bound() -> None:
    bucket = bucket_of(10**14 + 1)
    assert bucket == len(FINE_BOUNDS_NS)
    assert bucket_upper(bucket) is None


def test_histogram_counts_by_bucket_and_sums() -> None:
    histogram = Histogram(PROMETHEUS_BOUNDS_NS)
    for ns in (5_000, 10_000, 10_001, 2 * 10**9, 10**12):
        histogram.observe(ns)
    assert histogram.count == 5
    assert histogram.total_ns == 5_000 + 10_000 + 10_001 + 2 * 10**9 + 10**12
    assert histogram.buckets() == [[1e-05, 2], [2.5e-05, 1], [2.5, 1], [None, 1]]
    snapshot = histogram.snapshot()
    assert snapshot == {"count": 5, "seconds": histogram.total_ns / 1e9, "buckets": histogram.buckets()}
    json.dumps(snapshot)  # it travels as plain data


def test_histogram_quantiles_are_the_bound_of_the_bucket_they_fall_in() -> None:
    histogram = Histogram()
    assert histogram.quantile(0.5) is None
    for _ in range(98):
        histogram.observe(1_100)  # in (1 µs, 1.25 µs]
    histogram.observe(10**6)
    histogram.observe(10**15)  # past the last bound
    assert histogram.quantile(0.5) == 1.25e-6
    assert histogram.quantile(0.99) == 1e-3
    assert histogram.quantile(1.0) == 1e5  # the last bucket reads as the last bound


def test_endpoint_stats_count_messages_errors_runs_and_waits() -> None:
    stats = EndpointStats()
    for _ in range(98):
        stats.record(1_000, False)
    stats.record(1_000_000, True, waited=40_000)
    stats.record(50_000_000, False, count=3, waited=2_000_000)  # a batch of 3 in one run
    assert stats.calls == 102
    assert stats.errors == 1
    assert stats.count == 100  # runs: a batch is one
    assert stats.quantile(0.5) == pytest.approx(1e-6)
    assert stats.quantile(0.99) == pytest.approx(1e-3)
    assert stats.quantile(1.0) == pytest.approx(5e-2)
    assert stats.waits is not None
    assert stats.waits.count == 2  # only the runs that waited
    snapshot = stats.snapshot()
    assert snapshot["calls"] == 102
    assert snapshot["seconds"] == pytest.approx((98_000 + 1_000_000 + 50_000_000) / 1e9)
    assert sum(runs for _, runs in snapshot["buckets"]) == 100
    assert snapshot["waits"] == {"count": 2, "seconds": 2.04e-3, "buckets": [[4e-05, 1], [2e-3, 1]]}
    json.dumps(snapshot)


def test_endpoint_stats_without_a_wait_show_no_waits() -> None:
    stats = EndpointStats()
    stats.record(1_000, False)
    assert stats.waits is None
    assert "waits" not in stats.snapshot()


def test_the_metrics_instrument_counts_each_run_and_its_wait_with_the_actor() -> None:
    actor = SimpleNamespace(actor_id=9, label="actor 'a' (Hop) on node 0", instance=object(), metrics={})
    metrics = Metrics()
    queued = Message("relay", (), {}, 1, (), None, None)
    queued.queued_at, queued.started = 1_000, 5_000
    metrics.handled(actor, queued, 9_000, False, 1)
    inline = CallContext(actor.label, 2, (), "relay", None, 0)
    inline.started = 10_000
    metrics.handled(actor, inline, 12_000, True, 1)
    metrics.handled(actor, Message("double", (), {}, 3, (), None, None), 2_000, False, 3)  # a batch run of three
    relay = actor.metrics["relay"]
    assert relay is stats_of(actor, "relay")
    assert (relay.calls, relay.errors, relay.count, relay.total_ns) == (2, 1, 2, 6_000)
    assert relay.waits is not None
    assert (relay.waits.count, relay.waits.total_ns) == (1, 4_000)
    assert (actor.metrics["double"].calls, actor.metrics["double"].count) == (3, 1)
