"""OpenTelemetry spans (``otel=True``) in an in-process world, read back from the SDK's in-memory exporter.

Every test but the last group needs ``opentelemetry-sdk`` (``actorch[test]``)
and skips without it. The SDK's tracer provider is global and set once per
process: the module sets it (unless a provider of the SDK is there already)
and gives each test the exporter, emptied.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from traced import Busy, Hop

import actorch
from actorch._actors.node.node_system import open_system
from actorch._base.config import SystemConfig
from actorch._engine.callee import Callee
from actorch._engine.instruments import OutgoingMessage
from actorch._engine.system_ids import SYSTEM_IDS
from actorch._launch.options.environment import OTEL_ENV
from actorch._launch.options.system_options import SystemOptions, launcher_environment, otel_on
from actorch._transport.inprocess import InProcessHub
from actorch.testing import LocalWorld, local_world

SDK_MISSING = "the otel tests read spans back with opentelemetry-sdk (pip install 'actorch[test]')"


class Batcher(actorch.Actor):
    """A batched endpoint: concurrent calls are answered by one run."""

    @actorch.batched(max_batch=3, max_wait=0.5)
    async def double(self, items: list[int]) -> list[int]:
        return [2 * item for item in items]


@pytest.fixture(scope="module")
def exporter() -> Iterator[Any]:
    """The in-memory exporter of the process's SDK tracer provider (set here if none is)."""
    pytest.importorskip("opentelemetry.sdk.trace", reason=SDK_MISSING)
    from opentelemetry import trace  # noqa: PLC0415 - only once the SDK is known to be there
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: PLC0415

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield memory
    memory.shutdown()  # the processor stays on the global provider: it exports nothing more


@pytest.fixture
def spans(exporter: Any) -> Any:
    """The exporter, with no span in it yet."""
    exporter.clear()
    return exporter


@pytest.fixture
def tracer(exporter: Any) -> Any:
    """A tracer of the test's own, as a user's code has."""
    from opentelemetry import trace  # noqa: PLC0415

    return trace.get_tracer("test")


@pytest.fixture
async def otel_world(exporter: Any) -> AsyncIterator[LocalWorld]:
    """Three nodes that make spans."""
    async with local_world(3, stop_grace=0.5, otel=True) as running:
        yield running


def kind(span: Any) -> str:
    return str(span.kind.name)


def by_id(finished: Any) -> dict[int, Any]:
    return {span.context.span_id: span for span in finished}


def parent_of(span: Any, index: dict[int, Any]) -> Any:
    return None if span.parent is None else index.get(span.parent.span_id)


def chain_up(span: Any, index: dict[int, Any]) -> list[str]:
    """``span`` and its ancestors, each as ``KIND name@node``, the root last."""
    links = []
    while span is not None:
        node = span.attributes.get("actorch.node")
        links.append(f"{kind(span)} {span.name}" + ("" if node is None else f"@{node}"))
        span = parent_of(span, index)
    return links


async def finished_when(spans: Any, done: Callable[[Any], bool]) -> Any:
    """The finished spans, once ``done`` says they are all there (within a second: spans that end on another node)."""
    for _ in range(100):
        finished = spans.get_finished_spans()
        if done(finished):
            return finished
        await asyncio.sleep(0.01)
    raise AssertionError(f"spans still missing: {[span.name for span in spans.get_finished_spans()]}")


def only(finished: Any, name: str, span_kind: str) -> Any:
    [found] = [span for span in finished if span.name == name and kind(span) == span_kind]
    return found


# ---------------------------------------------------------------- calls across nodes


async def test_otel_a_call_chain_across_nodes_is_one_trace_of_parents_and_children(
    otel_world: LocalWorld, spans: Any, tracer: Any
) -> None:
    system = otel_world[0]
    c = await system.spawn(Hop, name="c", on=0)
    b = await system.spawn(Hop, args=(c,), name="b", on=2)
    a = await system.spawn(Hop, args=(b,), name="a", on=1)
    assert spans.get_finished_spans() == ()  # the runtime's own calls (spawn) make no spans
    with tracer.start_as_current_span("step"):
        assert await a.call(Hop.relay, 1) == 4
    finished = spans.get_finished_spans()
    index = by_id(finished)
    [handler_c] = [span for span in finished if kind(span) == "SERVER" and span.attributes["actorch.node"] == 0]
    assert chain_up(handler_c, index) == [
        "SERVER Hop/relay@0",
        "CLIENT Hop/relay@2",
        "SERVER Hop/relay@2",
        "CLIENT Hop/relay@1",
        "SERVER Hop/relay@1",
        "CLIENT Hop/relay@0",
        "INTERNAL step",
    ]
    assert len(finished) == 7
    assert len({span.context.trace_id for span in finished}) == 1
    first_call = parent_of(parent_of(parent_of(parent_of(parent_of(handler_c, index), index), index), index), index)
    assert dict(first_call.attributes) == {
        "rpc.system": "actorch",
        "rpc.service": "Hop",
        "rpc.method": "relay",
        "actorch.actor": "actor 'a' (Hop) on node 1",
        "actorch.message": "call",
        "actorch.node": 0,
        "actorch.peer.node": 1,
        "actorch.path": "in_process",
        "actorch.bytes": first_call.attributes["actorch.bytes"],
        "actorch.outcome": "ok",
    }
    assert first_call.attributes["actorch.bytes"] > 0
    handler_a = index[
        next(s.context.span_id for s in finished if s.parent and s.parent.span_id == first_call.context.span_id)
    ]
    assert handler_a.attributes["actorch.peer.node"] == 0  # the caller's node
    assert handler_a.attributes["actorch.actor"] == "actor 'a' (Hop) on node 1"
    assert handler_a.parent.is_remote  # its parent came in the envelope
    # Each span lies within its parent's time.
    for span in finished:
        parent = parent_of(span, index)
        if parent is not None:
            assert parent.start_time <= span.start_time
            assert span.end_time <= parent.end_time


async def test_otel_a_failed_handler_marks_its_span_and_its_call_error_with_the_exception(
    otel_world: LocalWorld, spans: Any, tracer: Any
) -> None:
    b = await otel_world[0].spawn(Hop, name="b", on=2)
    with tracer.start_as_current_span("step"), pytest.raises(ValueError, match="traced failure"):
        await b.call(Hop.fail)
    finished = spans.get_finished_spans()
    call, handler = only(finished, "Hop/fail", "CLIENT"), only(finished, "Hop/fail", "SERVER")
    assert handler.parent.span_id == call.context.span_id
    for span in (call, handler):
        assert span.status.status_code.name == "ERROR"
        assert "traced failure" in span.status.description
        assert span.attributes["actorch.outcome"] == "error"
        assert span.attributes["error.type"] == "ValueError"  # a remote error names the original class
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes["exception.message"].startswith("traced failure")
    assert handler.events[0].attributes["exception.type"] == "ValueError"
    assert "raise ValueError" in handler.events[0].attributes["exception.stacktrace"]  # the handler's own frames


async def test_otel_a_call_past_its_deadline_is_cancelled_and_its_handler_timed_out(
    otel_world: LocalWorld, spans: Any
) -> None:
    busy = await otel_world[0].spawn(Busy, on=1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await busy.call(Busy.hold, 5.0)
    # The callee hears of the cancel after the caller gave up.
    finished = await finished_when(spans, lambda finished: any(kind(span) == "SERVER" for span in finished))
    call, handler = only(finished, "Busy/hold", "CLIENT"), only(finished, "Busy/hold", "SERVER")
    assert call.attributes["actorch.outcome"] == "cancelled"  # its caller gave up
    assert call.status.status_code.name == "UNSET"
    assert handler.attributes["actorch.outcome"] == "timeout"  # the handler ran past its caller's deadline
    assert handler.attributes["error.type"] == "TimeoutError"
    assert handler.status.status_code.name == "ERROR"


async def test_otel_a_call_to_a_lost_node_ends_lost_and_error(otel_world: LocalWorld, spans: Any) -> None:
    busy = await otel_world[0].spawn(Busy, on=2)
    call = busy.call(Busy.hold, 5.0)
    await asyncio.sleep(0.02)
    otel_world.kill(2)
    with pytest.raises(actorch.NodeLostError):
        await call  # it failed already, so this took no turn of the loop: its span ends in the next one
    await asyncio.sleep(0)
    span = only(spans.get_finished_spans(), "Busy/hold", "CLIENT")
    assert span.attributes["actorch.outcome"] == "lost"
    assert span.status.status_code.name == "ERROR"
    assert span.attributes["error.type"] == "actorch.NodeLostError"


# ---------------------------------------------------------------- on one node


async def test_otel_a_same_node_call_run_in_place_has_a_client_and_a_server_span(
    otel_world: LocalWorld, spans: Any, tracer: Any
) -> None:
    c = await otel_world[0].spawn(Hop, name="c", on=0)
    with tracer.start_as_current_span("step") as step:
        assert await c.call(Hop.relay, 1) == 2
    finished = spans.get_finished_spans()
    call, handler = only(finished, "Hop/relay", "CLIENT"), only(finished, "Hop/relay", "SERVER")
    assert call.parent.span_id == step.get_span_context().span_id
    assert handler.parent.span_id == call.context.span_id
    assert not handler.parent.is_remote
    assert call.attributes["actorch.path"] == "local"
    assert call.attributes["actorch.outcome"] == handler.attributes["actorch.outcome"] == "ok"
    assert handler.attributes["actorch.node"] == handler.attributes["actorch.peer.node"] == 0


async def test_otel_same_node_calls_that_wait_in_the_mailbox_keep_each_its_own_parent(
    otel_world: LocalWorld, spans: Any, tracer: Any
) -> None:
    busy = await otel_world[0].spawn(Busy, on=0)

    async def step(index: int) -> float:
        with tracer.start_as_current_span(f"step {index}"):
            return await busy.call(Busy.hold, 0.01)

    await asyncio.gather(*(step(index) for index in range(3)))
    finished = spans.get_finished_spans()
    index = by_id(finished)
    handlers = [span for span in finished if kind(span) == "SERVER"]
    assert len(handlers) == 3
    assert sorted(chain_up(span, index)[-1] for span in handlers) == [
        "INTERNAL step 0",
        "INTERNAL step 1",
        "INTERNAL step 2",
    ]
    assert len({span.context.trace_id for span in handlers}) == 3


# ---------------------------------------------------------------- tells, streams, batches, broadcasts


@pytest.mark.parametrize("rank", [0, 1], ids=["same node", "other node"])
async def test_otel_a_tell_is_a_producer_span_and_its_handler_a_consumer_child(
    otel_world: LocalWorld, spans: Any, tracer: Any, rank: int
) -> None:
    a = await otel_world[0].spawn(Hop, on=rank)
    with tracer.start_as_current_span("step") as step:
        a.tell(Hop.note, 1)
    while await a.call(Hop.noted_count) < 1:  # noqa: ASYNC110 - the tell is handled in a task of its own
        await asyncio.sleep(0.001)
    finished = spans.get_finished_spans()
    told, handled = only(finished, "Hop/note", "PRODUCER"), only(finished, "Hop/note", "CONSUMER")
    assert told.parent.span_id == step.get_span_context().span_id
    assert handled.parent.span_id == told.context.span_id
    assert told.attributes["actorch.message"] == handled.attributes["actorch.message"] == "tell"
    assert handled.attributes["actorch.node"] == rank


@pytest.mark.parametrize("rank", [0, 2], ids=["same node", "other node"])
async def test_otel_a_stream_is_a_client_span_from_open_to_end_and_its_generator_a_server_child(
    otel_world: LocalWorld, spans: Any, tracer: Any, rank: int
) -> None:
    b = await otel_world[0].spawn(Hop, on=rank)
    with tracer.start_as_current_span("step"):
        assert [item async for item in b.stream(Hop.count, 3)] == [0, 1, 2]
        async with b.stream(Hop.count, 100) as items:
            async for _ in items:
                break  # the consumer leaves early (the producer waits for credits meanwhile)
    finished = await finished_when(spans, lambda finished: sum(kind(span) == "SERVER" for span in finished) == 2)
    streams = [span for span in finished if kind(span) == "CLIENT"]
    producers = [span for span in finished if kind(span) == "SERVER"]
    assert sorted(span.attributes["actorch.outcome"] for span in streams) == ["closed", "ok"]
    assert sorted(span.attributes["actorch.outcome"] for span in producers) == ["cancelled", "ok"]
    assert {span.parent.span_id for span in producers} == {span.context.span_id for span in streams}
    assert {span.attributes["actorch.message"] for span in [*streams, *producers]} == {"stream"}
    assert {span.attributes["actorch.path"] for span in streams} == {"local" if rank == 0 else "in_process"}


async def test_otel_a_batched_run_is_one_span_linked_to_the_span_of_each_call(
    otel_world: LocalWorld, spans: Any, tracer: Any
) -> None:
    batcher = await otel_world[0].spawn(Batcher, on=1)
    with tracer.start_as_current_span("step"):
        assert await asyncio.gather(*(batcher.call(Batcher.double, item) for item in range(3))) == [0, 2, 4]
    finished = spans.get_finished_spans()
    calls = [span for span in finished if kind(span) == "CLIENT"]
    [run] = [span for span in finished if kind(span) == "SERVER"]
    assert run.parent is None  # it serves three callers: no one's child, linked to each
    assert run.attributes["actorch.batch.size"] == 3
    assert {link.context.span_id for link in run.links} == {span.context.span_id for span in calls}


async def test_otel_a_broadcast_carries_each_calls_context_in_its_one_message_per_node(
    otel_world: LocalWorld, spans: Any, tracer: Any
) -> None:
    members = [await otel_world[0].spawn(Hop, on=rank) for rank in (1, 1, 2, 0)]
    with tracer.start_as_current_span("step"):
        assert await asyncio.gather(*actorch.broadcast(members, Hop.relay, 1)) == [2, 2, 2, 2]
        actorch.broadcast_tell(members, Hop.note, 1)
    for member in members:
        while await member.call(Hop.noted_count) < 1:  # noqa: ASYNC110 - tells are handled in tasks of their own
            await asyncio.sleep(0.001)
    finished = spans.get_finished_spans()
    index = by_id(finished)
    for caller, handler in (("CLIENT", "SERVER"), ("PRODUCER", "CONSUMER")):
        handlers = [span for span in finished if kind(span) == handler and span.name in ("Hop/relay", "Hop/note")]
        assert len(handlers) == 4
        parents = [parent_of(span, index) for span in handlers]
        assert all(kind(parent) == caller for parent in parents)
        assert len({parent.context.span_id for parent in parents}) == 4  # each handler is its own call's child


async def test_otel_off_leaves_envelopes_as_they_were_and_on_adds_the_trace_context(
    spans: Any, tracer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[Any]] = []
    on_call = Callee.on_call

    def spy(self: Callee, src: int, message: list[Any], tensors: list[Any], port: Any) -> None:
        seen.append(list(message))
        on_call(self, src, message, tensors, port)

    monkeypatch.setattr(Callee, "on_call", spy)
    for otel in (False, True):
        async with local_world(2, otel=otel) as world:
            hop = await world[0].spawn(Hop, on=1)
            seen.clear()
            with tracer.start_as_current_span("step"):
                await hop.call(Hop.relay, 1)
                hop.tell(Hop.note, 1)
            while await hop.call(Hop.noted_count) < 1:  # noqa: ASYNC110 - the tell is handled in a task of its own
                await asyncio.sleep(0.001)
            relay, note = seen[:2]
        if otel:
            assert len(relay) == len(note) == 8
            assert relay[7]["traceparent"].startswith("00-")
            assert relay[7]["traceparent"] != note[7]["traceparent"]
        else:
            assert len(relay) == len(note) == 7
    assert {span.name for span in spans.get_finished_spans()} >= {"Hop/relay", "Hop/note", "step"}


def test_otel_a_span_with_no_valid_context_carries_nothing(exporter: Any) -> None:
    from opentelemetry.trace import NoOpTracer  # noqa: PLC0415

    from actorch._engine.otel import NodeTelemetry  # noqa: PLC0415

    telemetry = NodeTelemetry(0)
    telemetry.tracer = NoOpTracer()  # as with no SDK set up: nothing records, only a parent's context passes
    out = OutgoingMessage("stream", 1, SYSTEM_IDS + 1, "actor 'a' (Hop) on node 1", "count", None)
    telemetry.sending(out)
    assert out.carrier is None
    parent = telemetry.received(None, 1)
    assert parent.node == 1
    assert parent.verb == "call"


# ---------------------------------------------------------------- the option, and the extra missing


def test_the_otel_option_is_off_by_default_and_reads_actorch_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OTEL_ENV, raising=False)
    assert otel_on(SystemOptions()) is False
    assert otel_on(SystemOptions(otel=False)) is False
    for value in ("0", "off", "no", "FALSE", ""):
        monkeypatch.setenv(OTEL_ENV, value)
        assert otel_on(SystemOptions()) is False
    monkeypatch.setenv(OTEL_ENV, "maybe")
    with pytest.raises(ValueError, match="ACTORCH_OTEL must be 1 \\(on\\) or 0 \\(off\\), not 'maybe'"):
        SystemOptions()
    assert otel_on(SystemOptions(otel=False)) is False  # the option wins over the environment
    with pytest.raises(TypeError, match="otel must be True, False or None"):
        SystemOptions(otel="yes")  # type: ignore[arg-type]


def test_the_otel_option_turns_spans_on_with_the_extra_installed(
    exporter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OTEL_ENV, "1")
    assert otel_on(SystemOptions()) is True
    monkeypatch.delenv(OTEL_ENV)
    assert otel_on(SystemOptions(otel=True)) is True
    assert launcher_environment(otel=True)[OTEL_ENV] == "1"
    assert OTEL_ENV not in launcher_environment()


@pytest.fixture
def no_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenTelemetry cannot be imported, as where the extra is not installed."""
    monkeypatch.delenv(OTEL_ENV, raising=False)
    for name in [name for name in sys.modules if name == "opentelemetry" or name.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # an import of it raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "actorch._engine.otel", raising=False)


MISSING = "the OpenTelemetry API.*pip install 'actorch\\[otel\\]'"


@pytest.mark.usefixtures("no_opentelemetry")
async def test_otel_on_without_the_extra_raises_an_import_error_that_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImportError, match=MISSING):
        SystemOptions(otel=True)
    with pytest.raises(ImportError, match=MISSING):
        actorch.run(_never, otel=True, configure_logs=False)
    with pytest.raises(ImportError, match=MISSING):
        async with local_world(2, otel=True):
            pass
    with pytest.raises(ImportError, match=MISSING):
        launcher_environment(otel=True)  # actorch run --otel
    with pytest.raises(ImportError, match=MISSING):  # a node that joins a system whose settings say otel
        open_system(InProcessHub(1).transport(0), SystemConfig(otel=True))
    monkeypatch.setenv(OTEL_ENV, "1")
    with pytest.raises(ImportError, match=MISSING):
        SystemOptions()
    monkeypatch.delenv(OTEL_ENV)
    async with local_world(2) as world:  # off, actorch runs without it
        hop = await world[0].spawn(Hop, on=1)
        assert await hop.call(Hop.relay, 1) == 2
    assert "actorch._engine.otel" not in sys.modules


async def _never(system: actorch.ActorSystem) -> None:
    raise AssertionError("started")
