"""Timelines: what a node records while a trace runs, how parts merge and align, and system.trace in one process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import structlog
from traced import Busy, Hop

import actorch
from actorch._actors import tracing
from actorch._actors.node.service import NodeService
from actorch._engine.callee import CallReply
from actorch._engine.instruments import Instruments
from actorch._engine.message import Reply
from actorch._engine.system_ids import SERVICE_ID
from actorch._engine.timeline import ClockProbe, NodePart, align, flows, merge, offset_from_probes
from actorch._engine.tracing import (
    CALL_SPAN,
    HANDLER_SPAN,
    WAIT_SPAN,
    NodeTrace,
    TraceSettings,
    Tracing,
    arrow,
    flow_id,
    own_ident,
)
from actorch._launch.options.environment import TRACE_ENV
from actorch._launch.options.system_options import SystemOptions, launcher_environment, trace_path
from actorch.testing import LocalWorld

# ---------------------------------------------------------------- what a node records


@pytest.mark.parametrize("sample", [0, -0.5, 1.5, True, "all"])
def test_trace_settings_refuse_a_sample_outside_zero_to_one(sample: Any) -> None:
    with pytest.raises(ValueError, match="sample is a fraction in"):
        TraceSettings(sample=sample)


@pytest.mark.parametrize("max_events", [0, -1, 2.5, True])
def test_trace_settings_refuse_a_cap_that_is_not_a_positive_count(max_events: Any) -> None:
    with pytest.raises(ValueError, match="max_events is a positive number"):
        TraceSettings(max_events=max_events)


def test_both_ends_sample_a_message_alike_and_about_the_fraction_asked() -> None:
    caller, callee = NodeTrace(0, TraceSettings(sample=0.25)), NodeTrace(3, TraceSettings(sample=0.25))
    ids = [flow_id(rank, ident, own=own) for rank in range(4) for ident in range(1, 2500) for own in (False, True)]
    chosen = [caller.sampled(flow) for flow in ids]
    assert chosen == [callee.sampled(flow) for flow in ids]
    assert 0.2 < sum(chosen) / len(chosen) < 0.3
    assert all(NodeTrace(0, TraceSettings()).sampled(flow) for flow in ids[:100])


def test_flow_ids_of_calls_and_own_ids_never_meet() -> None:
    ids = {flow_id(1, 5), flow_id(1, 5, own=True), flow_id(1, 5, stream=True), flow_id(2, 5)}
    assert len(ids) == 4
    assert flow_id(2047, (1 << 40) - 1, stream=True) < 1 << 53  # exact in a JSON reader's doubles
    trace = NodeTrace(5, TraceSettings())
    flow = trace.own_flow()  # what a tell carries is its own ident, from which the callee draws the same arrow
    assert flow == flow_id(5, own_ident(flow), own=True)
    assert trace.own_flow() != flow
    assert NodeTrace(5, TraceSettings(sample=0.001)).own_flow() in (0, flow_id(5, 1, own=True))


def test_a_node_trace_keeps_max_events_and_counts_the_rest() -> None:
    trace = NodeTrace(0, TraceSettings(max_events=3))
    for index in range(5):
        trace.mark("tell", "main", f"tell {index}", 0, {})
    part = trace.finish()
    assert [event[2] for event in part["events"]] == ["tell 0", "tell 1", "tell 2"]
    assert part["dropped"] == 2


def test_a_call_span_opens_at_its_send_and_closes_with_its_outcome_or_unfinished() -> None:
    trace = NodeTrace(2, TraceSettings())
    trace.opened(CALL_SPAN, flow_id(2, 7), "main", "call", "add", "actor", 1, "lane", 40)
    trace.opened(CALL_SPAN, flow_id(2, 8), "main", "call", "add", "actor", 1, "lane", 40)
    trace.closed(flow_id(2, 7), "error")
    trace.closed(flow_id(2, 99), "ok")  # not one it sent: nothing
    part = trace.finish()
    [ended, unfinished] = part["events"]
    assert ended[:3] == (CALL_SPAN, "main", "call add")
    assert ended[5] == flow_id(2, 7)
    assert ended[6] == {"to": "actor", "node": 1, "path": "lane", "bytes": 40, "outcome": "error"}
    assert ended[4] >= ended[3]
    assert unfinished[5] == flow_id(2, 8)
    assert unfinished[6]["outcome"] == "unfinished"


def test_a_span_that_began_before_the_trace_is_left_out() -> None:
    trace = NodeTrace(0, TraceSettings())
    trace.span(HANDLER_SPAN, "actor", "add", trace.started - 10, trace.started + 10, 1, {})
    trace.span(HANDLER_SPAN, "actor", "add", trace.started, trace.started + 10, 1, {})
    assert len(trace.finish()["events"]) == 1


def test_a_handler_run_becomes_its_wait_and_its_run_when_the_trace_ends_and_counts_against_max_events() -> None:
    trace = NodeTrace(0, TraceSettings(max_events=4))
    at = trace.started
    trace.ran("actor", "add", at + 1, at + 5, at + 9, 3, "ok")  # waited: two events
    trace.ran("actor", "add", 0, at + 10, at + 12, 4, "error")  # did not wait: one
    trace.ran("actor", "add", 0, at - 10, at + 12, 5, "ok")  # began before the trace: none
    trace.ran("actor", "add", at + 13, at + 14, at + 15, 6, "ok")  # two more than the one event of room left
    part = trace.finish()
    assert [event[:6] for event in part["events"]] == [
        (WAIT_SPAN, "actor", "add", at + 1, at + 5, 3),
        (HANDLER_SPAN, "actor", "add", at + 5, at + 9, 3),
        (HANDLER_SPAN, "actor", "add", at + 10, at + 12, 4),
    ]
    assert [event[6] for event in part["events"]] == [{}, {"outcome": "ok"}, {"outcome": "error"}]
    assert part["dropped"] == 2


def test_a_message_from_another_node_draws_its_arrow_from_its_origin_and_the_timeline_has_no_arrival_hook() -> None:
    reply = CallReply(None, 3, 17, None)  # type: ignore[arg-type]  # only its origin is read
    assert reply.origin() == (3, 17, False)
    assert arrow(reply.origin()) == flow_id(3, 17)
    assert arrow((3, 17, True)) == flow_id(3, 17, stream=True) != flow_id(3, 17)
    assert Reply().origin() is None  # a tell's, a same-node message's: they carry their arrow
    instruments = Instruments(0, structlog.get_logger(), lambda rank, tensors: "lane")
    instruments.add(Tracing(NodeTrace(0, TraceSettings())))
    assert instruments.arrived is None
    assert instruments.handled is not None


# ---------------------------------------------------------------- merging and clocks


def test_the_shortest_round_trip_gives_the_offset_and_its_bounds() -> None:
    probes = [ClockProbe(0, 5_000, 1_000), ClockProbe(2_000, 6_100, 2_200), ClockProbe(3_000, 9_000, 9_000)]
    assert offset_from_probes(probes) == (-4_000, -4_100, -3_900)
    with pytest.raises(ValueError, match="at least one round trip"):
        offset_from_probes([])


def event(kind: str, track: str, name: str, start: int, end: int, flow: int = 0) -> list[Any]:
    return [kind, track, name, start, end, flow, {}]


def test_align_keeps_one_machine_on_one_clock_and_narrows_another_by_causality() -> None:
    zero = NodePart(0, "a", 10, [event(CALL_SPAN, "main", "call x", 1_000, 9_000, 77)])
    same = NodePart(1, "a", 11, [event(HANDLER_SPAN, "x", "x", 500, 600)], probes=[ClockProbe(0, 10**9, 1)])
    # The far node's handler of arrow 77 starts at its 50_000: its offset must put that after 1_000.
    far = NodePart(2, "b", 12, [event(HANDLER_SPAN, "x", "x", 50_000, 51_000, 77)], same_clock=False)
    far.probes = [ClockProbe(0, 60_000, 4_000)]  # estimate -58_000: the handler would start before the send
    align([zero, same, far])
    assert zero.offset == 0
    assert same.offset == 0
    assert far.offset == -49_000  # the least offset that keeps the arrow forward
    document = merge([zero, same, far])
    [(start, finish)] = list(flows(document))
    assert finish["ts"] >= start["ts"]
    assert document["otherData"]["nodes"]["2"]["offset_ns"] == -49_000


def test_merge_nests_what_nests_on_a_track_and_gives_what_overlaps_a_row_of_its_own() -> None:
    part = NodePart(
        0,
        "h",
        1,
        [
            event(HANDLER_SPAN, "actor A", "outer", 0, 10_000),
            event(CALL_SPAN, "actor A", "call inner", 1_000, 2_000),  # inside outer: same row
            event(HANDLER_SPAN, "actor A", "concurrent", 5_000, 20_000),  # overlaps outer's end: a row of its own
            event(HANDLER_SPAN, "actor A", "later", 30_000, 31_000),  # after both: back on the first row
            event(WAIT_SPAN, "actor A", "queued", 0, 5_000),
        ],
    )
    document = merge([part])
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    rows = {e["name"]: names[(e["pid"], e["tid"])] for e in document["traceEvents"] if e["ph"] == "X"}
    assert rows == {"outer": "actor A", "call inner": "actor A", "concurrent": "actor A (2)", "later": "actor A"}
    [begin] = [e for e in document["traceEvents"] if e["ph"] == "b"]
    [end] = [e for e in document["traceEvents"] if e["ph"] == "e"]
    assert begin["name"] == end["name"] == "mailbox of actor A"
    assert begin["id"] == end["id"]
    assert end["ts"] - begin["ts"] == pytest.approx(5.0)  # µs
    assert json.loads(json.dumps(document)) == document


# ---------------------------------------------------------------- system.trace in one process


async def test_system_trace_records_calls_tells_handlers_and_waits_on_every_node(
    world: LocalWorld, tmp_path: Path
) -> None:
    system = world[0]
    c = await system.spawn(Hop, name="c", on=0)
    b = await system.spawn(Hop, args=(c,), name="b", on=2)
    a = await system.spawn(Hop, args=(b,), name="a", on=1)
    busy = await system.spawn(Busy, on=1)
    path = tmp_path / "world.json"
    async with system.trace(path) as timeline:
        assert timeline.path == path
        assert timeline.events == 0
        assert await a.call(Hop.relay, 1) == 4
        a.tell(Hop.note, 5)
        while await a.call(Hop.noted_count) < 1:  # noqa: ASYNC110 - the tell is handled in its own task
            await asyncio.sleep(0.001)
        await asyncio.gather(*(busy.call(Busy.hold, 0.01) for _ in range(3)))
    assert not path.with_name(path.name + ".tmp").exists()
    document = json.loads(path.read_text())
    assert timeline.events == len([e for e in document["traceEvents"] if e["ph"] in "Xb"]) > 0
    assert timeline.dropped == 0
    assert timeline.missing == []
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    handlers = [
        (e["pid"] - 1, names[(e["pid"], e["tid"])], e["name"])
        for e in document["traceEvents"]
        if e.get("cat") == "handler"
    ]
    assert (1, "actor 'a' (Hop) on node 1", "relay") in handlers
    assert (2, "actor 'b' (Hop) on node 2", "relay") in handlers
    assert (0, "actor 'c' (Hop) on node 0", "relay") in handlers
    assert (1, "actor 'a' (Hop) on node 1", "note") in handlers
    paths = {e["args"]["path"] for e in document["traceEvents"] if e.get("cat") == "call"}
    assert paths == {"in_process"}  # nodes of one process, no local call: the chain crosses nodes
    assert any(e["ph"] == "b" and e["name"].startswith("mailbox of actor Busy") for e in document["traceEvents"])
    for start, finish in flows(document):
        assert finish["ts"] >= start["ts"]
    # Nothing runs now: the nodes record nothing more, and a new trace may start.
    assert all(host.node.trace is None for host in world._hosts)
    async with system.trace(tmp_path / "again.json", sample=0.5, max_events=10):
        pass
    assert json.loads((tmp_path / "again.json").read_text())["otherData"]["sample"] == 0.5


async def test_a_same_node_call_is_traced_as_local(world: LocalWorld, tmp_path: Path) -> None:
    system = world[0]
    c = await system.spawn(Hop, name="c", on=0)
    path = tmp_path / "local.json"
    async with system.trace(path):
        await c.call(Hop.relay, 1)
    document = json.loads(path.read_text())
    [call] = [e for e in document["traceEvents"] if e.get("cat") == "call" and e["name"] == "call relay"]
    assert call["args"]["path"] == "local"
    assert call["args"]["outcome"] == "ok"
    [(start, finish)] = [pair for pair in flows(document) if pair[0]["name"] == "call"]
    assert finish["ts"] == start["ts"]  # run in the caller's task: the handler starts as the call does


async def test_a_broadcast_and_a_same_node_stream_are_traced_with_their_arrows(
    world: LocalWorld, tmp_path: Path
) -> None:
    system = world[0]
    members = [await system.spawn(Hop, on=rank) for rank in (1, 1, 2)]
    here, busy = await system.spawn(Hop, on=0), await system.spawn(Busy, on=0)
    path = tmp_path / "cast.json"
    async with system.trace(path):
        assert await asyncio.gather(*actorch.broadcast(members, Hop.relay, 1)) == [2, 2, 2]
        assert [item async for item in here.stream(Hop.count, 2)] == [0, 1]
        await asyncio.gather(*(busy.call(Busy.hold, 0.01) for _ in range(2)))  # the second through the mailbox
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    relays = [e for e in events if e.get("cat") == "call" and e["name"] == "call relay"]
    assert sorted(e["args"]["node"] for e in relays) == [1, 1, 2]  # each member's call, one message per node
    assert {e["args"]["outcome"] for e in relays} == {"ok"}
    [stream] = [e for e in events if e.get("cat") == "stream"]
    assert (stream["args"]["path"], stream["args"]["outcome"]) == ("local", "ended")
    assert [e["args"]["index"] for e in events if e.get("cat") == "item"] == [0, 1]
    holds = [e for e in events if e.get("cat") == "call" and e["name"] == "call hold"]
    assert [e["args"]["path"] for e in holds] == ["local", "local"]
    arrows = list(flows(document))
    assert len(arrows) == len([e for e in events if e["ph"] == "s"]) == 6  # every send's arrow ends at a handler
    for start, finish in arrows:
        assert finish["ts"] >= start["ts"]


async def test_system_trace_refuses_a_second_trace_and_a_missing_directory(world: LocalWorld, tmp_path: Path) -> None:
    system = world[0]
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        async with system.trace(tmp_path / "missing" / "t.json"):
            pass
    with pytest.raises(ValueError, match="sample is a fraction"):
        system.trace(tmp_path / "t.json", sample=2)
    async with system.trace(tmp_path / "first.json"):
        with pytest.raises(actorch.TraceRunningError) as refused:
            async with system.trace(tmp_path / "second.json"):
                pass
        with pytest.raises(actorch.TraceRunningError, match="node 1 already records a timeline that another node"):
            async with world[1].trace(tmp_path / "third.json"):
                pass
    assert isinstance(refused.value, RuntimeError)
    assert str(refused.value).startswith(f"node 0 already records a timeline to {str(tmp_path / 'first.json')!r}: ")
    assert (tmp_path / "first.json").exists()
    assert not (tmp_path / "second.json").exists()
    async with system.trace(tmp_path / "second.json"):  # the first one's block has ended: a trace may begin again
        pass
    assert (tmp_path / "second.json").exists()


def test_a_trace_block_under_run_trace_is_refused_saying_the_run_records_it(tmp_path: Path) -> None:
    async def main(system: actorch.ActorSystem) -> None:
        async with system.trace(tmp_path / "part.json"):
            pass

    with pytest.raises(actorch.TraceRunningError) as refused:
        actorch.run(main, trace=tmp_path / "run.json", configure_logs=False)
    assert str(refused.value) == (
        f"node 0 already records a timeline to {str(tmp_path / 'run.json')!r}: one at a time. A run started with "
        "run(trace=...) or actorch run --trace records the whole run, every system.trace block's calls included: "
        "trace a part of a run only where the run itself is not traced"
    )
    assert (tmp_path / "run.json").exists()  # the run's own trace was written all the same


# ---------------------------------------------------------------- options


def test_the_trace_option_takes_a_path_or_reads_actorch_trace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    assert trace_path(SystemOptions()) is None
    assert trace_path(SystemOptions(trace=tmp_path / "t.json")) == str(tmp_path / "t.json")
    monkeypatch.setenv(TRACE_ENV, "/somewhere/t.json")
    assert trace_path(SystemOptions()) == "/somewhere/t.json"
    assert trace_path(SystemOptions(trace="mine.json")) == "mine.json"
    with pytest.raises(TypeError, match="trace must be a file path"):
        SystemOptions(trace=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trace must be a file path"):
        SystemOptions(trace="")


def test_actorch_run_trace_hands_the_script_an_absolute_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert launcher_environment(trace="out.json")[TRACE_ENV] == str(tmp_path / "out.json")
    assert TRACE_ENV not in launcher_environment()


def test_start_takes_no_trace_and_run_refuses_a_missing_directory_before_starting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="start\\(\\) has no main to trace"):
        actorch.start(trace=tmp_path / "t.json")

    async def main(system: actorch.ActorSystem) -> None:
        raise AssertionError("started")

    with pytest.raises(FileNotFoundError, match="its directory does not exist; nothing started"):
        actorch.run(main, trace=tmp_path / "missing" / "t.json", configure_logs=False)


async def test_a_node_lost_or_not_answering_is_left_out_of_the_timeline_and_named(
    world: LocalWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = world[0]
    c = await system.spawn(Hop, name="c", on=0)
    path = tmp_path / "missing.json"
    monkeypatch.setattr(tracing, "ANSWER_TIMEOUT", 0.2)

    async def never(self: NodeService) -> None:
        await asyncio.sleep(3600)  # as a node whose event loop is blocked would not answer

    endpoints = world._hosts[1].node.cell(SERVICE_ID).endpoints  # node 1's service, as built
    monkeypatch.setitem(endpoints, "trace_stop", never)
    with structlog.testing.capture_logs() as logs:
        async with system.trace(path) as timeline:
            await c.call(Hop.relay, 1)
            world.kill(2)
    assert sorted(timeline.missing) == [1, 2]
    document = json.loads(path.read_text())
    assert sorted(document["otherData"]["missing"]) == [1, 2]
    assert sorted(document["otherData"]["nodes"]) == ["0"]
    missing = [entry for entry in logs if entry["event"] == "trace part missing"]
    assert {entry["peer"]: "no answer within 0.2 s" in entry["why"] for entry in missing} == {1: True, 2: False}
