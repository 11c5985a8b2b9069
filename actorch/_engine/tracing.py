"""A node's part of a timeline: the spans of its calls, tells, handlers and mailbox waits while a trace runs.

``ActorSystem.trace`` installs a :class:`Tracing` instrument on every node,
which records into a :class:`NodeTrace`, and merges what each kept into one
file (``timeline``). While no trace runs, the message path pays nothing more
than for the hooks nobody observes. While one runs, a span costs a tuple
appended to a list: the clock readings it needs are those the runtime takes
anyway (a handler's start and end, a queued message's arrival), plus two per
call on the caller's side.

Both ends of a call decide alone whether it is sampled, from its flow id (the
caller's rank and its call id or stream id; a tell, and any message between
actors of one node, carries an id of its own sender's drawing), so that a
sampled call has its caller's span, its handler's span and the arrow between
them, and an unsampled one has none. Past ``max_events`` a node keeps
counting, not recording, so that a long run stays bounded in memory.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from actorch._engine.instruments import LOCAL, ActorView, Handling, Instrument, Outgoing
from actorch._engine.message import CallContext, Message, current_call
from actorch._engine.wire import message_size

__all__ = [
    "CALL_SPAN",
    "FLOW",
    "HANDLER_SPAN",
    "ITEM_MARK",
    "TELL_MARK",
    "WAIT_SPAN",
    "NodeTrace",
    "TraceSettings",
    "Tracing",
    "arrow",
    "current_track",
    "flow_id",
    "own_ident",
]

CALL_SPAN, TELL_MARK, HANDLER_SPAN, WAIT_SPAN = "call", "tell", "handler", "wait"
STREAM_SPAN, ITEM_MARK = "stream", "item"
"""What an event is: a call from its send to its outcome, a tell sent, a handler run, a mailbox wait, a stream
from its opening to its end (on the consumer), an item a producer sent."""

FLOW = "actorch.flow"
"""What a message carries for the timeline, when its flow id is its sender's own drawing (see ``Tracing``)."""
_BEGUN = "actorch.flow.begun"
"""What a message to an actor of this node carries of its call's span until it ends: its track, start and args."""

_RANK_SHIFT = 42
_OWN_IDS = 1 << 40  # flow ids a node draws itself (tells, same-node calls), apart from its call ids
_STREAM_IDS = 2 << 40  # the flow ids of the streams a node opens, by stream id
_MASK = (1 << 64) - 1
_SAMPLE_SCALE = 1 << 16


def own_ident(flow: int) -> int:
    """The id an own ``flow`` (``NodeTrace.own_flow``) was drawn from: what a tell carries on the wire."""
    return flow & (_OWN_IDS - 1)


def current_track() -> str:
    """The timeline track of the code running now: its actor's label, or ``main`` outside any actor."""
    context = current_call.get()
    return "main" if context is None else context.label


def arrow(origin: tuple[int, int, bool]) -> int:
    """The flow id of a message from another node, from its ``Reply.origin()``: what its sender drew too."""
    src, ident, stream = origin
    return (src << _RANK_SHIFT) | (_STREAM_IDS if stream else 0) | ident


def flow_id(src: int, ident: int, *, own: bool = False, stream: bool = False) -> int:
    """The id both ends give the arrow of message ``ident`` sent by node ``src``.

    ``ident`` is a call id, an ``own`` id (a tell's, a same-node call's) or a
    ``stream`` id; each kind has its own range.
    """
    return (src << _RANK_SHIFT) | (_OWN_IDS if own else _STREAM_IDS if stream else 0) | ident


@dataclass(frozen=True)
class TraceSettings:
    """What a trace keeps.

    Attributes:
        sample: The fraction of calls, tells and streams recorded, from 0 to 1
            (1: every one). Both ends of a message sample it alike.
        max_events: Events one node keeps at most; past it, they are counted
            (``dropped`` in the file's metadata) rather than kept.
    """

    sample: float = 1.0
    max_events: int = 200_000

    def __post_init__(self) -> None:
        if isinstance(self.sample, bool) or not isinstance(self.sample, (int, float)) or not 0 < self.sample <= 1:
            raise ValueError(f"a trace's sample is a fraction in (0, 1], not {self.sample!r}")
        if isinstance(self.max_events, bool) or not isinstance(self.max_events, int) or self.max_events < 1:
            raise ValueError(f"a trace's max_events is a positive number of events, not {self.max_events!r}")


class NodeTrace:
    """The events one node records while a trace runs, as plain data (they travel to the node that merges them).

    An event is ``(kind, track, name, start_ns, end_ns, flow, args)``: ``track``
    is the actor's label (``"main"`` for code outside any actor), times are
    ``perf_counter_ns()`` of this node, ``flow`` the arrow's id (0: none).
    Events are tuples of strings and numbers, ``args`` a dict of those: the
    garbage collector stops tracking such objects, so that a long trace does
    not make every full collection walk it.

    The two records made for every message, a call's span (``opened`` then
    ``closed``) and a handler's run (``ran``), are kept as they come, tuples
    of their parts, and become events in ``finish``: their names and args are
    made once, when the trace ends, not on the message path.

    Args:
        rank: This node's rank.
        settings: What to keep.
    """

    __slots__ = (
        "_own_ids",
        "_threshold",
        "closed_spans",
        "dropped",
        "events",
        "every",
        "open_spans",
        "rank",
        "room",
        "runs",
        "started",
    )

    def __init__(self, rank: int, settings: TraceSettings) -> None:
        self.rank = rank
        self.events: list[tuple[Any, ...]] = []
        self.room = settings.max_events  # events it may keep still, those of open_spans and runs counted
        self.dropped = 0
        self.started = perf_counter_ns()
        self.every = settings.sample >= 1  # every message is sampled
        self._threshold = int(settings.sample * _SAMPLE_SCALE)
        # calls and streams sent and not yet ended, by flow id:
        # (kind, track, verb, endpoint, start, to, node, path, bytes)
        self.open_spans: dict[int, tuple[Any, ...]] = {}
        self.closed_spans: list[tuple[Any, ...]] = []  # (what open_spans held, end, flow, outcome)
        self.runs: list[
            tuple[Any, ...]
        ] = []  # handler runs: (track, endpoint, queued_at, started, ended, flow, outcome)
        self._own_ids = itertools.count(1)

    def __repr__(self) -> str:
        kept = len(self.events) + len(self.closed_spans) + len(self.runs)
        return f"<NodeTrace node {self.rank} records={kept} dropped={self.dropped}>"

    def sampled(self, flow: int) -> bool:
        """Whether the message of arrow ``flow`` is recorded (alike on every node of the trace)."""
        if self.every:
            return True
        mixed = ((flow + 0x9E3779B97F4A7C15) * 0xBF58476D1CE4E5B9) & _MASK
        return (mixed >> 40) % _SAMPLE_SCALE < self._threshold

    def own_flow(self) -> int:
        """A fresh arrow for a message of this node that has no call id (a tell, a same-node call); 0 if unsampled.

        A tell carries its ``own_ident`` in its call id's place, so that the
        callee draws the same arrow.
        """
        flow = flow_id(self.rank, next(self._own_ids), own=True)
        return flow if self.every or self.sampled(flow) else 0

    def add(self, event: tuple[Any, ...]) -> None:
        """Keep ``event``, unless the node already keeps ``max_events``."""
        if self.room > 0:
            self.room -= 1
            self.events.append(event)
        else:
            self.dropped += 1

    def opened(
        self,
        kind: str,
        flow: int,
        track: str,
        verb: str,
        endpoint: str,
        to: str,
        node: int,
        path: str | None,
        size: int,
    ) -> None:
        """A call or stream of arrow ``flow`` to ``to`` on ``node`` left now (``size`` bytes), its span open.

        Its span ends with ``closed``. The caller decides whether the arrow is
        sampled (``sampled``).
        """
        self.open_spans[flow] = (kind, track, verb, endpoint, perf_counter_ns(), to, node, path, size)

    def closed(self, flow: int, outcome: str) -> None:
        """The call or stream of arrow ``flow`` has its outcome, if it was opened here."""
        opened = self.open_spans.pop(flow, None)
        if opened is not None:
            if self.room > 0:
                self.room -= 1
                self.closed_spans.append((opened, perf_counter_ns(), flow, outcome))
            else:
                self.dropped += 1

    def ran(self, track: str, endpoint: str, queued_at: int, started: int, ended: int, flow: int, outcome: str) -> None:
        """A handler run of arrow ``flow`` on ``track``, after its wait in the mailbox from ``queued_at`` (0: none).

        Its wait is an event of its own; either is left out if it began
        before the trace.
        """
        if started < self.started:
            return
        needed = 2 if queued_at >= self.started else 1
        if self.room >= needed:
            self.room -= needed
            self.runs.append((track, endpoint, queued_at, started, ended, flow, outcome))
        else:
            self.dropped += needed

    def mark(self, kind: str, track: str, name: str, flow: int, args: dict[str, Any]) -> None:
        """Something happened now on ``track`` (a tell sent, a stream item): an instant, with its arrow if any."""
        now = perf_counter_ns()
        self.add((kind, track, name, now, now, flow, args))

    def span(self, kind: str, track: str, name: str, start: int, end: int, flow: int, args: dict[str, Any]) -> None:
        """A span that already ended on ``track`` (a same-node call), unless it began before the trace."""
        if start >= self.started:
            self.add((kind, track, name, start, end, flow, args))

    def finish(self) -> dict[str, Any]:
        """Everything recorded, as events, calls still open ending now as ``unfinished``; nothing is recorded after."""
        now = perf_counter_ns()
        events = self.events
        for flow, opened in self.open_spans.items():
            if self.room > 0:
                self.room -= 1
                self.closed_spans.append((opened, now, flow, "unfinished"))
            else:
                self.dropped += 1
        self.open_spans.clear()
        for (kind, track, verb, endpoint, start, to, node, path, size), end, flow, outcome in self.closed_spans:
            args = {"to": to, "node": node, "path": path, "bytes": size, "outcome": outcome}
            events.append((kind, track, f"{verb} {endpoint}", start, end, flow, args))
        started = self.started
        for track, endpoint, queued_at, begun, ended, flow, outcome in self.runs:
            if queued_at >= started:
                events.append((WAIT_SPAN, track, endpoint, queued_at, begun, flow, {}))
            events.append((HANDLER_SPAN, track, endpoint, begun, ended, flow, {"outcome": outcome}))
        self.closed_spans, self.runs = [], []
        return {
            "rank": self.rank,
            "events": events,
            "dropped": self.dropped,
            "started": self.started,
            "ended": now,
        }


class Tracing(Instrument):
    """The timeline's instrument: it records a node's messages into ``trace`` while a trace runs.

    A call or stream to another node has its arrow's id from its call or
    stream id, which the receiving node knows too (``Reply.origin``: it
    needs no hook on arrival, and the message no carrier); any other message (a
    tell, a message between actors of one node) carries an id of its
    sender's drawing (``NodeTrace.own_flow``), only if sampled. A mailbox
    wait is recorded with the run it preceded, in ``handled``: one hook per
    message costs less than two. The hooks run for every message while a
    trace runs, so they compute flow ids in place rather than call
    ``flow_id``.

    Args:
        trace: What this node records.
    """

    __slots__ = ("rank", "trace")

    def __init__(self, trace: NodeTrace) -> None:
        self.trace = trace
        self.rank = trace.rank << _RANK_SHIFT  # as flow ids hold it

    def __repr__(self) -> str:
        return f"<Tracing {self.trace!r}>"

    # ------------------------------------------------------------------ the sender's node

    def sending(self, out: Outgoing) -> None:
        """Draw the arrow of a message with no call or stream id on the wire, and carry it; a local call's begins."""
        local = out.path == LOCAL
        if not (local or out.verb == "tell"):
            return
        flow = self.trace.own_flow()
        if not flow:
            return
        carried = out.carry()
        carried[FLOW] = flow
        if local and out.verb != "tell":  # its span, kept until it ends (see reply and handled)
            carried[_BEGUN] = (current_track(), perf_counter_ns(), {"to": out.label, "path": LOCAL})

    def sent(self, out: Outgoing, body: bytes | None, wire: bytes | None, tensors: list[Any] | None) -> None:
        """Mark a tell; open the span of a call or stream to another node, which ``reply`` closes."""
        verb = out.verb
        if verb == "tell":
            carrier = out.carrier
            flow = 0 if carrier is None else carrier.get(FLOW, 0)
            if flow:
                args: dict[str, Any] = {"to": out.label, "path": out.path}
                if wire is not None:
                    args["node"] = out.rank
                    args["bytes"] = message_size(wire, tensors)
                self.trace.mark(TELL_MARK, current_track(), f"tell {out.endpoint}", flow, args)
        elif wire is not None:
            flow = self.rank | (_STREAM_IDS if verb == "stream" else 0) | out.ident
            trace = self.trace
            if trace.every or trace.sampled(flow):
                trace.opened(
                    CALL_SPAN if verb == "call" else STREAM_SPAN,
                    flow,
                    current_track(),
                    verb,
                    out.endpoint,
                    out.label,
                    out.rank,
                    out.path,
                    message_size(wire, tensors) if tensors else len(wire),
                )

    def reply(self, out: Outgoing, outcome: str, error: BaseException | None) -> None:
        """End the span of a call or stream with its outcome (a stream's is ``ended``, unless its node was lost)."""
        verb = out.verb
        if verb == "stream" and outcome != "lost":
            outcome = "ended"
        if out.path != LOCAL:
            if out.ident:  # else it was never sent
                self.trace.closed(self.rank | (_STREAM_IDS if verb == "stream" else 0) | out.ident, outcome)
            return
        carried = out.carrier
        begun = None if carried is None else carried.pop(_BEGUN, None)
        if begun is None or carried is None:  # not sampled, or run in its caller's task (see handled)
            return
        track, started, args = begun
        args["outcome"] = outcome
        kind = CALL_SPAN if verb == "call" else STREAM_SPAN
        self.trace.span(kind, track, f"{verb} {out.endpoint}", started, perf_counter_ns(), carried[FLOW], args)

    # ------------------------------------------------------------------ the actor's node

    def handled(self, actor: ActorView, handling: Handling, ended: int, failed: bool, count: int) -> None:
        """A traced message's run on its actor's track, after its wait in the mailbox if it waited.

        One run in its caller's task (``inline``) has its call's span too, begun and ended with it.
        """
        carried = handling.carried
        flow = 0 if carried is None else carried.get(FLOW, 0)
        trace, endpoint, started = self.trace, handling.endpoint, handling.started
        if not isinstance(handling, CallContext):
            if not flow:  # a call or a stream from another node: its arrow is its id there
                origin = None if handling.reply is None else handling.reply.origin()
                if origin is None:
                    return
                flow = arrow(origin)
                if not (trace.every or trace.sampled(flow)):
                    return
            outcome = "error" if failed else "cancelled" if handling.cancelled else "ok"
            trace.ran(actor.label, endpoint, handling.queued_at, started, ended, flow, outcome)
            return
        if not flow or carried is None:
            return
        outcome = "error" if failed else "ok"
        begun = carried.pop(_BEGUN, None)
        track, _, called = begun if begun is not None else (current_track(), 0, {"to": actor.label, "path": LOCAL})
        called["outcome"] = outcome
        trace.span(CALL_SPAN, track, f"call {endpoint}", started, ended, flow, called)
        trace.span(HANDLER_SPAN, actor.label, endpoint, started, ended, flow, {"outcome": outcome, "inline": True})

    def stream_item(self, message: Message, index: int, wire: bytes | None, tensors: list[Any] | None) -> None:
        """Mark an item a traced stream's producer sent, on the producing handler's track."""
        carried = message.carried
        if carried is None or not carried.get(FLOW):  # a stream from another node: sampled by its id there
            origin = None if message.reply is None else message.reply.origin()
            if origin is None or not self.trace.sampled(arrow(origin)):
                return
        sent: dict[str, Any] = {"index": index}
        if wire is not None:
            sent["bytes"] = message_size(wire, tensors)
        self.trace.mark(ITEM_MARK, current_track(), "item", 0, sent)
