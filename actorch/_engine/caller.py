"""The calling side of a node: ``call`` and ``tell`` to actors of this node or of others, and their replies.

A :class:`Caller` owns the calls this node has sent and not yet heard back
from. A call to an actor of this node skips the wire: its handler runs in the
caller's task when the mailbox allows, else waits in the queue. Everything else
is encoded in the format of ``wire`` and sent through the transport, bounded by
the flow control (``mailbox_size``) and by ``max_message_size``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine
from time import monotonic, perf_counter_ns
from typing import TYPE_CHECKING, Any, NoReturn

from actorch._base.codec import Shared
from actorch._base.deadline import inherited_deadline
from actorch._base.errors import (
    ActorStoppedError,
    EndpointError,
    MailboxFullError,
    NodeLostError,
    SerializationError,
    SystemClosedError,
    actor_stopped,
)
from actorch._engine.calls import RemoteCall
from actorch._engine.message import CallContext, Message, Origin, current_call
from actorch._engine.replies import LocalReply, log_heard_failure
from actorch._engine.side import NodeSide, SideParts
from actorch._engine.system_ids import SYSTEM_IDS
from actorch._engine.tracing import CALL_SPAN, HANDLER_SPAN, TELL_MARK, NodeTrace, current_track, own_ident
from actorch._engine.waits import WaitGraph, describe_cycle
from actorch._engine.wire import CALL, CANCEL, TELL, encode_message, handler_error, message_size, rebuild_error
from actorch._transport.autograd import NO_CONTEXT, current_context_id

if TYPE_CHECKING:
    from actorch._engine.otel import Span
    from actorch._engine.streaming import Streams

__all__ = ["Caller"]


class Caller(NodeSide):
    """Sends this node's calls and tells, and settles each call when its reply comes."""

    __slots__ = ("_abandon_call", "_call_ids", "calls_sent", "pending", "streams", "tells_sent")

    def __init__(self, parts: SideParts) -> None:
        super().__init__(parts)
        self.pending: dict[int, RemoteCall[Any]] = {}
        self.calls_sent = 0
        self.tells_sent = 0
        self._call_ids = itertools.count(1)
        self._abandon_call = self._abandon  # bound once: every remote call holds it
        self.streams: Streams  # the node's, set by the node: refs open streams through their caller

    def __repr__(self) -> str:
        return f"<Caller node {self.rank} pending={len(self.pending)}>"

    def call(
        self,
        rank: int,
        actor_id: int,
        endpoint: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        label: str,
        deadline: float | None,
    ) -> Coroutine[Any, Any, Any]:
        """Call ``endpoint`` of actor ``actor_id`` on ``rank``; await what this returns for the result.

        A call to another node is sent before this returns (or, if its mailbox
        is full, as soon as there is room); its errors are raised where it is
        awaited. A call to this node's own actor runs when awaited: in the
        caller's task if the mailbox allows. ``deadline`` is the caller's.
        """
        if asyncio.events._get_running_loop() is not self.loop:  # another thread: send once it runs on the loop
            return self._call_on_loop(rank, actor_id, endpoint, args, kwargs, label, deadline)
        context = current_call.get()
        chain = context.child_chain() if context is not None else ()
        if rank == self.rank:
            return self._call_local(actor_id, endpoint, args, kwargs, chain, label, deadline)
        target = (rank, actor_id)
        call: RemoteCall[Any] = RemoteCall(self.loop, target, endpoint, label, self._abandon_call)
        if context is not None:
            call.device = context.device
        otel = self.otel
        span = None if otel is None or actor_id <= SYSTEM_IDS else otel.call_sent(call, label, endpoint, rank)
        body = None
        try:
            self.check_reachable("call", rank, endpoint, label)
            if args or kwargs:
                body, tensors = encode_message(
                    self.codec,
                    [args, kwargs],
                    self.max_message_size,
                    "call to {!r} of {}",
                    endpoint,
                    label,
                    route=self.transport.route(rank),
                    arguments=True,
                )
            else:
                tensors = None
            if self.backlog(rank) <= self.send_budget and self.flow.try_take(target):
                self._launch(call, body, tensors, chain, deadline, span)
            else:
                call.waiting = self.loop.create_task(self._launch_when_room(call, body, tensors, chain, deadline, span))
        except Exception as exc:  # noqa: BLE001 - raised where the call is awaited, like a coroutine's error
            self.codec.drop(body)  # never sent: what its tensors lend goes back
            call.settled()
            # after the loop ran once: a retry loop around a call that fails at once cannot starve the node
            self.loop.call_soon(_fail, call, exc)
        return call

    async def _call_on_loop(
        self,
        rank: int,
        actor_id: int,
        endpoint: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        label: str,
        deadline: float | None,
    ) -> Any:
        """A call made off the node's loop (``asyncio.run_coroutine_threadsafe``): made when this runs there."""
        return await self.call(rank, actor_id, endpoint, args, kwargs, label, deadline)

    def _launch(
        self,
        call: RemoteCall[Any],
        body: Any,
        tensors: Any,
        chain: tuple[int, ...],
        deadline: float | None,
        span: Span | None = None,
    ) -> None:
        """Send ``call``, which holds a slot of its target's window, unless its deadline has passed.

        ``span`` is the call's OpenTelemetry span, whose context the envelope then carries.
        """
        rank, actor_id = call.target
        remaining = None
        if deadline is not None:
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                self.flow.release(call.target)
                raise TimeoutError(f"deadline passed before calling {call.endpoint!r} of {call.label}")
        call.call_id = call_id = next(self._call_ids)
        call.sent_at = monotonic()
        self.pending[call_id] = call
        envelope = [CALL, call_id, actor_id, call.endpoint, remaining, chain, body]
        if span is not None:
            self._carry(envelope, span, rank, body, tensors)
        wire = self.pack(envelope)
        if self.trace is not None:
            self.trace.call_sent(
                call_id, current_track(), f"call {call.endpoint}", self._sent(call.label, rank, wire, tensors)
            )
        self._send(rank, wire, tensors)
        self.calls_sent += 1

    async def _launch_when_room(
        self,
        call: RemoteCall[Any],
        body: Any,
        tensors: Any,
        chain: tuple[int, ...],
        deadline: float | None,
        span: Span | None = None,
    ) -> None:
        """Wait for room in the call's mailbox (within its deadline), then send it."""
        try:
            await self.wait_backlog("call", call.target[0], deadline, call.endpoint, call.label)
            await self.wait_room("call", call.target, deadline, call.endpoint, call.label)
            self.check_reachable("call", call.target[0], call.endpoint, call.label)
            self._launch(call, body, tensors, chain, deadline, span)
        except asyncio.CancelledError:
            self.codec.drop(body)  # never sent: what its tensors lend goes back
            raise  # the call was cancelled: it has its outcome
        except Exception as exc:  # noqa: BLE001 - the call's own error, raised where it is awaited
            self.codec.drop(body)
            if not call.done():
                call.settled()
                call.set_exception(exc)
        finally:
            call.waiting = None

    def _tell_here(
        self, actor_id: int, endpoint: str, label: str, body: bytes | None, tensors: list[Any] | None
    ) -> None:
        """Deliver a tell to an actor of this node, its arguments decoded from their copy (``body``, or none)."""
        cell = self.cells.get(actor_id)
        if cell is None or cell.stopping:
            self.log.warning("tell dropped: actor stopped", actor=label, endpoint=endpoint)
            return
        if not self.flow.try_take((self.rank, actor_id)):
            raise self._mailbox_full(endpoint, label)
        args: Any = ()
        kwargs: Any = {}
        if body is not None:
            args, kwargs = self.codec.decode(body, tensors or [], self)
        reply = cell.tell_reply(None, self.flow, self.log)
        message = Message(endpoint, args, kwargs, self.new_key(), (), None, reply)
        if cell.otel is not None:
            message.otel = cell.otel.told_here(label, endpoint)
        self.tells_sent += 1
        if self.trace is not None:
            message.flow = self._traced_tell(self.trace, label, endpoint)
        cell.deliver(message)

    def _abandon(self, call: RemoteCall[Any]) -> None:
        """``call`` was cancelled: it leaves the mailbox line, or the callee is told to cancel it."""
        if call.waiting is not None:
            call.waiting.cancel()
            return
        if self.pending.pop(call.call_id, None) is not None and call.target[0] not in self.lost:
            self.flow.release(call.target)
            self.transport.send(call.target[0], self.pack([CANCEL, call.call_id]))
            if self.trace is not None:
                self.trace.call_ended(call.call_id, "cancelled")

    def tell(
        self, rank: int, actor_id: int, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], label: str
    ) -> None:
        """Send ``endpoint`` a message without waiting; tensors are copied at once.

        A tell to another node is refused before anything is encoded when that
        node is gone (logged) or what is on its way there is over the send budget.
        """
        what = "tell of {!r} to {}"
        if rank == self.rank:
            body, tensors = (
                encode_message(self.codec, [args, kwargs], None, what, endpoint, label, copy_tensors=True)
                if args or kwargs
                else (None, None)
            )
            self._tell_here(actor_id, endpoint, label, body, tensors)
            return
        if rank in self.lost or self.closed:
            self.log.warning("tell dropped: node lost", actor=label, endpoint=endpoint, why=self.lost.get(rank))
            return
        backlog = self.backlog(rank)
        if backlog > self.send_budget:
            raise MailboxFullError(
                f"cannot tell {endpoint!r} to {label}: {backlog:,} bytes from node {self.rank} toward node {rank} have "
                f"not reached it (send_budget {self.send_budget:,}; the node may be frozen or overloaded); a call "
                "would wait for them to drain, a tell cannot"
            )
        body, tensors = None, None
        if args or kwargs:
            route = self.transport.route(rank)
            body, tensors = encode_message(
                self.codec,
                [args, kwargs],
                self.max_message_size,
                what,
                endpoint,
                label,
                copy_tensors=True,
                route=route,
                arguments=True,
            )
        target = (rank, actor_id)
        if not self.flow.try_take(target):
            self.codec.drop(body)  # refused before it left: what its tensors lend goes back
            raise self._mailbox_full(endpoint, label)
        self.tells_sent += 1
        envelope = [TELL, 0, actor_id, endpoint, None, (), body]
        if self.otel is not None and actor_id > SYSTEM_IDS:
            carrier = self.otel.told(
                label, endpoint, rank, self.transport.path(rank, bool(tensors)), message_size(body, tensors)
            )
            if carrier is not None:
                envelope.append(carrier)
        if self.trace is None:
            self._send(rank, self.pack(envelope), tensors)
        else:
            self._send_traced_tell(self.trace, rank, envelope, label, tensors)

    def on_reply(self, message: list[Any], tensors: list[Any]) -> None:
        """A reply to one of our calls: settle the caller's future (and give back its mailbox slot)."""
        _, call_id, ok, payload = message
        pending = self.pending.pop(call_id, None)
        if pending is None:
            if ok:
                self.codec.drop(payload)  # the caller gave up (cancelled or timed out): the result is dropped
            return
        if self.trace is not None:
            self.trace.call_ended(call_id, "ok" if ok else "error")
        self.flow.release(pending.target)
        pending.settled()
        if pending.done():
            if ok:
                self.codec.drop(payload)
            return
        try:
            if not ok:
                if payload[0] == Origin.GONE:
                    error: BaseException = actor_stopped(f"call {pending.endpoint!r}", pending.label)
                else:
                    error = rebuild_error(payload, pending.label, pending.endpoint)
                pending.set_exception(error)
                return
            pending.set_result(None if payload is None else self.codec.decode(payload, tensors, self, pending.device))
        except SerializationError as exc:
            pending.set_exception(exc)
        except Exception as exc:  # a reply we cannot read must still end the call, never hang it
            self.log.exception("unreadable reply", call=call_id, actor=pending.label, endpoint=pending.endpoint)
            pending.set_exception(
                SerializationError(f"the reply of {pending.label}.{pending.endpoint} could not be read: {exc!r}")
            )

    def fail_rank(self, rank: int, why: str) -> None:
        """Node ``rank`` was lost: its pending calls fail with ``NodeLostError`` (``ActorStoppedError`` if it left)."""
        for call_id, pending in list(self.pending.items()):
            if pending.target[0] == rank:
                del self.pending[call_id]
                pending.settled()
                if self.trace is not None:
                    self.trace.call_ended(call_id, "lost")
                if not pending.done():
                    pending.set_exception(
                        self.left_error(rank, f"{pending.label} stopped while handling {pending.endpoint!r}")
                        or NodeLostError(
                            f"node {rank} was lost while calling {pending.endpoint!r} of {pending.label}: {why}"
                        )
                    )

    def close(self) -> None:
        """This node shuts down: every pending call fails with ``SystemClosedError``."""
        self.closed = True
        for pending in self.pending.values():
            pending.settled()
            if not pending.done():
                pending.set_exception(
                    SystemClosedError(
                        f"node {self.rank} shut down while calling {pending.endpoint!r} of {pending.label}"
                    )
                )
        self.pending.clear()

    # ------------------------------------------------------------------ internals

    def _sent(self, label: str, rank: int, wire: bytes, tensors: list[Any] | None) -> dict[str, Any]:
        """Where a message went, by which path, and its size, for a trace's span of it."""
        path = self.transport.path(rank, bool(tensors))
        return {"to": label, "node": rank, "path": path, "bytes": message_size(wire, tensors)}

    def _send_traced_tell(
        self, trace: NodeTrace, rank: int, envelope: list[Any], label: str, tensors: list[Any] | None
    ) -> None:
        """Send a tell while a trace runs: if sampled, it carries its own id in the call id's place, and is marked."""
        flow = trace.own_flow()
        envelope[1] = own_ident(flow)
        endpoint = envelope[3]
        wire = self.pack(envelope)
        if flow:
            trace.mark(TELL_MARK, current_track(), f"tell {endpoint}", flow, self._sent(label, rank, wire, tensors))
        self._send(rank, wire, tensors)

    def _traced_tell(self, trace: NodeTrace, label: str, endpoint: str) -> int:
        """Mark a same-node tell on the running trace if it is sampled: its arrow's id (0: not sampled)."""
        flow = trace.own_flow()
        if flow:
            trace.mark(TELL_MARK, current_track(), f"tell {endpoint}", flow, {"to": label, "path": "local"})
        return flow

    def _traced_inline(
        self, trace: NodeTrace, label: str, endpoint: str, started: int, ended: int, failed: bool
    ) -> None:
        """A same-node call run in its caller's task: the caller's span, the handler's, and the arrow between."""
        flow = trace.own_flow()
        if flow:
            outcome = "error" if failed else "ok"
            called = {"to": label, "path": "local", "outcome": outcome}
            trace.span(CALL_SPAN, current_track(), f"call {endpoint}", started, ended, flow, called)
            trace.span(HANDLER_SPAN, label, endpoint, started, ended, flow, {"outcome": outcome, "inline": True})

    def _carry(self, envelope: list[Any], span: Span, rank: int, body: bytes | None, tensors: list[Any] | None) -> None:
        """Add the context of a call's span to its envelope (if it has one), and where the call goes, to the span."""
        assert self.otel is not None
        carrier = self.otel.carrier(span, self.transport.path(rank, bool(tensors)), message_size(body, tensors))
        if carrier is not None:
            envelope.append(carrier)

    def _send(self, rank: int, wire: bytes, tensors: list[Any] | None) -> None:
        """Send a call or tell; one made in a distributed autograd context leaves alone, to keep its reply's link."""
        if current_context_id() == NO_CONTEXT:
            self.transport.send(rank, wire, tensors)
        else:
            self.transport.send_alone(rank, wire, tensors)

    def _mailbox_full(self, endpoint: str, label: str) -> MailboxFullError:
        return MailboxFullError(
            f"cannot tell {endpoint!r} to {label}: {self.flow.window} messages from node {self.rank} are already "
            "waiting there (mailbox_size); a call would wait for room, a tell cannot"
        )

    async def _call_local(  # noqa: RET503, PLR0915 - it ends in _raise_after_a_turn, which raises; the hot path, in one frame
        self,
        actor_id: int,
        endpoint: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        chain: tuple[int, ...],
        label: str,
        deadline: float | None,
    ) -> Any:
        """Call an actor of this node: in the caller's task when the mailbox allows, else through the queue."""
        cell = self.cells.get(actor_id)
        if cell is None or cell.stopping:
            await _raise_after_a_turn(ActorStoppedError(f"cannot call {endpoint!r}: {label} is stopped"))
        key = self.new_key()
        if endpoint in cell.batched or not cell.can_start(chain):
            return await self._call_queued(actor_id, endpoint, args, kwargs, chain, label, deadline, key)
        otel = cell.otel
        span = parent = None
        if otel is not None:  # the caller's span, and the handler's within it
            span = otel.call_started(label, endpoint)
            parent = otel.parent(span)
        outcome: BaseException | None = None  # how the call ended, for its span: None if it returned
        task = asyncio.current_task()
        assert task is not None
        context = CallContext(cell.label, key, chain, endpoint, cell.device, cell.node)
        context.task = task
        cell.enter(key, context)
        cell.inline.enter(task)
        token = current_call.set(context)
        deadline_token = inherited_deadline.set(deadline)  # for a caller that is another task
        context.started = started = perf_counter_ns()
        failed = True
        error: Exception
        try:
            try:
                coroutine = cell.open(endpoint, args, kwargs, parent=parent)
            except EndpointError as exc:
                log_heard_failure(self.log, cell.label, endpoint, exc, Origin.RUNTIME)
                error = outcome = exc
            else:
                try:
                    result = await coroutine
                except asyncio.CancelledError as exc:
                    outcome = exc
                    if cell.inline.was_evicted(task):  # the actor stopped, not the caller
                        task.uncancel()
                        outcome = cell.interrupted(endpoint, by_caller=False)
                        raise outcome from None
                    raise
                except Exception as exc:  # noqa: BLE001 - any handler error goes back to the caller
                    log_heard_failure(self.log, cell.label, endpoint, exc, Origin.HANDLER)
                    cell.check_fatal(exc)
                    error = outcome = handler_error(exc, label, endpoint)  # keeps exc as its (unprinted) context
                else:
                    failed = False
                    return result.value if type(result) is Shared else result  # a caller here gets the value
        finally:
            inherited_deadline.reset(deadline_token)
            current_call.reset(token)
            cell.inline.leave(task)
            cell.leave(key)
            ended = perf_counter_ns()
            (cell.metrics.get(endpoint) or cell.stats(endpoint)).record(ended - started, failed)
            if self.trace is not None:  # the caller's context is current again
                self._traced_inline(self.trace, cell.label, endpoint, started, ended, failed)
            if otel is not None and span is not None:
                otel.ended(span, outcome)
            cell.wake()
        await _raise_after_a_turn(error)  # out of the actor now; the handler may have raised before it awaited

    async def _call_queued(
        self,
        actor_id: int,
        endpoint: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        chain: tuple[int, ...],
        label: str,
        deadline: float | None,
        key: int,
    ) -> Any:
        """Call an actor of this node through its mailbox, bounded like a remote call."""
        target = (self.rank, actor_id)
        if not self.flow.try_take(target):
            await self.wait_room("call", target, deadline, endpoint, label)
        try:
            cell = self.cells.get(actor_id)
            if cell is None or cell.stopping:
                raise ActorStoppedError(f"cannot call {endpoint!r}: {label} is stopped")
            future: asyncio.Future[Any] = self.loop.create_future()
            message = Message(endpoint, args, kwargs, key, chain, deadline, LocalReply(future, label))
            message.autograd = current_context_id()  # its handler runs in another task: it takes the context along
            if cell.otel is not None:
                message.otel = cell.otel.parent(cell.otel.call_sent(future, label, endpoint, self.rank, "local"))
            trace = self.trace
            if trace is not None:
                message.flow = trace.own_flow()
                if message.flow:
                    future.add_done_callback(_local_call_span(trace, current_track(), label, endpoint, message.flow))
            cell.deliver(message)
            try:
                return await future
            except asyncio.CancelledError:
                cycle = self._cycle_at_deadline(message)
                cell.cancel(message)
                if cycle is not None:
                    raise TimeoutError(
                        f"call to {endpoint!r} of {label} ran out of time waiting in a cycle: {describe_cycle(cycle)}"
                    ) from None
                raise
        finally:
            self.flow.release(target)

    def _cycle_at_deadline(self, message: Message) -> list[str] | None:
        """If ``message``'s caller was cancelled by its deadline while it waits in a cycle of this node: the cycle.

        Only this node's mailboxes are read (a cycle through another node is
        named by ``actorch status``), and only when the deadline has passed and
        nothing else cancelled the caller too, so that the ``TimeoutError``
        that names the cycle stands for the deadline's own.
        """
        deadline = message.deadline
        task = asyncio.current_task()
        if deadline is None or not message.chain or self.loop.time() + _CLOCK_SLACK < deadline:
            return None
        if task is None or task.cancelling() > 1:
            return None
        now = perf_counter_ns()
        graph = WaitGraph.of(
            {"name": cell.name, "label": cell.label, **cell.waits(now)} for cell in list(self.cells.values())
        )
        return graph.cycle_through(message.chain[-1])


def _local_call_span(trace: NodeTrace, track: str, label: str, endpoint: str, flow: int) -> Any:
    """What closes the caller's span of a same-node call through the mailbox, when its future is done."""
    started = perf_counter_ns()

    def ended(future: asyncio.Future[Any]) -> None:
        outcome = "cancelled" if future.cancelled() else "error" if future.exception() is not None else "ok"
        called = {"to": label, "path": "local", "outcome": outcome}
        trace.span(CALL_SPAN, track, f"call {endpoint}", started, perf_counter_ns(), flow, called)

    return ended


_CLOCK_SLACK = 0.001  # a timer may fire this much before its time (the loop's clock resolution, and then some)


async def _raise_after_a_turn(error: Exception) -> NoReturn:
    """Raise ``error`` once the loop has run: a retry loop around a call that fails at once cannot starve the node."""
    await asyncio.sleep(0)
    context = error.__context__
    try:
        raise error
    finally:
        error.__context__ = context  # not the exception a caller may be handling: a same-node handler's own


def _fail(call: RemoteCall[Any], exc: BaseException) -> None:
    """Settle a call that failed before it was sent, unless its caller gave it up meanwhile."""
    if not call.done():
        call.set_exception(exc)
