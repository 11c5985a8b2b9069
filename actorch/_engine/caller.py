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
from actorch._engine.calls import ObservedCall, RemoteCall
from actorch._engine.flow import Target
from actorch._engine.message import CallContext, Message, Origin, current_call
from actorch._engine.replies import LocalReply, log_heard_failure
from actorch._engine.side import NodeSide, SideParts
from actorch._engine.waits import WaitGraph, describe_cycle
from actorch._engine.wire import CALL, CANCEL, TELL, encode_message, handler_error, rebuild_error
from actorch._transport.autograd import NO_CONTEXT, current_context_id

if TYPE_CHECKING:
    from actorch._engine.instruments import Outgoing
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
        call = self.new_call(target, endpoint, label)
        if context is not None:
            call.device = context.device
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
                self._launch(call, body, tensors, chain, deadline)
            else:
                call.waiting = self.loop.create_task(self._launch_when_room(call, body, tensors, chain, deadline))
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

    def new_call(self, target: Target, endpoint: str, label: str) -> RemoteCall[Any]:
        """A call to ``target`` not sent yet: observed if instruments observe what this node sends."""
        if not self.instruments.outgoing:
            return RemoteCall(self.loop, target, endpoint, label, self._abandon_call)
        return ObservedCall(self.loop, target, endpoint, label, self._abandon_call, self.instruments)

    def _launch(
        self, call: RemoteCall[Any], body: Any, tensors: Any, chain: tuple[int, ...], deadline: float | None
    ) -> None:
        """Send ``call``, which holds a slot of its target's window, unless its deadline has passed."""
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
        if type(call) is ObservedCall:  # its own record: see new_call
            wire = self.instruments.packed(call, envelope, self.pack, call_id, body, tensors)
        else:
            wire = self.pack(envelope)
        self._send(rank, wire, tensors)
        self.calls_sent += 1

    async def _launch_when_room(
        self,
        call: RemoteCall[Any],
        body: Any,
        tensors: Any,
        chain: tuple[int, ...],
        deadline: float | None,
    ) -> None:
        """Wait for room in the call's mailbox (within its deadline), then send it."""
        try:
            await self.wait_backlog("call", call.target[0], deadline, call.endpoint, call.label)
            await self.wait_room("call", call.target, deadline, call.endpoint, call.label)
            self.check_reachable("call", call.target[0], call.endpoint, call.label)
            self._launch(call, body, tensors, chain, deadline)
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
        if self.instruments.outgoing:
            message.carried = self.instruments.made_here("tell", actor_id, label, endpoint)
        self.tells_sent += 1
        cell.deliver(message)

    def _abandon(self, call: RemoteCall[Any]) -> None:
        """``call`` was cancelled: it leaves the mailbox line, or the callee is told to cancel it."""
        if call.waiting is not None:
            call.waiting.cancel()
            return
        if self.pending.pop(call.call_id, None) is not None and call.target[0] not in self.lost:
            self.flow.release(call.target)
            self.transport.send(call.target[0], self.pack([CANCEL, call.call_id]))

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
        if self.instruments.outgoing:
            out = self.instruments.made("tell", rank, actor_id, label, endpoint)
            self._send(rank, self.instruments.packed(out, envelope, self.pack, 0, body, tensors), tensors)
        else:
            self._send(rank, self.pack(envelope), tensors)

    def on_reply(self, message: list[Any], tensors: list[Any]) -> None:
        """A reply to one of our calls: settle the caller's future (and give back its mailbox slot)."""
        _, call_id, ok, payload = message
        pending = self.pending.pop(call_id, None)
        if pending is None:
            if ok:
                self.codec.drop(payload)  # the caller gave up (cancelled or timed out): the result is dropped
            return
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
        instruments = self.instruments
        out: Outgoing | None = None
        outcome: BaseException | None = None  # how the call ended, for its instruments: None if it returned
        task = asyncio.current_task()
        assert task is not None
        context = CallContext(cell.label, key, chain, endpoint, cell.device, cell.node)
        context.task = task
        if instruments.outgoing:
            out = instruments.made("call", self.rank, actor_id, label, endpoint)
            instruments.left(out)
            context.carried = out.carrier
        cell.enter(key, context)
        cell.inline.enter(task)
        token = current_call.set(context)
        deadline_token = inherited_deadline.set(deadline)  # for a caller that is another task
        context.started = perf_counter_ns()
        failed = True
        error: Exception
        try:
            try:
                coroutine = cell.open(endpoint, args, kwargs, carried=context.carried)
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
            if instruments.handled is not None:  # the caller's context is current again
                instruments.handled(cell, context, perf_counter_ns(), failed, 1)
            if out is not None:
                instruments.settle(out, outcome)
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
            if self.instruments.outgoing:
                message.carried = self.instruments.made_here("call", actor_id, label, endpoint, future)
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
