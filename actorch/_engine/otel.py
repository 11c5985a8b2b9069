"""OpenTelemetry spans of calls, tells and streams and of the handlers that serve them, linked across nodes.

With the ``otel`` option on, every node has a :class:`NodeTelemetry`
instrument (see ``instruments``). A call or stream made through a ref is a
CLIENT span on the caller (a tell: a PRODUCER span), started where it is
made, so that whatever span is current there (a user's own, or the handler's
that makes the call) is its parent. Its context crosses to the callee in what
the message carries for instruments, one more element of its envelope: the
headers the global propagator writes (W3C ``traceparent`` by default).
The handler that serves it runs in a SERVER span (a tell's: CONSUMER), child
of the call's span and current while the handler runs, so that the calls the
handler makes are children of it in turn. Calls between actors of one node,
which skip the wire, have the same two spans.

Spans are named ``Class/endpoint`` and carry the RPC conventions' attributes
(``rpc.system`` ``actorch``, ``rpc.service`` the actor's class,
``rpc.method`` the endpoint) and actorch's own: the actor, the nodes, the
path a message took, its size, and the outcome. A failed call or handler has
status ERROR and the exception recorded. Messages to the runtime's own
actors (the registry, the node services) are not spans.

actorch never configures OpenTelemetry: it takes the tracer of the global
tracer provider, which each process sets up for itself (the ``setup`` option
runs that on every node). This is the one module that imports OpenTelemetry,
and the node imports it only when the option is on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, NamedTuple, TypeVar

from actorch._base.deadline import PastDeadlineError
from actorch._base.errors import NodeLostError, RemoteError
from actorch._base.names import label_class
from actorch._base.version import version_of
from actorch._engine.instruments import LOCAL, ActorView, Instrument, Outgoing, Verb
from actorch._engine.message import Message
from actorch._engine.system_ids import SYSTEM_IDS
from actorch._engine.wire import message_size

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
except ImportError as exc:  # the extra is not installed: say which one, where the option was turned on
    raise ImportError(
        "actorch's otel option needs the OpenTelemetry API, which cannot be imported here "
        f"({exc}): pip install 'actorch[otel]'"
    ) from exc

__all__ = [
    "ACTOR",
    "BATCH_SIZE",
    "BYTES",
    "MESSAGE",
    "NODE",
    "OUTCOME",
    "PARENT",
    "PATH",
    "PEER_NODE",
    "NodeTelemetry",
    "Parent",
    "Span",
]

T = TypeVar("T")

NODE, PEER_NODE, ACTOR = "actorch.node", "actorch.peer.node", "actorch.actor"
"""The rank of the node that records the span, of the node at the other end, and the actor called (its label)."""
MESSAGE, PATH, BYTES, OUTCOME = "actorch.message", "actorch.path", "actorch.bytes", "actorch.outcome"
"""``call``, ``tell`` or ``stream``; the path a message took (``lane``, ``torch_rpc``, ``local``, ``in_process``),
the bytes it carried (body and tensors); how it ended: ``ok``, ``error``, ``timeout`` (a handler past its caller's
deadline), ``cancelled``, ``lost`` (the other node), ``closed`` (a stream its consumer left)."""
BATCH_SIZE = "actorch.batch.size"
"""The calls one run of a batched endpoint answered."""

PARENT = "otel.parent"
"""Where what a message carries holds the parent of its handler's span, on the handler's node (a :class:`Parent`)."""

_SYSTEM = "actorch"
_NO_CONTEXT = Context()  # a span started from it is a root: a message that came without a trace context


class Parent(NamedTuple):
    """What a message brings for the span of its handler: its sender's context and rank, and what it is.

    ``verb`` is ``call``, ``stream`` (a SERVER span) or ``tell`` (CONSUMER).
    """

    context: Context
    node: int
    verb: str


class NodeTelemetry(Instrument):
    """One node's OpenTelemetry instrument: it starts and ends the spans and carries their context.

    Messages to and from the runtime's own actors (the registry, the node
    services) are not spans.

    Args:
        rank: This node's rank.
    """

    __slots__ = ("rank", "tracer")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.tracer = trace.get_tracer("actorch", version_of("actorch"))  # the provider the process sets, when it does

    def __repr__(self) -> str:
        return f"<NodeTelemetry node {self.rank}>"

    # ------------------------------------------------------------------ the caller's side

    def sending(self, out: Outgoing) -> None:
        """Start the span of a call or stream (CLIENT) or tell (PRODUCER), child of the span current here; carry it.

        To another node its context goes as the propagator's headers; to an
        actor of this node, as the parent of its handler's span itself.
        """
        if out.actor_id <= SYSTEM_IDS:
            return
        kind = SpanKind.PRODUCER if out.verb == "tell" else SpanKind.CLIENT
        known = None if out.path is None else {PATH: out.path}
        span = self._start(kind, out.label, out.endpoint, out.rank, out.verb, known)
        out.note(self, span)
        context = trace.set_span_in_context(span)
        if out.path == LOCAL:
            out.carry()[PARENT] = Parent(context, self.rank, out.verb)
        else:
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context)
            if carrier:  # a span with no valid context (no SDK set up, no parent) has nothing to carry
                out.carry().update(carrier)

    def sent(self, out: Outgoing, body: bytes | None, wire: bytes | None, tensors: list[Any] | None) -> None:
        """Say where a message went and its size (to another node); a tell's span ends now."""
        notes = out.notes
        span: Span | None = None if notes is None else notes.get(self)
        if span is None:
            return
        if wire is not None:
            span.set_attributes({PATH: out.path or "", BYTES: message_size(body, tensors)})
        if out.verb == "tell":
            out.noted(self)
            self.ended(span)

    def reply(self, out: Outgoing, outcome: str, error: BaseException | None) -> None:
        """End the span of a call or stream with its outcome."""
        span: Span | None = out.noted(self)
        if span is not None:
            self.ended(span, error, outcome)

    @staticmethod
    def ended(span: Span, error: BaseException | None = None, outcome: str | None = None) -> None:
        """End a span the caller holds: with ``error`` (ERROR, recorded) or ``outcome`` (else ``ok``).

        A span that has ended already (or records nothing) is left as it is.
        """
        if not span.is_recording():
            return
        if error is not None:
            _failed(span, error)
        else:
            span.set_attribute(OUTCOME, outcome or "ok")
        span.end()

    # ------------------------------------------------------------------ the callee's side

    def arrived(self, message: Message, verb: Verb, src: int, ident: int) -> None:
        """The parent of the handler's span of a message from another node: the context it carries (or none)."""
        carried = message.carried
        parent = self.received(carried, src, verb)
        if carried is None:
            message.carried = {PARENT: parent}
        else:
            carried[PARENT] = parent

    def received(self, carrier: Any, src: int, verb: str = "call") -> Parent:
        """The parent of the handler's span of a ``verb`` from node ``src`` that carries ``carrier`` (or None)."""
        if isinstance(carrier, dict) and carrier:
            return Parent(propagate.extract(carrier, context=_NO_CONTEXT), src, verb)
        return Parent(_NO_CONTEXT, src, verb)

    def serving(
        self, actor: ActorView, endpoint: str, handler: Awaitable[Any], carried: dict[str, Any] | None
    ) -> Awaitable[Any]:
        """The handler, run in its SERVER (a tell's: CONSUMER) span, child of its caller's."""
        if actor.actor_id <= SYSTEM_IDS:
            return handler
        parent = None if carried is None else carried.get(PARENT)
        return self.serve(handler, actor.label, type(actor.instance).__name__, endpoint, parent)

    def serving_batch(
        self, actor: ActorView, endpoint: str, handler: Awaitable[Any], carried: list[dict[str, Any] | None]
    ) -> Awaitable[Any]:
        """One run of a batched endpoint, in a SERVER span linked to the span of each call it answers."""
        if actor.actor_id <= SYSTEM_IDS:
            return handler
        parents = [None if each is None else each.get(PARENT) for each in carried]
        return self.serve_batch(handler, actor.label, type(actor.instance).__name__, endpoint, parents)

    async def serve(
        self, handler: Awaitable[T], label: str, class_name: str, endpoint: str, parent: Parent | None
    ) -> T:
        """Run ``handler`` in its SERVER (a tell's: CONSUMER) span, the span current meanwhile."""
        if parent is None:  # none came with the message
            parent = Parent(_NO_CONTEXT, self.rank, "call")
        span = self.tracer.start_span(
            f"{class_name}/{endpoint}",
            parent.context,
            SpanKind.CONSUMER if parent.verb == "tell" else SpanKind.SERVER,
            attributes=self._attributes(label, class_name, endpoint, parent.node, parent.verb),
        )
        if not span.is_recording() and not span.get_span_context().is_valid:
            return await handler  # no SDK set up and no trace to pass on: nothing to make current
        return await _run_in(span, parent.context, handler)

    async def serve_batch(
        self, handler: Awaitable[T], label: str, class_name: str, endpoint: str, parents: Sequence[Parent | None]
    ) -> T:
        """Run one run of a batched endpoint in a SERVER span of its own, linked to the span of each call it answers.

        The run serves many callers at once, so it is no one call's child: a
        root span whose links lead to each caller's span.
        """
        links = [
            Link(context)
            for context in (trace.get_current_span(parent.context).get_span_context() for parent in parents if parent)
            if context.is_valid
        ]
        attributes = self._attributes(label, class_name, endpoint, self.rank, "call")
        attributes[BATCH_SIZE] = len(parents)
        span = self.tracer.start_span(
            f"{class_name}/{endpoint}", _NO_CONTEXT, SpanKind.SERVER, attributes=attributes, links=links
        )
        return await _run_in(span, _NO_CONTEXT, handler)

    # ------------------------------------------------------------------ internals

    def _start(
        self, kind: SpanKind, label: str, endpoint: str, peer: int, verb: str, known: dict[str, Any] | None = None
    ) -> Span:
        """Start a span of the caller's, child of the span current here, with what is ``known`` of it already.

        (The SDK checks attributes one by one, under a lock, each time some are set: all at once costs least.)
        """
        class_name = label_class(label)
        attributes = self._attributes(label, class_name, endpoint, peer, verb)
        if known is not None:
            attributes.update(known)
        return self.tracer.start_span(f"{class_name}/{endpoint}", kind=kind, attributes=attributes)

    def _attributes(self, label: str, class_name: str, endpoint: str, peer: int, verb: str) -> dict[str, Any]:
        return {
            "rpc.system": _SYSTEM,
            "rpc.service": class_name,
            "rpc.method": endpoint,
            ACTOR: label,
            MESSAGE: verb,
            NODE: self.rank,
            PEER_NODE: peer,
        }


async def _run_in(span: Span, parent: Context, handler: Awaitable[T]) -> T:
    """Await ``handler`` with ``span`` current (a child of ``parent``), then end the span with the outcome."""
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    try:
        result = await handler
    except BaseException as exc:
        _failed(span, exc)
        raise
    else:
        span.set_attribute(OUTCOME, "ok")
        return result
    finally:
        otel_context.detach(token)
        span.end()


def _failed(span: Span, error: BaseException) -> None:
    """Mark ``span`` failed with ``error``: status ERROR, the exception recorded, its type named."""
    if isinstance(error, asyncio.CancelledError):
        span.set_attribute(OUTCOME, "cancelled")
        return
    if isinstance(error, PastDeadlineError):  # the runtime cancelled the handler: its frames say nothing more
        span.set_attributes({OUTCOME: "timeout", "error.type": "TimeoutError"})
        span.set_status(Status(StatusCode.ERROR, "ran past its caller's deadline"))
        return
    span.set_attributes({OUTCOME: "lost" if isinstance(error, NodeLostError) else "error", "error.type": _type(error)})
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def _type(error: BaseException) -> str:
    """The class of ``error`` as ``error.type`` names it: a remote error's original class."""
    if isinstance(error, RemoteError):
        return error.type_name
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
