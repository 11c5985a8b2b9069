"""The system's status in Prometheus' text format (``pip install 'actorch[metrics]'``).

Rank 0's status server answers ``GET /metrics`` with what :func:`metrics_text`
makes of a gathered status: per actor and endpoint, messages handled, handler
errors and a histogram of handler times; per actor, a histogram of how long
messages waited in its mailbox, its mailbox depth and how long its oldest
message has waited; per node, whether it is up, how late its event loop runs
(now, and a histogram of every probe), and the bytes it sent and received on
each path. docs/operations.md lists every metric.

Names follow Prometheus' conventions: an ``actorch_`` prefix, base units
(seconds, bytes) named at the end, ``_total`` on counters. Three names of
earlier versions that did not (``actorch_bytes_sent_total``,
``actorch_tensor_bytes_sent_total``, ``actorch_bytes_received_total``) are
still served beside their new ones, as deprecated aliases.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any

from actorch._engine.metrics import PROMETHEUS_BOUNDS_NS

__all__ = ["LE_BOUNDS", "metrics_text"]

LE_BOUNDS = tuple(bound / 1e9 for bound in PROMETHEUS_BOUNDS_NS)
"""Upper bounds (seconds) of the histograms' buckets, as Prometheus reads them (``+Inf`` besides)."""
_LE_LABELS = tuple(map(repr, LE_BOUNDS))  # as Prometheus' own clients write them: 1e-05, 0.0001, 1.0


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


def _actor_label(actor: dict[str, Any]) -> str:
    """How the metrics name an actor of the status: by its name, or by class and id (``Counter#12``) if it has none."""
    name = actor.get("name")
    return str(name) if name else f"{actor['class']}#{actor['id']}"


class _Collector:
    """A one-shot collector of one gathered status."""

    def __init__(self, status: dict[str, Any]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:  # noqa: PLR0915 - one metric family after another, then one pass
        from prometheus_client.core import (  # noqa: PLC0415 - an optional dependency
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        by_endpoint = ["node", "actor", "actor_class", "endpoint"]
        by_actor = ["node", "actor", "actor_class"]
        handled = CounterMetricFamily("actorch_messages_handled", "Messages an endpoint handled", labels=by_endpoint)
        errors = CounterMetricFamily("actorch_handler_errors", "Messages whose handler raised", labels=by_endpoint)
        seconds = HistogramMetricFamily(
            "actorch_handler_seconds", "Time an endpoint's handler runs took (a batch run: one)", labels=by_endpoint
        )
        waits = HistogramMetricFamily(
            "actorch_mailbox_wait_seconds",
            "Time from a message entering an actor's mailbox to its handler starting (0: it started at once)",
            labels=by_actor,
        )
        depth = GaugeMetricFamily("actorch_mailbox_depth", "Messages waiting in an actor's mailbox", labels=by_actor)
        waited = GaugeMetricFamily(
            "actorch_mailbox_oldest_wait_seconds",
            "How long the oldest message waiting in an actor's mailbox has waited (0: none waits)",
            labels=by_actor,
        )
        up = GaugeMetricFamily(
            "actorch_node_up", "1 while the node is part of the system, 0 once lost", labels=["node"]
        )
        lag = GaugeMetricFamily(
            "actorch_event_loop_lag_seconds",
            "How late the node's event loop ran its last probe (taken every 0.5 s; a blocked loop: how long blocked)",
            labels=["node"],
        )
        lags = HistogramMetricFamily(
            "actorch_event_loop_probe_lag_seconds",
            "How late the node's event loop ran each probe (one every 0.5 s)",
            labels=["node"],
        )
        sent = CounterMetricFamily(
            "actorch_sent_bytes",
            "Message bytes a node sent on each path (tensors apart; replies on a bundle's response too)",
            labels=["node", "path"],
        )
        received = CounterMetricFamily(
            "actorch_received_bytes",
            "Message bytes a node received on each path (tensors apart)",
            labels=["node", "path"],
        )
        tensors = CounterMetricFamily("actorch_sent_tensor_bytes", "Tensor bytes a node sent", labels=["node"])
        old_sent = CounterMetricFamily(
            "actorch_bytes_sent",
            "Deprecated, see actorch_sent_bytes_total: message bytes a node sent (not on a response)",
            labels=["node"],
        )
        old_tensors = CounterMetricFamily(
            "actorch_tensor_bytes_sent", "Deprecated, see actorch_sent_tensor_bytes_total", labels=["node"]
        )
        old_received = CounterMetricFamily(
            "actorch_bytes_received", "Deprecated, see actorch_received_bytes_total", labels=["node"]
        )
        for node in self._status["nodes"]:
            rank = str(node["rank"])
            up.add_metric([rank], 0.0 if "lost" in node else 1.0)
            loop = node.get("loop")
            if loop is not None:
                lag.add_metric([rank], max(loop["lag"], loop["behind"]))
                if "lags" in loop:
                    lags.add_metric([rank], *_histogram(loop["lags"]["buckets"], loop["lags"]["seconds"]))
            if "statistics" not in node:
                continue
            stats = node["statistics"]
            for path, counts in stats.get("paths", {}).items():
                sent.add_metric([rank, path], counts["bytes_sent"])
                received.add_metric([rank, path], counts["bytes_received"])
            tensors.add_metric([rank], stats["tensor_bytes_sent"])
            old_sent.add_metric([rank], stats["bytes_sent"])
            old_tensors.add_metric([rank], stats["tensor_bytes_sent"])
            old_received.add_metric([rank], stats["bytes_received"])
            for actor in node["actors"]:
                key = [rank, _actor_label(actor), actor["class"]]
                depth.add_metric(key, actor["queued"])
                if "queued_seconds" in actor:
                    waited.add_metric(key, actor["queued_seconds"] or 0.0)
                runs = waited_runs = 0
                wait_buckets: list[list[Any]] = []
                wait_seconds = 0.0
                for endpoint, snapshot in sorted(actor["endpoints"].items()):
                    handled.add_metric([*key, endpoint], snapshot["calls"])
                    errors.add_metric([*key, endpoint], snapshot["errors"])
                    seconds.add_metric([*key, endpoint], *_histogram(snapshot["buckets"], snapshot["seconds"]))
                    runs += sum(count for _, count in snapshot["buckets"])
                    if "waits" in snapshot:
                        waited_runs += snapshot["waits"]["count"]
                        wait_buckets += snapshot["waits"]["buckets"]
                        wait_seconds += snapshot["waits"]["seconds"]
                # The runs that did not wait (a call that started at once) waited nothing: the first bucket's.
                waits.add_metric(key, *_histogram([[0.0, max(runs - waited_runs, 0)], *wait_buckets], wait_seconds))
        yield from (handled, errors, seconds, waits, depth, waited, up, lag, lags, sent, received, tensors)
        yield from (old_sent, old_tensors, old_received)


def _histogram(buckets: Iterable[list[Any]], total: float) -> tuple[list[tuple[str, float]], float]:
    """Prometheus' cumulative ``le`` buckets, and the sum, from ``[upper bound in seconds, count]`` pairs.

    Every bound the status carries is one of the fine ones, and every ``le``
    bound is one of those too, so each count falls under exactly the ``le``
    bounds at or above its own: the cumulative counts are exact. A bound of
    None (the fine buckets' last) counts under ``+Inf`` only.
    """
    counts = [0.0] * (len(PROMETHEUS_BOUNDS_NS) + 1)  # by le bound, and past them all
    for upper, count in buckets:
        index = len(PROMETHEUS_BOUNDS_NS) if upper is None else bisect_left(PROMETHEUS_BOUNDS_NS, round(upper * 1e9))
        counts[index] += count
    cumulative: list[tuple[str, float]] = []
    seen = 0.0
    for label, count in zip(_LE_LABELS, counts, strict=False):
        seen += count
        cumulative.append((label, seen))
    cumulative.append(("+Inf", seen + counts[-1]))
    return cumulative, total
