"""Calls out of a node: ``call`` and ``tell`` to actors of this node or of others.

These functions are methods of :class:`~actorch._engine.node.Node` (it binds them in its
class body), kept here so that each half of the node reads on its own.

A call to an actor of this node skips the wire: its handler runs in the
caller's task when the mailbox allows, else waits in the queue. Everything
else is encoded in the format of ``_wire`` and sent through the transport,
bounded by the flow control (``mailbox_size``) and by ``max_message_size``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actorch._base.deadline import inherited_deadline
from actorch._base.errors import (
    ActorStoppedError,
    EndpointError,
    MailboxFullError,
    MessageTooLargeError,
    NodeLostError,
    SystemClosedError,
)
from actorch._engine.flow import Target
from actorch._engine.message import CallContext, Envelope, current_call
from actorch._engine.wire import (
    CALL,
    CANCEL,
    CREDIT,
    TELL,
    handler_error,
    is_refusal,
    log_tell_failure,
    message_size,
    settle,
)

if TYPE_CHECKING:
    from actorch._engine.node import Node

__all__ = [
    "call",
    "call_local",
    "check_reachable",
    "check_size",
    "mailbox_full",
    "send_credits",
    "tell",
    "tell_done",
    "wait_room",
]


async def call(
    self: Node,
    rank: int,
    actor_id: int,
    endpoint: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    label: str,
    deadline: float | None,
) -> Any:
    """Call ``endpoint`` of actor ``actor_id`` on ``rank`` and return its result.

    ``deadline`` is the caller's, read where the call was made: this
    coroutine may run in another task (``asyncio.gather``).
    """
    context = current_call.get()
    chain = context.child_chain() if context is not None else ()
    if rank == self.rank:
        return await self._call_local(actor_id, endpoint, args, kwargs, chain, label, deadline)
    self._check_reachable(rank, endpoint, label)
    if args or kwargs:
        body, tensors = self.codec.encode([args, kwargs], cpu_only=self._cpu_only)
        self._check_size(body, tensors, "call to {!r} of {}", endpoint, label)
    else:
        body, tensors = None, None
    target = (rank, actor_id)
    if not self.flow.try_take(target):
        await self._wait_room(target, deadline, endpoint, label)
        self._check_reachable(rank, endpoint, label)
    remaining = None
    if deadline is not None:
        remaining = deadline - self.loop.time()
        if remaining <= 0:
            self.flow.release(target)
            raise TimeoutError(f"deadline passed before calling {endpoint!r} of {label}")
    call_id = next(self._call_ids)
    future = self.loop.create_future()
    self._pending[call_id] = (future, rank, label, endpoint, actor_id)
    self.transport.send(rank, self._pack([CALL, call_id, actor_id, endpoint, remaining, chain, body]), tensors)
    self.counts["calls_sent"] += 1
    try:
        return await future
    except asyncio.CancelledError:
        if self._pending.pop(call_id, None) is not None and rank not in self.lost:
            self.flow.release(target)
            self.transport.send(rank, self._pack([CANCEL, call_id]))
        raise


def check_reachable(self: Node, rank: int, endpoint: str, label: str) -> None:
    """Raise if ``rank`` was lost or this node is shut down."""
    if rank in self.lost:
        raise NodeLostError(f"cannot call {endpoint!r} of {label}: node {rank} was lost ({self.lost[rank]})")
    if self.closed:
        raise SystemClosedError(f"cannot call {endpoint!r} of {label}: node {self.rank} is shut down")


def check_size(self: Node, body: bytes | None, tensors: list[Any] | None, what: str, *parts: object) -> None:
    """Raise ``MessageTooLargeError`` if the message is over ``max_message_size``.

    ``what.format(*parts)`` names the message; it is only formatted for the error.
    """
    size = message_size(body, tensors)
    if size > self.max_message_size:
        raise MessageTooLargeError(
            f"{what.format(*parts)} takes {size:,} bytes, over the system's max_message_size of "
            f"{self.max_message_size:,}"
        )


async def wait_room(self: Node, target: Target, deadline: float | None, endpoint: str, label: str) -> None:
    """Wait for room in ``target``'s mailbox (backpressure), until the caller's deadline."""
    if deadline is None:
        await self.flow.take(target)
        return
    try:
        async with asyncio.timeout_at(deadline):
            await self.flow.take(target)
    except TimeoutError:
        raise TimeoutError(
            f"deadline passed while waiting for room in the mailbox of {label} to call {endpoint!r} "
            f"({self.flow.window} messages from node {self.rank} are waiting there)"
        ) from None


def mailbox_full(self: Node, endpoint: str, label: str) -> MailboxFullError:
    """The error a tell raises when ``mailbox_size`` messages from this node wait at the actor."""
    return MailboxFullError(
        f"cannot tell {endpoint!r} to {label}: {self.flow.window} messages from node {self.rank} are already "
        "waiting there (mailbox_size); a call would wait for room, a tell cannot"
    )


def tell(
    self: Node, rank: int, actor_id: int, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], label: str
) -> None:
    """Send ``endpoint`` a message without waiting; tensors are copied at once."""
    if args or kwargs:
        body, tensors = self.codec.encode(
            [args, kwargs], copy_tensors=True, cpu_only=self._cpu_only and rank != self.rank
        )
        if rank != self.rank:
            self._check_size(body, tensors, "tell of {!r} to {}", endpoint, label)
    else:
        body, tensors = None, None
    target = (rank, actor_id)
    if rank == self.rank:
        cell = self._cells.get(actor_id)
        if cell is None or cell.stopping:
            self.log.warning("tell dropped: actor stopped", actor=label, endpoint=endpoint)
            return
        if not self.flow.try_take(target):
            raise self._mailbox_full(endpoint, label)
        if body is not None:
            args, kwargs = self.codec.decode(body, tensors or [], self)
        envelope = Envelope(endpoint, args, kwargs, self.new_key(), (), None, None)
        envelope.respond = self._tell_done(-1, actor_id, label, envelope)
        self.counts["tells_sent"] += 1
        self._deliver(cell, envelope)
        return
    if rank in self.lost or self.closed:
        self.log.warning("tell dropped: node lost", actor=label, endpoint=endpoint, why=self.lost.get(rank))
        return
    if not self.flow.try_take(target):
        raise self._mailbox_full(endpoint, label)
    self.counts["tells_sent"] += 1
    self.transport.send(rank, self._pack([TELL, 0, actor_id, endpoint, None, (), body]), tensors)


def tell_done(self: Node, src: int, actor_id: int, label: str, envelope: Envelope) -> Callable[[bool, Any], None]:
    """A tell's responder: return its mailbox slot (a credit to ``src``, or ours), log a failure."""

    def respond(ok: bool, value: Any) -> None:
        if src < 0:
            self.flow.release((self.rank, actor_id))
        elif src not in self.lost and not self.closed:
            self.flow.owe(src, actor_id)
        if not ok and not is_refusal(*value):
            log_tell_failure(self.log, label, envelope, *value)

    return respond


def send_credits(self: Node, src: int, flat: list[int]) -> None:
    """Send ``src`` the credits of the tells of its that this node is done with."""
    if src not in self.lost and not self.closed:
        self.transport.send(src, self._pack([CREDIT, flat]))


async def call_local(
    self: Node,
    actor_id: int,
    endpoint: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    chain: tuple[int, ...],
    label: str,
    deadline: float | None,
) -> Any:
    """Call an actor of this node: in the caller's task when the mailbox allows, else through the queue."""
    cell = self._cells.get(actor_id)
    if cell is None or cell.stopping:
        raise ActorStoppedError(f"cannot call {endpoint!r}: {label} is stopped")
    key = self.new_key()
    if endpoint in cell.batched or not cell.can_start(chain):
        target = (self.rank, actor_id)
        if not self.flow.try_take(target):
            await self._wait_room(target, deadline, endpoint, label)
        try:
            cell = self._cells.get(actor_id)
            if cell is None or cell.stopping:
                raise ActorStoppedError(f"cannot call {endpoint!r}: {label} is stopped")
            future: asyncio.Future[Any] = self.loop.create_future()
            envelope = Envelope(endpoint, args, kwargs, key, chain, deadline, settle(future))
            cell.submit(envelope)
            try:
                return await future
            except asyncio.CancelledError:
                cell.cancel(envelope)
                raise
        finally:
            self.flow.release(target)
    task = asyncio.current_task()
    assert task is not None
    cell.enter_inline(task, key)
    token = current_call.set(CallContext(cell, key, chain, endpoint))
    deadline_token = inherited_deadline.set(deadline)  # for a caller that is another task
    try:
        try:
            coroutine = cell.open(endpoint, args, kwargs)
        except EndpointError as exc:
            self.log.warning("message refused", actor=cell.label, endpoint=endpoint, error=f"EndpointError: {exc}")
            raise
        try:
            return await coroutine
        except asyncio.CancelledError:
            if task in cell.evicted and cell.inline[task] == 1:  # the actor stopped, not the caller
                task.uncancel()
                raise cell.interrupted(endpoint, by_caller=False) from None
            raise
        except Exception as exc:
            cell.check_fatal(exc)
            raise handler_error(exc) from exc
    finally:
        inherited_deadline.reset(deadline_token)
        current_call.reset(token)
        cell.leave_inline(task, key)
        cell.wake()
