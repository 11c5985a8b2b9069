"""The node: one per process, owning the loop's actors and carrying calls between nodes.

Messages go out through the transport in the format of ``_wire``; a call to an
actor of this node skips all of that: the handler runs in the caller's task
when the mailbox allows, else waits in the queue. ``_flow`` bounds how many
messages this node may have waiting at one actor; messages between nodes are
bounded in size by ``max_message_size``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from actorch._codec import Codec
from actorch._deadline import inherited_deadline
from actorch._envelope import CallContext, Envelope, current_call
from actorch._errors import (
    ActorStoppedError,
    EndpointError,
    MailboxFullError,
    MessageTooLargeError,
    NodeLostError,
    SerializationError,
    SystemClosedError,
)
from actorch._flow import DEFAULT_WINDOW, FlowControl, Target
from actorch._mailbox import Cell, Endpoint
from actorch._transport import Batch, NodeInfo, Port, Transport
from actorch._wire import (
    CALL,
    CANCEL,
    CREDIT,
    GONE,
    REPLY,
    RUNTIME,
    TELL,
    error_payload,
    handler_error,
    is_refusal,
    log_tell_failure,
    rebuild_error,
    settle,
)

__all__ = ["DEFAULT_MAX_MESSAGE", "SYSTEM_IDS", "Node"]

_KEY_BITS = 48
CANCEL_WAIT = 1.0
"""Seconds to wait for cancelled handlers to end before going on without them."""
BATCH_REPLY_HOLD = 0.1
"""Seconds past a batch's ``max_wait`` that a received message batch waits for a batched call's reply."""

SYSTEM_IDS = 2
"""Actor ids 1 and 2 belong to the system's own actors (each node's service, rank 0's registry).

Their messages are control and some wait long (lookups, ``wait_stopped``), so
``mailbox_size`` does not bound them: a full window must never block a stop.
"""
DEFAULT_MAX_MESSAGE = 1 << 30
"""Bytes a message between nodes may take (msgpack body and tensors), unless the system says otherwise."""

log = structlog.get_logger("actorch")

FailureListener = Callable[[Cell, BaseException, list[asyncio.Task[Any]]], None]


def message_size(body: bytes | None, tensors: list[Any] | None) -> int:
    """Bytes a message carries: its encoded body and the data of its tensors."""
    size = len(body) if body is not None else 0
    if tensors:
        size += sum(getattr(tensor, "nbytes", 0) for tensor in tensors)
    return size


class Node:
    """Hosts this process's actors and carries their calls to and from other nodes."""

    def __init__(
        self,
        transport: Transport,
        codec: Codec,
        loop: asyncio.AbstractEventLoop,
        *,
        mailbox_size: int = DEFAULT_WINDOW,
        max_message_size: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        if isinstance(max_message_size, bool) or not isinstance(max_message_size, int) or max_message_size < 1:
            raise ValueError(f"max_message_size must be a positive number of bytes, not {max_message_size!r}")
        self.rank = transport.rank
        self.world_size = transport.world_size
        self.transport = transport
        self.codec = codec
        self.loop = loop
        self.lost: dict[int, str] = {}
        self.closed = False
        self.departing = False  # set once shutdown starts: peers leaving is expected
        self._cells: dict[int, Cell] = {}
        self._actor_ids = itertools.count(SYSTEM_IDS + 1)
        self._call_ids = itertools.count(1)
        self._key_base = self.rank << _KEY_BITS
        self._pending: dict[int, tuple[asyncio.Future[Any], int, str, str, int]] = {}
        self._inbound: dict[tuple[int, int], tuple[Cell, Envelope]] = {}
        self._lost_listeners: list[Callable[[int, str], None]] = []
        self._failure_listener: FailureListener | None = None
        self._pack = codec.encode_plain
        self._cpu_only = transport.cpu_tensors_only
        self.flow = FlowControl(loop, mailbox_size, self._send_credits, exempt=SYSTEM_IDS)
        self.max_message_size = max_message_size
        self._refused_from: set[int] = set()
        self.counts = {
            "calls_sent": 0,
            "tells_sent": 0,
            "calls_received": 0,
            "tells_received": 0,
            "messages_refused": 0,
        }
        self.log = log.bind(node=self.rank)
        transport.attach(loop, self._receive, self._on_peer_lost)

    def __repr__(self) -> str:
        return f"<Node rank={self.rank}/{self.world_size} actors={len(self._cells)}>"

    # ------------------------------------------------------------------ actors

    def add_actor(
        self,
        instance: object,
        endpoints: Mapping[str, Endpoint],
        *,
        name: str | None,
        max_concurrency: int,
        actor_id: int | None = None,
    ) -> Cell:
        """Host ``instance`` and return its cell; its id is ``actor_id`` (a system actor's) or the next free one."""
        if self.closed:
            raise SystemClosedError(f"node {self.rank} is shut down")
        if actor_id is None:
            actor_id = next(self._actor_ids)
        elif not 0 < actor_id <= SYSTEM_IDS or actor_id in self._cells:
            raise ValueError(f"actor id {actor_id} is not a free system id")
        cell = Cell(self, actor_id, instance, endpoints, name=name, max_concurrency=max_concurrency)
        self._cells[cell.actor_id] = cell
        return cell

    def cell(self, actor_id: int) -> Cell | None:
        """The cell of a local actor, or None if it is not (or no longer) here."""
        return self._cells.get(actor_id)

    def cells(self) -> list[Cell]:
        """Every actor hosted here."""
        return list(self._cells.values())

    async def drain(self, cell: Cell, grace: float) -> None:
        """Refuse new messages, let queued and running ones finish, cancel them after ``grace``.

        An actor that stops itself from a handler keeps that handler running.
        """
        cell.stopping = True
        context = current_call.get()
        own = 1 if context is not None and cell.is_reentrant(context.child_chain()) else 0
        current = asyncio.current_task()
        if not cell.paused and (cell.running > own or cell.queue):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await cell.wait_idle(own)
        cell.fail_queued(lambda endpoint: ActorStoppedError(f"{cell.label} stopped before handling {endpoint!r}"))
        tasks = cell.cancel_running(keep=current)
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_WAIT)

    def resume(self, cell: Cell) -> None:
        """The actor's new instance is in place: start the messages that waited for it."""
        cell.paused = False
        cell.failure = None
        cell.stopped_hook = False
        cell.wake()

    def on_actor_failed(self, listener: FailureListener) -> None:
        """Call ``listener(cell, error, cancelled)`` when a handler raises an error its class declares fatal."""
        self._failure_listener = listener

    def actor_failed(self, cell: Cell, error: BaseException, cancelled: list[asyncio.Task[Any]]) -> None:
        """A handler of ``cell`` raised a fatal ``error``; ``cancelled`` are the handlers it interrupted."""
        if self._failure_listener is not None:
            self._failure_listener(cell, error, cancelled)

    def remove_actor(self, cell: Cell) -> None:
        """Stop hosting ``cell``: later calls to it fail with ``ActorStoppedError``."""
        cell.stopping = True
        self._cells.pop(cell.actor_id, None)

    # ------------------------------------------------------------------ calls out

    def new_key(self) -> int:
        """A key for a message, unique in the whole system."""
        return self._key_base | next(self._call_ids)

    async def call(
        self,
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
            self._check_size(body, tensors, f"call to {endpoint!r} of {label}")
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

    def _check_reachable(self, rank: int, endpoint: str, label: str) -> None:
        if rank in self.lost:
            raise NodeLostError(f"cannot call {endpoint!r} of {label}: node {rank} was lost ({self.lost[rank]})")
        if self.closed:
            raise SystemClosedError(f"cannot call {endpoint!r} of {label}: node {self.rank} is shut down")

    def _check_size(self, body: bytes | None, tensors: list[Any] | None, what: str) -> None:
        size = message_size(body, tensors)
        if size > self.max_message_size:
            raise MessageTooLargeError(
                f"{what} takes {size:,} bytes, over the system's max_message_size of {self.max_message_size:,}"
            )

    async def _wait_room(self, target: Target, deadline: float | None, endpoint: str, label: str) -> None:
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

    def _mailbox_full(self, endpoint: str, label: str) -> MailboxFullError:
        return MailboxFullError(
            f"cannot tell {endpoint!r} to {label}: {self.flow.window} messages from node {self.rank} are already "
            "waiting there (mailbox_size); a call would wait for room, a tell cannot"
        )

    def tell(
        self, rank: int, actor_id: int, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], label: str
    ) -> None:
        """Send ``endpoint`` a message without waiting; tensors are copied at once."""
        if args or kwargs:
            body, tensors = self.codec.encode(
                [args, kwargs], copy_tensors=True, cpu_only=self._cpu_only and rank != self.rank
            )
            if rank != self.rank:
                self._check_size(body, tensors, f"tell of {endpoint!r} to {label}")
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

    def _tell_done(self, src: int, actor_id: int, label: str, envelope: Envelope) -> Callable[[bool, Any], None]:
        """A tell's responder: return its mailbox slot (a credit to ``src``, or ours), log a failure."""

        def respond(ok: bool, value: Any) -> None:
            if src < 0:
                self.flow.release((self.rank, actor_id))
            elif src not in self.lost and not self.closed:
                self.flow.owe(src, actor_id)
            if not ok and not is_refusal(*value):
                log_tell_failure(self.log, label, envelope, *value)

        return respond

    def _send_credits(self, src: int, flat: list[int]) -> None:
        if src not in self.lost and not self.closed:
            self.transport.send(src, self._pack([CREDIT, flat]))

    async def _call_local(
        self,
        actor_id: int,
        endpoint: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        chain: tuple[int, ...],
        label: str,
        deadline: float | None,
    ) -> Any:
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

    # ------------------------------------------------------------------ calls in

    def _deliver(self, cell: Cell, envelope: Envelope) -> None:
        if cell.stopping:
            cell.fail(envelope, ActorStoppedError(f"{cell.label} is stopping; {envelope.endpoint!r} refused"))
        else:
            cell.submit(envelope)

    def _receive(self, src: int, batch: Batch, port: Port | None) -> None:
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

    def _refuse_batch(self, src: int, count: int) -> None:
        """Drop messages from a node that is lost (stale), unknown or ourselves; log once per node."""
        self.counts["messages_refused"] += count
        if src not in self._refused_from:
            self._refused_from.add(src)
            why = self.lost.get(src) if src in self.lost else "not a node of this system"
            self.log.warning("messages refused from a lost or unknown node", src=src, count=count, why=why)

    def _on_call(self, src: int, message: list[Any], tensors: list[Any], port: Port | None) -> None:
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
                self.log.warning("call refused: actor stopped", src=src, actor=label, endpoint=endpoint)
            envelope.respond(False, (gone, RUNTIME))
            return
        if body is not None:
            size = message_size(body, tensors)
            try:
                if size > self.max_message_size:
                    raise MessageTooLargeError(
                        f"{endpoint!r} of {cell.label} refused a message of {size:,} bytes from node {src}: over "
                        f"max_message_size ({self.max_message_size:,})"
                    )
                envelope.args, envelope.kwargs = self.codec.decode(body, tensors, self)
            except MessageTooLargeError as exc:
                cell.fail(envelope, exc)
                return
            except SerializationError as exc:
                cell.fail(envelope, SerializationError(f"arguments for {endpoint!r} of {cell.label}: {exc}"))
                return
        if is_call:
            self._inbound[(src, call_id)] = (cell, envelope)
            spec = cell.batched.get(endpoint) if cell.batched else None
            if spec is not None and port is not None:
                port.hold(spec.max_wait + BATCH_REPLY_HOLD)  # the batch's reply rides back on this batch's response
        self._deliver(cell, envelope)

    def _responder(self, src: int, call_id: int, port: Port | None) -> Callable[[bool, Any], None]:
        def respond(ok: bool, value: Any) -> None:
            self._inbound.pop((src, call_id), None)
            if src in self.lost or self.closed:
                if port is not None:
                    port.release()
                return
            tensors = None
            if ok:
                try:
                    body, tensors = (
                        self.codec.encode(value, cpu_only=self._cpu_only) if value is not None else (None, None)
                    )
                    self._check_size(body, tensors, f"the result of call {call_id} from node {src}")
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

    def _on_reply(self, message: list[Any], tensors: list[Any]) -> None:
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

    def _on_cancel(self, src: int, call_id: int) -> None:
        entry = self._inbound.pop((src, call_id), None)
        if entry is None:
            return
        cell, envelope = entry
        cell.cancel(envelope)

    # ------------------------------------------------------------------ peers

    def peers(self) -> list[NodeInfo]:
        """Every rank of the world, by rank."""
        return self.transport.peers()

    def on_peer_lost(self, listener: Callable[[int, str], None]) -> None:
        """Call ``listener(rank, why)`` when a peer node is lost."""
        self._lost_listeners.append(listener)

    def _on_peer_lost(self, rank: int, why: str) -> None:
        if rank in self.lost:
            return
        self.lost[rank] = why
        if self.closed or self.departing:
            self.log.debug("node left", peer=rank, why=why)
        else:
            self.log.warning("node lost", peer=rank, why=why)
        self.flow.fail_rank(
            rank, lambda: NodeLostError(f"node {rank} was lost while waiting for room in its mailbox: {why}")
        )
        for call_id, (future, dest, label, endpoint, _) in list(self._pending.items()):
            if dest == rank:
                del self._pending[call_id]
                if not future.done():
                    future.set_exception(
                        NodeLostError(f"node {rank} was lost while calling {endpoint!r} of {label}: {why}")
                    )
        for src, call_id in [key for key in self._inbound if key[0] == rank]:
            self._on_cancel(src, call_id)  # their caller is gone: nobody waits for these handlers
        for listener in list(self._lost_listeners):
            listener(rank, why)

    async def close(self) -> None:
        """Fail every pending call, cancel running handlers and leave the transport."""
        if self.closed:
            return
        self.closed = True
        self.flow.close(lambda: SystemClosedError(f"node {self.rank} shut down while waiting for room in a mailbox"))
        for future, _, label, endpoint, _ in self._pending.values():
            if not future.done():
                future.set_exception(
                    SystemClosedError(f"node {self.rank} shut down while calling {endpoint!r} of {label}")
                )
        self._pending.clear()
        tasks = [task for cell in self._cells.values() for task in cell.tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await self.transport.close()

    def statistics(self) -> dict[str, int]:
        """Calls and tells sent and received, messages refused, calls pending or waiting for room, actors."""
        return {
            **self.counts,
            "pending_calls": len(self._pending),
            "waiting_for_room": self.flow.waiting(),
            "actors": len(self._cells),
        }
