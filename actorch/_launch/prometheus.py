"""The system's status in Prometheus' text format (``pip install 'actorch[metrics]'``).

Rank 0's status server answers ``GET /metrics`` with what :func:`metrics_text`
makes of a gathered status: per actor class and endpoint, messages handled,
handler errors and a histogram of handler times; per node, whether it is up,
its mailbox depths, how long the oldest message of each mailbox has waited,
how late its event loop runs, and the bytes it sent and received.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["LE_BOUNDS", "metrics_text"]

LE_BOUNDS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)
"""Upper bounds (seconds) of the handler-time histogram's buckets, as Prometheus reads them."""


def metrics_text(status: dict[str, Any]) -> bytes:
    """``status`` (as ``gather_status`` returns it) in Prometheus' text exposition format.

    Raises:
        ImportError: ``prometheus_client`` is not installed.
    """
    from prometheus_client import CollectorRegistry, generate_latest  # noqa: PLC0415 - an optional dependency

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(status))
    text: bytes = generate_latest(registry)
    return text


class _Collector:
    """A one-shot collector of one gathered status."""

    def __init__(self, status: dict[str, Any]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (  # noqa: PLC0415 - an optional dependency
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        labels = ["node", "actor_class", "endpoint"]
        handled = CounterMetricFamily("actorch_messages_handled", "Messages an endpoint handled", labels=labels)
        errors = CounterMetricFamily("actorch_handler_errors", "Messages whose handler raised", labels=labels)
        seconds = HistogramMetricFamily("actorch_handler_seconds", "Time handlers took", labels=labels)
        up = GaugeMetricFamily(
            "actorch_node_up", "1 while the node is part of the system, 0 once lost", labels=["node"]
        )
        depth = GaugeMetricFamily(
            "actorch_mailbox_depth", "Messages waiting in an actor's mailbox", labels=["node", "actor"]
        )
        waited = GaugeMetricFamily(
            "actorch_mailbox_oldest_wait_seconds",
            "How long the oldest message waiting in an actor's mailbox has waited (0: none waits)",
            labels=["node", "actor"],
        )
        lag = GaugeMetricFamily(
            "actorch_event_loop_lag_seconds",
            "How late the node's event loop ran its last probe (taken every 0.5 s; a blocked loop: how long blocked)",
            labels=["node"],
        )
        sent = CounterMetricFamily("actorch_bytes_sent", "Message bytes a node sent (tensors apart)", labels=["node"])
        tensors = CounterMetricFamily("actorch_tensor_bytes_sent", "Tensor bytes a node sent", labels=["node"])
        received = CounterMetricFamily("actorch_bytes_received", "Message bytes a node received", labels=["node"])
        for node in self._status["nodes"]:
            rank = str(node["rank"])
            up.add_metric([rank], 0.0 if "lost" in node else 1.0)
            if "statistics" not in node:
                continue
            stats = node["statistics"]
            if "loop" in node:
                lag.add_metric([rank], max(node["loop"]["lag"], node["loop"]["behind"]))
            sent.add_metric([rank], stats["bytes_sent"])
            tensors.add_metric([rank], stats["tensor_bytes_sent"])
            received.add_metric([rank], stats["bytes_received"])
            by_class: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for actor in node["actors"]:
                depth.add_metric([rank, actor["label"]], actor["queued"])
                if "queued_seconds" in actor:
                    waited.add_metric([rank, actor["label"]], actor["queued_seconds"] or 0.0)
                for endpoint, snapshot in actor["endpoints"].items():
                    by_class.setdefault((actor["class"], endpoint), []).append(snapshot)
            for (cls, endpoint), snapshots in sorted(by_class.items()):
                key = [rank, cls, endpoint]
                handled.add_metric(key, sum(snapshot["calls"] for snapshot in snapshots))
                errors.add_metric(key, sum(snapshot["errors"] for snapshot in snapshots))
                seconds.add_metric(
                    key,
                    _cumulative([bucket for snapshot in snapshots for bucket in snapshot["buckets"]]),
                    sum(snapshot["seconds"] for snapshot in snapshots),
                )
        yield from (handled, errors, seconds, up, depth, waited, lag, sent, tensors, received)


def _cumulative(buckets: list[list[float]]) -> list[tuple[str, float]]:
    """Prometheus' cumulative ``le`` buckets from (upper bound, runs) pairs; a run counts under every bound above it."""
    counts = [0.0] * len(LE_BOUNDS)
    for upper, runs in buckets:
        for index, bound in enumerate(LE_BOUNDS):
            if upper <= bound:
                counts[index] += runs
                break
    total = sum(runs for _, runs in buckets)
    cumulative, seen = [], 0.0
    for bound, count in zip(LE_BOUNDS, counts, strict=True):
        seen += count
        cumulative.append((repr(bound), seen))
    cumulative.append(("+Inf", float(total)))
    return cumulative
