"""Calls into a node: received batches decoded, their messages handed to actors, replies sent back.

These functions are methods of :class:`~actorch._engine.node.Node` (it binds them in its
class body), kept here so that each half of the node reads on its own.

Replies go back on the response of the batch that brought their call when they
are ready within its port's hold (see ``Port``), else as messages of their own.
A batch from a node that is lost (stale), unknown or this one is refused and
logged once per node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actorch._base.errors import ActorStoppedError, MessageTooLargeError, SerializationError
from actorch._engine.cell import Cell
from actorch._engine.message import Envelope
from actorch._engine.wire import (
    CALL,
    CANCEL,
    CREDIT,
    GONE,
    REPLY,
    RUNTIME,
    TELL,
    error_payload,
    message_size,
    rebuild_error,
)
from actorch._transport.base import Batch, Port

if TYPE_CHECKING:
    from actorch._engine.node import Node

__all__ = ["BATCH_REPLY_HOLD", "deliver", "on_call", "on_cancel", "on_reply", "receive", "refuse_batch", "responder"]

BATCH_REPLY_HOLD = 0.1
"""Seconds past a batch's ``max_wait`` that a received message batch waits for a batched call's reply."""


def deliver(self: Node, cell: Cell, envelope: Envelope) -> None:
    """Hand a message to its actor's mailbox, or refuse it if the actor is stopping."""
    if cell.stopping:
        cell.fail(envelope, ActorStoppedError(f"{cell.label} is stopping; {envelope.endpoint!r} refused"))
    else:
        cell.submit(envelope)


def receive(self: Node, src: int, batch: Batch, port: Port | None) -> None:
    """Take a batch that came from ``src``: refuse it from a lost or unknown node, else dispatch each message."""
    messages, tensors = batch
    if src in self.lost or not 0 <= src < self.world_size or src == self.rank:
        self._refuse_batch(src, len(messages))
        if port is not None:
            port.release()
        return
    for index, raw in enumerate(messages):
        try:
            message = self.codec.decode_plain(raw)
            kind = message[0]
            if kind == REPLY:
                self._on_reply(message, tensors.get(index, []))
            elif kind in (CALL, TELL):
                self._on_call(src, message, tensors.get(index, []), port)
            elif kind == CREDIT:
                self.flow.credited(src, message[1])
            elif kind == CANCEL:
                self._on_cancel(src, message[1])
        except Exception:
            self.log.exception("malformed message dropped", src=src)
    if port is not None:
        port.release()


def refuse_batch(self: Node, src: int, count: int) -> None:
    """Drop messages from a node that is lost (stale), unknown or ourselves; log once per node."""
    self.counts["messages_refused"] += count
    if src not in self._refused_from:
        self._refused_from.add(src)
        why = self.lost.get(src) if src in self.lost else "not a node of this system"
        self.log.warning("messages refused from a lost or unknown node", src=src, count=count, why=why)


def on_call(self: Node, src: int, message: list[Any], tensors: list[Any], port: Port | None) -> None:
    """A call or tell for an actor of this node: decode it, check its size, and deliver it."""
    kind, call_id, actor_id, endpoint, remaining, chain, body = message
    is_call = kind == CALL
    self.counts["calls_received" if is_call else "tells_received"] += 1
    envelope = Envelope(
        endpoint,
        (),
        {},
        self.new_key(),
        tuple(chain),
        None if remaining is None else self.loop.time() + remaining,
        None,
    )
    cell = self._cells.get(actor_id)
    label = cell.label if cell is not None else f"actor #{actor_id} on node {self.rank}"
    if is_call:
        envelope.respond = self._responder(src, call_id, port)
        if port is not None:
            port.expect()
    else:
        envelope.respond = self._tell_done(src, actor_id, label, envelope)
    if cell is None:
        gone = ActorStoppedError(f"{GONE} #{actor_id}; {endpoint!r} refused (node {self.rank})")
        if is_call:
            self.log.info("call refused: actor stopped", src=src, actor=label, endpoint=endpoint)
        envelope.respond(False, (gone, RUNTIME))
        return
    if body is not None:
        size = message_size(body, tensors)
        if size > self.max_message_size:
            refused = MessageTooLargeError(
                f"{endpoint!r} of {cell.label} refused a message of {size:,} bytes from node {src}: over "
                f"max_message_size ({self.max_message_size:,})"
            )
            cell.fail(envelope, refused)
            return
        try:
            envelope.args, envelope.kwargs = self.codec.decode(body, tensors, self)
        except SerializationError as exc:
            cell.fail(envelope, SerializationError(f"arguments for {endpoint!r} of {cell.label}: {exc}"))
            return
    if is_call:
        self._incoming[(src, call_id)] = (cell, envelope)
        spec = cell.batched.get(endpoint) if cell.batched else None
        if spec is not None and port is not None:
            port.hold(spec.max_wait + BATCH_REPLY_HOLD)  # the batch's reply rides back on this batch's response
    self._deliver(cell, envelope)


def responder(self: Node, src: int, call_id: int, port: Port | None) -> Callable[[bool, Any], None]:
    """How a received call is answered: its reply goes back to ``src`` on the batch's port or on its own."""

    def respond(ok: bool, value: Any) -> None:
        self._incoming.pop((src, call_id), None)
        if src in self.lost or self.closed:
            if port is not None:
                port.release()
            return
        tensors = None
        if ok:
            try:
                body, tensors = self.codec.encode(value, cpu_only=self._cpu_only) if value is not None else (None, None)
                self._check_size(body, tensors, "the result of call {} from node {}", call_id, src)
                message = self._pack([REPLY, call_id, True, body])
            except SerializationError as error:
                refused = type(error)(f"result of call {call_id} from node {src}: {error}")
                self.log.warning("result refused", src=src, call=call_id, error=str(error))
                tensors = None
                message = self._pack([REPLY, call_id, False, error_payload(refused, RUNTIME)])
        else:
            failure, origin = value
            message = self._pack([REPLY, call_id, False, error_payload(failure, origin)])
        self.transport.reply(src, port, message, tensors)

    return respond


def on_reply(self: Node, message: list[Any], tensors: list[Any]) -> None:
    """A reply to one of our calls: settle the caller's future (and give back its mailbox slot)."""
    _, call_id, ok, payload = message
    entry = self._pending.pop(call_id, None)
    if entry is None:
        return  # the caller gave up (cancelled or timed out)
    self.flow.release((entry[1], entry[4]))
    future = entry[0]
    if future.done():
        return
    try:
        if not ok:
            error = rebuild_error(payload)
            if type(error) is ActorStoppedError and payload[2].startswith(GONE):
                error = ActorStoppedError(f"cannot call {entry[3]!r} of {entry[2]}: the actor has stopped")
            future.set_exception(error)
            return
        future.set_result(None if payload is None else self.codec.decode(payload, tensors, self))
    except SerializationError as exc:
        future.set_exception(exc)
    except Exception as exc:  # a reply we cannot read must still end the call, never hang it
        self.log.exception("unreadable reply", call=call_id, actor=entry[2], endpoint=entry[3])
        future.set_exception(SerializationError(f"the reply of {entry[2]}.{entry[3]} could not be read: {exc!r}"))


def on_cancel(self: Node, src: int, call_id: int) -> None:
    """The caller of a received call gave up: drop the message, or cancel its handler."""
    entry = self._incoming.pop((src, call_id), None)
    if entry is None:
        return
    cell, envelope = entry
    cell.cancel(envelope)
