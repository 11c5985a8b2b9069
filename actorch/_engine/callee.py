"""The called side of a node: calls and tells from other nodes handed to actors, and their replies sent back.

A :class:`Callee` owns the calls this node received and has not answered yet.
Replies go back on the response of the transport bundle that brought their
call when they are ready within its port's hold (see ``Port``), else as
messages of their own. A ``CAST`` (see ``multicast``) brings one call or tell
for several actors of this node: its arguments are decoded once, and each
actor gets its own message and reply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actorch._base.errors import ActorStoppedError, SerializationError
from actorch._engine.cell import Cell
from actorch._engine.message import Message, Origin, Reply
from actorch._engine.replies import TellDone
from actorch._engine.side import NodeSide, SideParts
from actorch._engine.wire import CALL, REPLY, encode_message, error_payload
from actorch._transport.base import Port

if TYPE_CHECKING:
    import torch

__all__ = ["BATCH_REPLY_HOLD", "CallReply", "Callee", "Received"]

BATCH_REPLY_HOLD = 0.1
"""Seconds past a batched endpoint's ``max_wait`` that a received bundle waits for the batch's replies."""


Received = tuple[Cell, Message]
"""A call this node received and has not answered yet: the actor's cell, and the message."""


class CallReply(Reply):
    """Sends a received call's outcome back to its caller: on the bundle's port if open, else on its own."""

    __slots__ = ("call_id", "callee", "port", "src")

    def __init__(self, callee: Callee, src: int, call_id: int, port: Port | None) -> None:
        self.callee = callee
        self.src = src
        self.call_id = call_id
        self.port = port

    def origin(self) -> tuple[int, int, bool]:
        """The calling node and its call id."""
        return self.src, self.call_id, False

    def result(self, message: Message, value: Any) -> None:
        """Encode the handler's result and send it (its own error if it cannot be sent)."""
        callee = self.callee
        if not callee.answering(self):
            return
        if value is None:
            callee.send_reply(self, [REPLY, self.call_id, True, None], None)
            return
        try:
            body, tensors = encode_message(
                callee.codec,
                value,
                callee.max_message_size,
                "the result of {!r} on node {} (call {} from node {})",
                message.endpoint,
                callee.rank,
                self.call_id,
                self.src,
                route=callee.transport.route(self.src),
            )
        except SerializationError as error:
            callee.log.warning("result refused", src=self.src, call=self.call_id, error=str(error))
            callee.send_reply(self, [REPLY, self.call_id, False, error_payload(error, Origin.RUNTIME)], None)
            return
        callee.send_reply(self, [REPLY, self.call_id, True, body], tensors)

    def error(self, message: Message, exc: BaseException, origin: Origin) -> None:
        """Send the error back."""
        if self.callee.answering(self):
            self.callee.send_reply(self, [REPLY, self.call_id, False, error_payload(exc, origin)], None)


class Callee(NodeSide):
    """Hands received calls and tells to this node's actors, answers calls, and cancels them for their callers."""

    __slots__ = ("calls_received", "incoming", "tells_received")

    def __init__(self, parts: SideParts, decode_context: object) -> None:
        super().__init__(parts, decode_context)
        self.incoming: dict[tuple[int, int], Received] = {}
        self.calls_received = 0
        self.tells_received = 0

    def __repr__(self) -> str:
        return f"<Callee node {self.rank} incoming={len(self.incoming)}>"

    def on_call(self, src: int, message: list[Any], tensors: list[Any], port: Port | None) -> None:
        """A call or tell for an actor of this node: decode it, check its size, and deliver it.

        The envelope may end with what its sender's instruments carry.
        """
        carried = message.pop() if len(message) > 7 else None
        kind, call_id, actor_id, endpoint, remaining, chain, body = message
        deadline = None if remaining is None else self.loop.time() + remaining
        call = call_id if kind == CALL else None
        self._deliver(src, call, actor_id, endpoint, deadline, tuple(chain), body, tensors, port, None, carried)

    def on_cast(self, src: int, message: list[Any], tensors: list[Any], port: Port | None) -> None:
        """One call or tell for several actors of this node: decode its arguments once, deliver one to each.

        The actors share the decoded arguments (one decoding per distinct actor
        device), so they must treat them as read-only, as same-node calls do.
        Each call has its own id, reply and cancellation; a tell's ids are None.
        """
        carriers = message.pop() if len(message) > 7 else None  # what each call's (or tell's) instruments carry
        _, call_ids, actor_ids, endpoint, remaining, chain, body = message
        if not isinstance(carriers, list) or len(carriers) != len(actor_ids):
            carriers = [None] * len(actor_ids)
        deadline = None if remaining is None else self.loop.time() + remaining
        chain = tuple(chain)
        shared: dict[torch.device | None, Any] = {}
        for index, actor_id in enumerate(actor_ids):
            call = None if call_ids is None else call_ids[index]
            self._deliver(src, call, actor_id, endpoint, deadline, chain, body, tensors, port, shared, carriers[index])
        if not shared:  # no actor took the arguments: what they lend goes back
            self.codec.drop(body)

    def _deliver(
        self,
        src: int,
        call_id: int | None,
        actor_id: int,
        endpoint: str,
        deadline: float | None,
        chain: tuple[int, ...],
        body: bytes | None,
        tensors: list[Any],
        port: Port | None,
        shared: dict[torch.device | None, Any] | None,
        carried: dict[str, Any] | None,
    ) -> None:
        """Hand one received call (``call_id``) or tell (None) to its actor, with its own reply.

        ``shared`` holds the arguments a ``CAST`` decoded already, by actor
        device; None for a message to one actor. ``carried`` is what its
        sender's instruments carried, if anything.
        """
        received = Message(endpoint, (), {}, self.new_key(), chain, deadline, None)
        received.carried = carried
        if self.instruments.arrived is not None:
            self.instruments.arrived(received, "tell" if call_id is None else "call", src, call_id or 0)
        cell = self.cells.get(actor_id)
        label = cell.label if cell is not None else f"actor #{actor_id} on node {self.rank}"
        if port is not None:
            received.autograd = port.autograd
        if call_id is not None:
            self.calls_received += 1
            received.reply = CallReply(self, src, call_id, port)
            if port is not None:
                port.expect()
        else:
            self.tells_received += 1
            received.reply = (
                TellDone(self.flow, self.log, src, actor_id, label)
                if cell is None
                else cell.tell_reply(src, self.flow, self.log)
            )
        if cell is None:
            if call_id is not None:
                self.log.debug("call refused: actor stopped", src=src, actor=label, endpoint=endpoint)
            gone = ActorStoppedError(f"no longer hosts actor #{actor_id}; {endpoint!r} refused (node {self.rank})")
            received.reply.error(received, gone, Origin.GONE)
            if shared is None:
                self.codec.drop(body)
            return
        if body is not None and not self.take_arguments(src, cell, received, body, tensors, shared):
            return
        if call_id is not None:
            self.incoming[(src, call_id)] = (cell, received)
            spec = cell.batched.get(endpoint) if cell.batched else None
            if spec is not None and port is not None:
                port.hold(spec.max_wait + BATCH_REPLY_HOLD)  # the batch's reply rides back on this bundle's response
        cell.deliver(received)

    def on_cancel(self, src: int, call_id: int) -> None:
        """The caller of a received call gave up: drop the message, or cancel its handler."""
        received = self.incoming.pop((src, call_id), None)
        if received is not None:
            received[0].cancel(received[1])

    def cancel_from(self, rank: int) -> None:
        """Node ``rank`` was lost: nobody waits for the handlers serving its calls any more."""
        for src, call_id in [key for key in self.incoming if key[0] == rank]:
            self.on_cancel(src, call_id)

    def close(self) -> None:
        """This node shuts down: nothing more is answered."""
        self.closed = True

    def answering(self, reply: CallReply) -> bool:
        """Forget a received call being answered; False if its caller cannot hear the answer any more."""
        self.incoming.pop((reply.src, reply.call_id), None)
        if reply.src in self.lost or self.closed:
            if reply.port is not None:
                reply.port.release()
            return False
        return True

    def send_reply(self, reply: CallReply, message: list[Any], tensors: list[Any] | None) -> None:
        """Send a reply's wire message to its caller's node."""
        self.transport.reply(reply.src, reply.port, self.pack(message), tensors)
