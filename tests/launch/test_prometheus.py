"""What ``GET /metrics`` serves: the status in Prometheus' text format, parsed back as Prometheus reads it.

The scrape of a live multi-process system (bytes on the lane and on torch
RPC) is in ``test_cli``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from actors import Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from actorch._engine.metrics import EndpointStats, Histogram
from actorch._launch.services.prometheus import LE_BOUNDS, metrics_text
from actorch._launch.services.status import gather_status
from actorch.testing import LocalWorld

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _parsed(text: bytes) -> tuple[dict[str, str], Samples]:
    """Each family's type by name, and every sample's value by its name and labels (``le`` among them)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        types[family.name] = family.type
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return types, samples


def _histogram(samples: Samples, name: str, **labels: str) -> tuple[list[tuple[str, float]], float, float]:
    """One series of histogram ``name``: its (le, cumulative count) pairs in order, its count and its sum."""
    key = tuple(sorted(labels.items()))
    buckets = []
    for (sample, its), value in samples.items():
        others = tuple(label for label in its if label[0] != "le")
        if sample == f"{name}_bucket" and others == key:
            buckets.append((dict(its)["le"], value))
    buckets.sort(key=lambda pair: float(pair[0]))
    return buckets, samples[f"{name}_count", key], samples[f"{name}_sum", key]


def _status() -> dict[str, Any]:
    """A status as ``gather_status`` makes it: one node with two actors, one lost node, one that did not answer."""
    add = EndpointStats()
    for ns in (3_000, 20_000, 20_000, 60_000, 2 * 10**9):
        add.record(ns, False)
    add.record(7_000, True, waited=30_000)
    add.record(4_000, False, count=2, waited=4 * 10**9)
    slow = EndpointStats()
    slow.record(10**15, False, waited=1_500)  # past every fine bound
    lags = Histogram(tuple(int(bound * 1e9) for bound in LE_BOUNDS))
    for ns in (100_000, 2_000_000, 2_000_000):
        lags.observe(ns)
    loop = {"lag": 0.002, "lag_max": 0.002, "behind": 0.0, "responsive": True, "lags": lags.snapshot()}
    return {
        "nodes": [
            {
                "rank": 0,
                "loop": loop,
                "statistics": {
                    "bytes_sent": 100,
                    "tensor_bytes_sent": 2048,
                    "bytes_received": 90,
                    "paths": {
                        "lane": {"bytes_sent": 80, "bytes_received": 70},
                        "torch_rpc": {"bytes_sent": 30, "bytes_received": 20},
                    },
                },
                "actors": [
                    {
                        "id": 7,
                        "name": "demo/a",
                        "class": "C",
                        "label": "actor 'demo/a' (C) on node 0",
                        "queued": 4,
                        "queued_seconds": 0.5,
                        "endpoints": {"add": add.snapshot(), "slow": slow.snapshot()},
                    },
                    {"id": 8, "name": None, "class": "C", "label": "actor C#8 on node 0", "queued": 0, "endpoints": {}},
                ],
            },
            {"rank": 1, "lost": "killed"},
            {"rank": 2, "unanswered": "TimeoutError()", "loop": {**loop, "behind": 3.0, "responsive": False}},
        ]
    }


def test_metrics_follow_prometheus_names_and_types() -> None:
    types, _ = _parsed(metrics_text(_status()))
    assert types == {
        "actorch_messages_handled": "counter",
        "actorch_handler_errors": "counter",
        "actorch_handler_seconds": "histogram",
        "actorch_mailbox_wait_seconds": "histogram",
        "actorch_mailbox_depth": "gauge",
        "actorch_mailbox_oldest_wait_seconds": "gauge",
        "actorch_node_up": "gauge",
        "actorch_event_loop_lag_seconds": "gauge",
        "actorch_event_loop_probe_lag_seconds": "histogram",
        "actorch_sent_bytes": "counter",
        "actorch_received_bytes": "counter",
        "actorch_sent_tensor_bytes": "counter",
        "actorch_bytes_sent": "counter",  # the deprecated aliases
        "actorch_tensor_bytes_sent": "counter",
        "actorch_bytes_received": "counter",
    }


def test_handler_histogram_buckets_are_exact_cumulative_counts_with_sum_and_count() -> None:
    _, samples = _parsed(metrics_text(_status()))
    labels = {"node": "0", "actor": "demo/a", "actor_class": "C", "endpoint": "add"}
    buckets, count, total = _histogram(samples, "actorch_handler_seconds", **labels)
    assert [bound for bound, _ in buckets] == [*(repr(bound) for bound in LE_BOUNDS), "+Inf"][: len(buckets)]
    assert len(buckets) == len(LE_BOUNDS) + 1
    by_bound = dict(buckets)
    assert by_bound["1e-05"] == 3  # 3 µs, 7 µs and the batch run of 4 µs
    assert by_bound["2.5e-05"] == 5  # and the two of 20 µs
    assert by_bound["5e-05"] == 5
    assert by_bound["0.0001"] == 6  # and 60 µs
    assert by_bound["2.5"] == 7  # and 2 s
    assert by_bound["+Inf"] == count == 7  # runs: the batch of 2 is one
    counts = [value for _, value in buckets]
    assert counts == sorted(counts)
    assert total == pytest.approx((3_000 + 40_000 + 60_000 + 2 * 10**9 + 7_000 + 4_000) / 1e9)
    assert samples["actorch_messages_handled_total", tuple(sorted(labels.items()))] == 8
    assert samples["actorch_handler_errors_total", tuple(sorted(labels.items()))] == 1


def test_a_run_past_every_bound_counts_under_inf_only() -> None:
    _, samples = _parsed(metrics_text(_status()))
    buckets, count, _ = _histogram(
        samples, "actorch_handler_seconds", node="0", actor="demo/a", actor_class="C", endpoint="slow"
    )
    assert dict(buckets)["300.0"] == 0
    assert dict(buckets)["+Inf"] == count == 1


def test_mailbox_waits_count_every_run_of_the_actor_those_that_started_at_once_as_zero() -> None:
    _, samples = _parsed(metrics_text(_status()))
    buckets, count, total = _histogram(
        samples, "actorch_mailbox_wait_seconds", node="0", actor="demo/a", actor_class="C"
    )
    by_bound = dict(buckets)
    assert count == 8  # 7 runs of add, 1 of slow
    assert by_bound["1e-05"] == 6  # 5 runs that started at once and the slow one's 1.5 µs wait
    assert by_bound["2.5e-05"] == 6
    assert by_bound["5e-05"] == 7  # 30 µs
    assert by_bound["2.5"] == 7
    assert by_bound["5.0"] == 8  # 4 s
    assert total == pytest.approx((30_000 + 4 * 10**9 + 1_500) / 1e9)
    unnamed, unnamed_count, _ = _histogram(
        samples, "actorch_mailbox_wait_seconds", node="0", actor="C#8", actor_class="C"
    )
    assert unnamed_count == 0
    assert dict(unnamed)["+Inf"] == 0


def test_per_actor_gauges_name_the_actor_and_its_class() -> None:
    _, samples = _parsed(metrics_text(_status()))
    key = (("actor", "demo/a"), ("actor_class", "C"), ("node", "0"))
    assert samples["actorch_mailbox_depth", key] == 4
    assert samples["actorch_mailbox_oldest_wait_seconds", key] == 0.5


def test_node_metrics_show_bytes_by_path_loop_lag_and_who_is_up() -> None:
    _, samples = _parsed(metrics_text(_status()))
    assert samples["actorch_sent_bytes_total", (("node", "0"), ("path", "lane"))] == 80
    assert samples["actorch_sent_bytes_total", (("node", "0"), ("path", "torch_rpc"))] == 30
    assert samples["actorch_received_bytes_total", (("node", "0"), ("path", "lane"))] == 70
    assert samples["actorch_received_bytes_total", (("node", "0"), ("path", "torch_rpc"))] == 20
    assert samples["actorch_sent_tensor_bytes_total", (("node", "0"),)] == 2048
    assert samples["actorch_bytes_sent_total", (("node", "0"),)] == 100  # the aliases keep their meaning
    assert samples["actorch_tensor_bytes_sent_total", (("node", "0"),)] == 2048
    assert samples["actorch_bytes_received_total", (("node", "0"),)] == 90
    assert [samples["actorch_node_up", (("node", rank),)] for rank in "012"] == [1, 0, 1]
    assert samples["actorch_event_loop_lag_seconds", (("node", "0"),)] == 0.002
    assert samples["actorch_event_loop_lag_seconds", (("node", "2"),)] == 3.0  # blocked: how long
    lags, count, total = _histogram(samples, "actorch_event_loop_probe_lag_seconds", node="2")
    assert count == 3
    assert dict(lags)["0.0001"] == 1
    assert dict(lags)["0.0025"] == 3
    assert total == pytest.approx(0.0041)


async def test_a_live_system_serves_handler_times_mailbox_waits_bytes_by_path_and_loop_lag(world: LocalWorld) -> None:
    counter = await world[0].spawn(Counter, name="metrics/counter", on=1)
    gauge = await world[0].spawn(Gauge, name="metrics/gauge", on=2)
    for _ in range(5):
        await counter.call(Counter.add)
    await asyncio.gather(*(gauge.call(Gauge.work, 0.01) for _ in range(4)))  # one at a time: three wait
    await asyncio.sleep(0.6)  # every node's loop probe fires
    _, samples = _parsed(metrics_text(await gather_status(world._hosts[0])))

    adds, count, total = _histogram(
        samples, "actorch_handler_seconds", node="1", actor="metrics/counter", actor_class="Counter", endpoint="add"
    )
    assert count == 5
    assert 0 < total < 5.0
    assert dict(adds)["+Inf"] == 5
    works, count, total = _histogram(
        samples, "actorch_handler_seconds", node="2", actor="metrics/gauge", actor_class="Gauge", endpoint="work"
    )
    assert count == 4
    assert total >= 0.04  # each slept 10 ms
    assert dict(works)["0.005"] == 0

    waits, count, total = _histogram(
        samples, "actorch_mailbox_wait_seconds", node="2", actor="metrics/gauge", actor_class="Gauge"
    )
    assert count == 4
    assert total >= 0.01 + 0.02 + 0.03  # the three that waited, behind 1, 2 and 3 runs of 10 ms
    assert dict(waits)["0.005"] == 1  # only the first started at once
    _, count, _ = _histogram(
        samples, "actorch_mailbox_wait_seconds", node="1", actor="metrics/counter", actor_class="Counter"
    )
    assert count == 5

    for rank in "12":
        assert samples["actorch_received_bytes_total", (("node", rank), ("path", "in_process"))] > 0
        assert samples["actorch_sent_bytes_total", (("node", rank), ("path", "in_process"))] > 0
    assert samples["actorch_sent_bytes_total", (("node", "0"), ("path", "in_process"))] > 0
    for rank in "012":
        _, probes, _ = _histogram(samples, "actorch_event_loop_probe_lag_seconds", node=rank)
        assert probes >= 1
