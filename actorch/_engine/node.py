"""The node: one per process, owning the loop's actors and carrying calls between nodes.

Messages go out (``_outbound``) and come in (``_inbound``) through the transport
in the format of ``_wire``; ``_flow`` bounds how many messages this node may
have waiting at one actor. The node itself keeps its actors' cells, hears of
lost peers, and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from actorch._base.codec import Codec
from actorch._base.errors import (
    ActorStoppedError,
    NodeLostError,
    SystemClosedError,
)
from actorch._engine import callee as _inbound
from actorch._engine import caller as _outbound
from actorch._engine.cell import Cell, Endpoint
from actorch._engine.flow import DEFAULT_WINDOW, FlowControl
from actorch._engine.message import Envelope, current_call
from actorch._transport.base import NodeInfo, Transport

__all__ = ["DEFAULT_MAX_MESSAGE", "SYSTEM_IDS", "Node"]

_KEY_BITS = 48
CANCEL_WAIT = 1.0
"""Seconds to wait for cancelled handlers to end before going on without them."""

SYSTEM_IDS = 2
"""Actor ids 1 and 2 belong to the system's own actors (each node's service, rank 0's registry).

Their messages are control and some wait long (lookups, ``wait_stopped``), so
``mailbox_size`` does not bound them: a full window must never block a stop.
"""
DEFAULT_MAX_MESSAGE = 1 << 30
"""Bytes a message between nodes may take (msgpack body and tensors), unless the system says otherwise."""

log = structlog.get_logger("actorch")

FailureListener = Callable[[Cell, BaseException, list[asyncio.Task[Any]]], None]


class Node:
    """Hosts this process's actors and carries their calls to and from other nodes.

    Its calls out are written in ``_outbound`` and its calls in in ``_inbound``,
    bound here as methods; this module keeps the actors, the peers and the
    node's own life.
    """

    # calls out (``_outbound``)
    call = _outbound.call
    tell = _outbound.tell
    _call_local = _outbound.call_local
    _check_reachable = _outbound.check_reachable
    _check_size = _outbound.check_size
    _wait_room = _outbound.wait_room
    _mailbox_full = _outbound.mailbox_full
    _tell_done = _outbound.tell_done
    _send_credits = _outbound.send_credits

    # calls in (``_inbound``)
    _deliver = _inbound.deliver
    _receive = _inbound.receive
    _refuse_batch = _inbound.refuse_batch
    _on_call = _inbound.on_call
    _responder = _inbound.responder
    _on_reply = _inbound.on_reply
    _on_cancel = _inbound.on_cancel

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
        self._incoming: dict[tuple[int, int], tuple[Cell, Envelope]] = {}  # calls received, not yet answered
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

    def new_key(self) -> int:
        """A key for a message, unique in the whole system."""
        return self._key_base | next(self._call_ids)

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
        for src, call_id in [key for key in self._incoming if key[0] == rank]:
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
