"""A three-node chain made OpenTelemetry spans: a user's span on main -> A (node 1) -> B (node 2) -> C (node 0).

``python otel_chain.py DIR`` runs with ``run(otel=True)``; ``actorch run -n 3
--otel otel_chain.py DIR cli`` turns spans on through the launcher. Every
node's ``setup`` sets up the SDK's tracer provider, as a user would, with an
exporter that appends each span to ``DIR/spans-<rank>.jsonl`` as it ends, for
the test to read back. Its result ``chain`` is what ``main`` saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from actors import emit
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from traced import Hop

import actorch

DIRECTORY = sys.argv[1]
THROUGH_CLI = sys.argv[2:] == ["cli"]


class FileExporter(SpanExporter):
    """Appends each span to a file as one JSON line, as soon as it ends (a node may be stopped any time after)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as handle:
            for span in spans:
                handle.write(json.dumps(record(span)) + "\n")
        return SpanExportResult.SUCCESS


def record(span: ReadableSpan) -> dict[str, Any]:
    context, parent = span.get_span_context(), span.parent
    return {
        "name": span.name,
        "trace": f"{context.trace_id:032x}",
        "id": f"{context.span_id:016x}",
        "parent": None if parent is None else f"{parent.span_id:016x}",
        "remote_parent": parent is not None and parent.is_remote,
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [event.name for event in span.events],
        "pid": os.getpid(),
    }


def setup(rank: int) -> None:
    """Every node's own OpenTelemetry set-up: the SDK's provider, exporting to this node's file."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.path.join(DIRECTORY, f"spans-{rank}.jsonl"))))
    trace.set_tracer_provider(provider)


async def main(system: actorch.ActorSystem) -> None:
    c = await system.spawn(Hop, name="c", on=0)
    b = await system.spawn(Hop, args=(c,), name="b", on=2)
    a = await system.spawn(Hop, args=(b,), name="a", on=1)
    tracer = trace.get_tracer("otel_chain")
    with tracer.start_as_current_span("user step") as step:
        result = await a.call(Hop.relay, 1)
    with tracer.start_as_current_span("user failure") as failure:
        try:
            await b.call(Hop.fail)
        except ValueError as exc:
            raised = type(exc).__name__
    with tracer.start_as_current_span("user note") as note:
        a.tell(Hop.note, 1)
    while await a.call(Hop.noted_count) < 1:  # noqa: ASYNC110 - the count lives in another process
        await asyncio.sleep(0.01)
    emit(
        "chain",
        result=result,
        raised=raised,
        spans={
            name: f"{span.get_span_context().span_id:016x}"
            for name, span in (("step", step), ("failure", failure), ("note", note))
        },
        pids={str(node.rank): node.pid for node in system.nodes},
    )


if __name__ == "__main__":
    if THROUGH_CLI:
        actorch.run(main, world_size=3, setup=setup)
    else:
        actorch.run(main, world_size=3, setup=setup, otel=True)
