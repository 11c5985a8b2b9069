"""The hook interface of ``_engine/instruments.py``: instruments see each event once, and cost nothing when absent.

``Recorder``, below, is a new observer written as a user of the interface
would write one, in this module alone: installed on the nodes of a real
in-process world, it hears every kind of event, each once, with what it
needs. That is the claim "a new observer is one module". The runtime's own
instruments hold the rest of it, read from the engine's source: each is a
module of ``_engine`` of its own, and no module of the engine names one but
the node that installs them and the few that read what one keeps
(``INSTRUMENT_READERS``): the message path calls hooks, never an instrument.
"""

from __future__ import annotations

import ast
import asyncio
from collections import Counter
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
from traced import Busy, Hop

import actorch
from actorch._engine.calls import ObservedCall, RemoteCall
from actorch._engine.instruments import (
    HOOKS,
    LOCAL,
    ActorView,
    Handling,
    Instrument,
    Instruments,
    Outgoing,
    OutgoingMessage,
    Verb,
    outcome_of,
)
from actorch._engine.message import CallContext, Message
from actorch._engine.metrics import Metrics
from actorch._engine.node import Node
from actorch._engine.system_ids import SYSTEM_IDS
from actorch.testing import LocalWorld, local_world

Event = tuple[Any, ...]


class Batcher(actorch.Actor):
    """A batched endpoint: concurrent calls are answered by one run."""

    @actorch.batched(max_batch=3, max_wait=0.5)
    async def double(self, items: list[int]) -> list[int]:
        return [2 * item for item in items]


class Recorder(Instrument):
    """A new observer: every hook, recorded with what it was given; it carries its own mark across nodes."""

    __slots__ = ("events", "rank")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events: list[Event] = []

    def __repr__(self) -> str:
        return f"<Recorder node {self.rank}>"

    def sending(self, out: Outgoing) -> None:
        self.events.append(("sending", out.verb, out.endpoint, out.path))
        out.carry()["recorder"] = f"{out.verb} {out.endpoint} from {self.rank}"
        out.note(self, "noted")

    def sent(self, out: Outgoing, body: bytes | None, wire: bytes | None, tensors: list[Any] | None) -> None:
        self.events.append(("sent", out.verb, out.endpoint, out.path, wire is not None, bool(out.ident)))

    def reply(self, out: Outgoing, outcome: str, error: BaseException | None) -> None:
        self.events.append(("reply", out.verb, out.endpoint, outcome, type(error).__name__, out.noted(self)))

    def arrived(self, message: Message, verb: Verb, src: int, ident: int) -> None:
        carried = message.carried or {}
        self.events.append(("arrived", verb, message.endpoint, src, bool(ident), carried.get("recorder")))

    def mailbox_wait(self, actor: ActorView, message: Message) -> None:
        self.events.append(("mailbox_wait", message.endpoint, message.started >= message.queued_at > 0))

    def serving(
        self, actor: ActorView, endpoint: str, handler: Awaitable[Any], carried: dict[str, Any] | None
    ) -> Awaitable[Any]:
        self.events.append(("serving", endpoint, (carried or {}).get("recorder")))
        return handler

    def serving_batch(
        self, actor: ActorView, endpoint: str, handler: Awaitable[Any], carried: list[dict[str, Any] | None]
    ) -> Awaitable[Any]:
        self.events.append(("serving_batch", endpoint, len(carried)))
        return handler

    def handled(self, actor: ActorView, handling: Handling, ended: int, failed: bool, count: int) -> None:
        inline = isinstance(handling, CallContext)
        self.events.append(("handled", handling.endpoint, failed, count, inline, ended >= handling.started > 0))

    def stream_item(self, message: Message, index: int, wire: bytes | None, tensors: list[Any] | None) -> None:
        self.events.append(("stream_item", message.endpoint, index, wire is not None))

    def of(self, hook: str) -> list[Event]:
        return [event[1:] for event in self.events if event[0] == hook]


@pytest.fixture
def recorders(world: LocalWorld) -> Iterator[list[Recorder]]:
    """A ``Recorder`` installed on every node of ``world``, taken off again after."""
    installed = [Recorder(rank) for rank in range(len(world))]
    for node, recorder in zip(nodes(world), installed, strict=True):
        node.instruments.add(recorder)
    yield installed
    for node, recorder in zip(nodes(world), installed, strict=True):
        if recorder in node.instruments:
            node.instruments.remove(recorder)


def nodes(world: LocalWorld) -> list[Node]:
    return [host.node for host in world._hosts]


async def until(condition: Any) -> None:
    """Wait for ``condition()``, which the loop makes true soon (a tell handled, a reply settled)."""
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - handled in tasks of their own
            await asyncio.sleep(0.001)


# ---------------------------------------------------------------- a new observer is one module


async def test_a_new_instrument_hears_a_call_to_another_node_once_at_each_step(
    world: LocalWorld, recorders: list[Recorder]
) -> None:
    hop = await world[0].spawn(Hop, on=1)
    for recorder in recorders:
        recorder.events.clear()
    assert await hop.call(Hop.noted_count) == 0
    caller, callee = recorders[0], recorders[1]
    await until(lambda: caller.of("reply"))
    assert caller.of("sending") == [("call", "noted_count", None)]
    assert caller.of("sent") == [("call", "noted_count", "in_process", True, True)]
    assert caller.of("reply") == [("call", "noted_count", "ok", "NoneType", "noted")]
    assert callee.of("arrived") == [("call", "noted_count", 0, True, "call noted_count from 0")]
    assert callee.of("serving") == [("noted_count", "call noted_count from 0")]
    assert callee.of("handled") == [("noted_count", False, 1, False, True)]
    assert callee.of("sending") == callee.of("reply") == caller.of("arrived") == []
    assert recorders[2].events == []


async def test_a_new_instrument_hears_every_kind_of_event_from_a_real_world(
    world: LocalWorld, recorders: list[Recorder]
) -> None:
    system = world[0]
    here, there = await system.spawn(Hop, on=0), await system.spawn(Hop, on=1)
    busy, batcher = await system.spawn(Busy, on=1), await system.spawn(Batcher, on=1)
    for recorder in recorders:
        recorder.events.clear()
    assert await here.call(Hop.relay, 1) == 2  # same node: run in the caller's task
    there.tell(Hop.note, 1)
    await until(lambda: recorders[1].of("handled"))
    assert [item async for item in there.stream(Hop.count, 2)] == [0, 1]
    await asyncio.gather(*(busy.call(Busy.hold, 0.01) for _ in range(2)))  # the second waits in the mailbox
    assert await asyncio.gather(*(batcher.call(Batcher.double, item) for item in range(3))) == [0, 2, 4]
    with pytest.raises(ValueError, match="traced failure"):
        await there.call(Hop.fail)
    await until(lambda: len(recorders[0].of("reply")) == 8)
    sender, actors = recorders[0], recorders[1]
    assert Counter(verb for verb, *_ in sender.of("sending")) == {"call": 7, "tell": 1, "stream": 1}
    assert Counter(verb for verb, *_ in sender.of("sent")) == {"call": 7, "tell": 1, "stream": 1}
    assert ("call", "relay", "local", False, False) in sender.of("sent")
    assert ("tell", "note", "in_process", True, False) in sender.of("sent")
    assert sorted((verb, endpoint, outcome) for verb, endpoint, outcome, *_ in sender.of("reply")) == sorted(
        [
            ("call", "relay", "ok"),
            ("stream", "count", "ok"),
            *[("call", "hold", "ok")] * 2,
            *[("call", "double", "ok")] * 3,
            ("call", "fail", "error"),
        ]
    )  # a tell has no reply
    assert ("relay", False, 1, True, True) in sender.of("handled")  # the same-node call, run in place
    assert Counter(verb for verb, *_ in actors.of("arrived")) == {"call": 6, "tell": 1, "stream": 1}
    assert ("tell", "note", 0, False, "tell note from 0") in actors.of("arrived")
    assert actors.of("mailbox_wait") == [("hold", True)]
    assert actors.of("serving_batch") == [("double", 3)]
    assert actors.of("stream_item") == [("count", 0, True), ("count", 1, True)]
    assert ("double", False, 3, False, True) in actors.of("handled")  # one run answered three calls
    assert ("fail", True, 1, False, True) in actors.of("handled")
    assert {hook for recorder in recorders for hook, *_ in recorder.events} == set(HOOKS)


async def test_an_instrument_hears_same_node_messages_and_broadcasts_each_as_its_own(
    world: LocalWorld, recorders: list[Recorder]
) -> None:
    system = world[0]
    local, busy = await system.spawn(Hop, on=0), await system.spawn(Busy, on=0)
    members = [await system.spawn(Hop, on=rank) for rank in (1, 1, 2)]
    for recorder in recorders:
        recorder.events.clear()
    local.tell(Hop.note, 1)
    assert [item async for item in local.stream(Hop.count, 1)] == [0]
    await asyncio.gather(*(busy.call(Busy.hold, 0.01) for _ in range(2)))  # the second through the mailbox
    assert await asyncio.gather(*actorch.broadcast(members, Hop.relay, 1)) == [2, 2, 2]
    await until(lambda: len(recorders[0].of("reply")) == 6)
    sender = recorders[0]
    assert ("stream_item", "count", 0, False) in [("stream_item", *event) for event in sender.of("stream_item")]
    assert ("serving", "note", "tell note from 0") in [("serving", *event) for event in sender.of("serving")]
    relayed = [event for event in sender.of("sent") if event[1] == "relay"]
    assert relayed == [("call", "relay", "in_process", True, True)] * 3  # two in one message to node 1, its own id each
    arrived = [event for recorder in recorders[1:] for event in recorder.of("arrived")]
    assert sorted(arrived) == [("call", "relay", 0, True, "call relay from 0")] * 3


ENGINE = Path(__file__).resolve().parents[2] / "actorch" / "_engine"
SOURCES = {f"actorch._engine.{path.stem}": ast.parse(path.read_text()) for path in sorted(ENGINE.glob("*.py"))}
INSTRUMENT_READERS = {
    "actorch._engine.node": {"actorch._engine.metrics", "actorch._engine.tracing", "actorch._engine.otel"},
    "actorch._engine.cell": {"actorch._engine.metrics"},
    "actorch._engine.looplag": {"actorch._engine.metrics"},
    "actorch._engine.timeline": {"actorch._engine.tracing"},
}
"""The modules of the engine that name an instrument's module, and which: the node installs them (the
metrics in ``Node.__init__``, a trace's in ``start_trace``, the spans when on); each cell keeps what the
metrics count of its actor (``Cell.metrics``); the loop's lag is a histogram of the metrics'; the merged
timeline is made of the nodes' trace parts. No module the message path runs through is among them but the cell.
"""


def instruments_in(tree: ast.Module) -> list[str]:
    """The classes of a module that subclass ``Instrument``."""
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and any(ast.unparse(base) == "Instrument" for base in node.bases)
    ]


def imported_modules(tree: ast.Module) -> set[str]:
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


INSTRUMENT_MODULES = {module: found for module, tree in SOURCES.items() if (found := instruments_in(tree))}


def test_each_instrument_of_the_runtime_is_a_module_of_the_engine_of_its_own() -> None:
    assert INSTRUMENT_MODULES == {
        "actorch._engine.metrics": ["Metrics"],
        "actorch._engine.otel": ["NodeTelemetry"],
        "actorch._engine.tracing": ["Tracing"],
    }


@pytest.mark.parametrize("module", sorted(set(SOURCES) - set(INSTRUMENT_MODULES)))
def test_no_module_of_the_engine_names_an_instrument_but_those_that_install_or_read_one(module: str) -> None:
    named = imported_modules(SOURCES[module]) & set(INSTRUMENT_MODULES)
    assert named <= INSTRUMENT_READERS.get(module, set())


# ---------------------------------------------------------------- the hook set


class Counting(Instrument):
    """Overrides ``handled`` alone: only that hook is set."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def handled(self, actor: ActorView, handling: Handling, ended: int, failed: bool, count: int) -> None:
        self.count += count


def test_no_instrument_leaves_every_hook_none_and_one_sets_only_the_hooks_it_overrides() -> None:
    instruments = Instruments(0, structlog.get_logger(), lambda rank, tensors: "in_process")
    assert all(getattr(instruments, hook) is None for hook in HOOKS)
    assert not instruments.outgoing
    counting = Counting()
    instruments.add(counting)
    assert [hook for hook in HOOKS if getattr(instruments, hook) is not None] == ["handled"]
    assert not instruments.outgoing
    assert list(instruments) == [counting]
    assert counting in instruments
    instruments.remove(counting)
    assert all(getattr(instruments, hook) is None for hook in HOOKS)


def test_an_instrument_is_installed_once_and_removed_only_if_installed() -> None:
    instruments = Instruments(3, structlog.get_logger(), lambda rank, tensors: "in_process")
    counting = Counting()
    instruments.add(counting)
    with pytest.raises(ValueError, match="installed already on node 3"):
        instruments.add(counting)
    instruments.remove(counting)
    with pytest.raises(KeyError, match="not installed on node 3"):
        instruments.remove(counting)


async def test_with_no_instrument_installed_the_message_path_calls_none_of_their_machinery(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    for node in nodes(world):
        for instrument in list(node.instruments):
            node.instruments.remove(instrument)

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an instrument's hook was asked for with none installed")

    for name in ("made", "made_here", "left", "packed", "settle"):
        monkeypatch.setattr(Instruments, name, never)
    for hook in HOOKS:
        monkeypatch.setattr(Instrument, hook, never)
    system = world[0]
    here, there, busy = await system.spawn(Hop, on=0), await system.spawn(Hop, on=1), await system.spawn(Busy, on=1)
    assert await here.call(Hop.relay, 1) == 2
    assert await there.call(Hop.relay, 1) == 2
    there.tell(Hop.note, 1)
    here.tell(Hop.note, 1)
    assert [item async for item in there.stream(Hop.count, 2)] == [0, 1]
    assert [item async for item in here.stream(Hop.count, 2)] == [0, 1]
    assert await asyncio.gather(*actorch.broadcast([here, there, there], Hop.relay, 1)) == [2, 2, 2]
    await asyncio.gather(*(busy.call(Busy.hold, 0.01) for _ in range(2)))
    await until(lambda: sum(len(cell.metrics) for node in nodes(world) for cell in node.cells()) == 0)
    assert all(not cell.metrics for node in nodes(world) for cell in node.cells())  # the metrics were removed too


def test_each_hook_is_run_on_each_instrument_that_has_it_in_the_order_installed() -> None:
    instruments = Instruments(0, structlog.get_logger(), lambda rank, tensors: "lane")
    first, second = Recorder(0), Recorder(0)
    instruments.add(first)
    instruments.add(second)
    out = instruments.made("tell", 1, SYSTEM_IDS + 1, "actor 'a' (Hop) on node 1", "note")
    instruments.left(out, 0, b"body", b"wire", None)
    assert (
        first.events
        == second.events
        == [
            ("sending", "tell", "note", None),
            ("sent", "tell", "note", "lane", True, False),
        ]
    )
    assert out.carrier == {"recorder": "tell note from 0"}  # both wrote the same key
    assert instruments.outgoing


# ---------------------------------------------------------------- an instrument that fails


class Failing(Instrument):
    """Raises in ``sent`` (the second time it is called, if told so), and counts what it heard."""

    __slots__ = ("after", "heard")

    def __init__(self, after: int = 0) -> None:
        self.after = after
        self.heard = 0

    def sent(self, out: Outgoing, body: bytes | None, wire: bytes | None, tensors: list[Any] | None) -> None:
        self.heard += 1
        if self.heard > self.after:
            raise RuntimeError("the instrument broke")


class FailingWrapper(Instrument):
    """Raises while it wraps a handler."""

    __slots__ = ()

    def serving(
        self, actor: ActorView, endpoint: str, handler: Awaitable[Any], carried: dict[str, Any] | None
    ) -> Awaitable[Any]:
        raise RuntimeError("the wrapper broke")


async def test_an_instrument_that_raises_is_removed_and_logged_once_and_the_call_goes_on(world: LocalWorld) -> None:
    node = nodes(world)[0]
    hop = await world[0].spawn(Hop, on=1)
    failing, recorder = Failing(after=1), Recorder(0)
    node.instruments.add(failing)
    node.instruments.add(recorder)
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            assert await hop.call(Hop.relay, 1) == 2
    assert failing.heard == 2  # once well, once raising; then it was gone
    assert failing not in node.instruments
    assert recorder in node.instruments
    assert len(recorder.of("sent")) == 4  # the other instrument heard every call
    [logged] = [line for line in logs if line["event"] == "instrument failed and was removed"]
    assert logged["log_level"] == "error"
    assert logged["hook"] == "sent"
    assert logged["instrument"] == "<Failing>"
    assert str(logged["exc_info"]) == "the instrument broke"


def test_the_runtimes_metrics_alone_on_a_hook_is_called_directly_and_any_other_instrument_is_guarded() -> None:
    instruments = Instruments(0, structlog.get_logger(), lambda rank, tensors: "lane")
    metrics = Metrics()
    instruments.add(metrics)
    assert not Metrics.guarded
    assert Instrument.guarded
    assert instruments.handled == metrics.handled  # its bound method itself: no guard's frame per message
    recorder = Recorder(0)
    instruments.add(recorder)
    assert instruments.handled != metrics.handled  # two on the hook: the guard runs both, and removes one that raises
    instruments.remove(recorder)
    assert instruments.handled == metrics.handled


async def test_an_instrument_that_raises_while_it_wraps_a_handler_is_removed_and_the_handler_runs(
    world: LocalWorld,
) -> None:
    node = nodes(world)[1]
    hop = await world[0].spawn(Hop, on=1)
    wrapper = FailingWrapper()
    node.instruments.add(wrapper)
    with structlog.testing.capture_logs() as logs:
        assert await hop.call(Hop.relay, 1) == 2
        assert await hop.call(Hop.relay, 2) == 3
    assert wrapper not in node.instruments
    assert [line["hook"] for line in logs if line["event"] == "instrument failed and was removed"] == ["serving"]


async def test_wrapping_hooks_of_two_instruments_wrap_in_turn() -> None:
    order: list[str] = []

    class Wrapping(Instrument):
        __slots__ = ("name",)

        def __init__(self, name: str) -> None:
            self.name = name

        def serving(
            self, actor: ActorView, endpoint: str, handler: Awaitable[Any], carried: dict[str, Any] | None
        ) -> Awaitable[Any]:
            async def wrapped() -> Any:
                order.append(f"{self.name} in")
                result = await handler
                order.append(f"{self.name} out")
                return result

            return wrapped()

    instruments = Instruments(0, structlog.get_logger(), lambda rank, tensors: "lane")
    instruments.add(Wrapping("first"))
    instruments.add(Wrapping("second"))

    async def handler() -> int:
        order.append("handler")
        return 7

    assert instruments.serving is not None
    assert await instruments.serving(cast(ActorView, None), "relay", handler(), None) == 7
    assert order == ["second in", "first in", "handler", "first out", "second out"]


# ---------------------------------------------------------------- records and outcomes


def test_an_outgoing_record_carries_and_notes_only_once_asked() -> None:
    out = OutgoingMessage("call", 1, SYSTEM_IDS + 1, "actor 'a' (Hop) on node 1", "relay", None)
    assert out.carrier is None
    assert out.notes is None
    assert out.noted(Counting()) is None
    out.carry()["key"] = "value"
    assert out.carry() is out.carrier
    assert out.carrier == {"key": "value"}
    counting = Counting()
    out.note(counting, 5)
    assert out.noted(counting) == 5
    assert out.noted(counting) is None  # forgotten once read
    assert repr(out) == "<OutgoingMessage call 'relay' of actor 'a' (Hop) on node 1 path=None>"


def test_a_message_made_for_this_node_goes_local_and_one_for_another_takes_the_transports_path() -> None:
    paths: list[tuple[int, bool]] = []

    def path(rank: int, tensors: bool) -> str:
        paths.append((rank, tensors))
        return "torch_rpc" if tensors else "lane"

    instruments = Instruments(2, structlog.get_logger(), path)
    recorder = Recorder(2)
    instruments.add(recorder)
    carried = instruments.made_here("tell", SYSTEM_IDS + 1, "actor 'a' (Hop) on node 2", "note")
    assert carried == {"recorder": "tell note from 2"}
    out = instruments.made("call", 0, SYSTEM_IDS + 1, "actor 'b' (Hop) on node 0", "relay")
    wire = instruments.packed(out, ["envelope"], lambda envelope: repr(envelope).encode(), 9, b"body", [object()])
    assert wire == b"['envelope', {'recorder': 'call relay from 2'}]"
    assert (out.path, out.ident) == ("torch_rpc", 9)
    assert paths == [(0, True)]  # asked once, for the message to another node
    assert recorder.of("sent") == [("tell", "note", LOCAL, False, False), ("call", "relay", "torch_rpc", True, True)]


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, "ok"),
        (asyncio.CancelledError(), "cancelled"),
        (actorch.NodeLostError("gone"), "lost"),
        (ValueError("bad"), "error"),
        (actorch.ActorStoppedError("stopped"), "error"),
    ],
)
def test_outcome_of_names_how_a_call_ended(error: BaseException | None, outcome: str) -> None:
    assert outcome_of(error) == outcome


async def test_an_observed_call_reports_its_outcome_once_as_it_is_set() -> None:
    instruments = Instruments(0, structlog.get_logger(), lambda rank, tensors: "lane")
    recorder = Recorder(0)
    instruments.add(recorder)
    loop = asyncio.get_running_loop()

    def observed() -> ObservedCall[Any]:
        return ObservedCall(loop, (1, SYSTEM_IDS + 1), "relay", "actor 'a'", lambda call: None, instruments)

    ok, failed, failed_by_class, cancelled = observed(), observed(), observed(), observed()
    ok.set_result(2)
    failed.set_exception(actorch.NodeLostError("node 1 was lost"))
    failed_by_class.set_exception(ValueError)
    assert cancelled.cancel()
    assert not cancelled.cancel()  # once
    assert [event[2:5] for event in recorder.of("reply")] == [
        ("ok", "NoneType", "noted"),
        ("lost", "NodeLostError", "noted"),
        ("error", "ValueError", "noted"),
        ("cancelled", "NoneType", "noted"),
    ]
    for call in (failed, failed_by_class):
        with pytest.raises(Exception):  # noqa: B017, PT011 - retrieved, so that the loop does not warn of it
            call.result()
    assert ok.carrier == {"recorder": "call relay from 0"}  # an observed call is its own record: no second object
    assert isinstance(ok, Outgoing)
    assert (ok.verb, ok.rank, ok.path, ok.ident) == ("call", 1, None, 0)
    plain: RemoteCall[Any] = RemoteCall(loop, (1, SYSTEM_IDS + 1), "relay", "actor 'a'", lambda call: None)
    assert not isinstance(plain, Outgoing)


async def test_a_node_has_the_metrics_instrument_from_its_start_and_spans_only_when_on() -> None:
    async with local_world(2) as world:
        assert [type(instrument).__name__ for instrument in nodes(world)[1].instruments] == ["Metrics"]
    pytest.importorskip("opentelemetry", reason="spans need the otel extra (pip install 'actorch[otel]')")
    async with local_world(2, otel=True) as world:
        kinds = [type(instrument).__name__ for instrument in nodes(world)[1].instruments]
        assert kinds == ["Metrics", "NodeTelemetry"]
        assert repr(nodes(world)[1].instruments) == "<Instruments node 1 [<Metrics>, <NodeTelemetry node 1>]>"
