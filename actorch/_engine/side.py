"""What the sides of a node share: the node's transport, codec, windows, actors and peers, and their checks.

The node builds one :class:`SideParts` and hands it to its ``Caller``, its
``Callee`` and its ``Streams``; each keeps the parts in slots of its own, for
the message path. What a call and a stream both do (check that a node can be
reached, wait for room in a mailbox, take a received message's arguments) is
written here once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NamedTuple

from actorch._base.codec import Codec
from actorch._base.errors import (
    ActorchError,
    ActorStoppedError,
    MessageTooLargeError,
    NodeLostError,
    SerializationError,
    SystemClosedError,
)
from actorch._engine.cell import Cell
from actorch._engine.flow import BACKLOG_POLL, FlowControl, Target
from actorch._engine.instruments import Instruments
from actorch._engine.message import Message
from actorch._engine.wire import message_size
from actorch._transport.base import Transport

if TYPE_CHECKING:
    import torch

__all__ = ["NodeSide", "SideParts"]


class SideParts(NamedTuple):
    """The node's parts a side works with."""

    transport: Transport
    codec: Codec
    flow: FlowControl
    cells: Mapping[int, Cell]  # the node's actors, by id (the node adds and removes them)
    lost: Mapping[int, str]  # the node's lost peers, with why (the node records them)
    left: AbstractSet[int]  # the peers that said they leave the system (their loss is expected)
    loop: asyncio.AbstractEventLoop
    log: Any
    new_key: Callable[[], int]
    max_message_size: int
    send_budget: int
    instruments: Instruments  # what observes the node's messages


class NodeSide:
    """Base of the caller, the callee and the streams: the node's parts, whether it has closed, shared checks."""

    __slots__ = (
        "cells",
        "closed",
        "codec",
        "decode_context",
        "flow",
        "instruments",
        "left",
        "log",
        "loop",
        "lost",
        "max_message_size",
        "new_key",
        "pack",
        "plane",
        "rank",
        "send_budget",
        "transport",
    )

    def __init__(self, parts: SideParts, decode_context: object = None) -> None:
        self.decode_context = decode_context  # what decoded refs send through: the node's caller
        self.transport = parts.transport
        self.rank = parts.transport.rank
        self.codec = parts.codec
        self.pack = parts.codec.encode_plain
        self.plane = parts.codec.plane
        self.flow = parts.flow
        self.cells = parts.cells
        self.lost = parts.lost
        self.left = parts.left
        self.loop = parts.loop
        self.log = parts.log
        self.new_key = parts.new_key
        self.max_message_size = parts.max_message_size
        self.send_budget = parts.send_budget
        self.instruments = parts.instruments
        self.closed = False

    def check_reachable(self, verb: str, rank: int, endpoint: str, label: str) -> None:
        """Raise if ``rank`` was lost or this node is shut down: nothing can ``verb`` (call, stream) there."""
        if rank in self.lost:
            raise self.unreachable(rank, f"cannot {verb} {endpoint!r} of {label}")
        if self.closed:
            raise SystemClosedError(f"cannot {verb} {endpoint!r} of {label}: node {self.rank} is shut down")

    def left_error(self, rank: int, what: str) -> ActorStoppedError | None:
        """``ActorStoppedError`` for ``what`` if node ``rank`` left the system on purpose (its actors stopped first)."""
        return ActorStoppedError(f"{what}: node {rank} left the system") if rank in self.left else None

    def unreachable(self, rank: int, what: str) -> ActorchError:
        """The error for ``what`` failing because node ``rank`` is gone: it left, or else it was lost."""
        return self.left_error(rank, what) or NodeLostError(
            f"{what}: node {rank} was lost ({self.lost.get(rank, 'unreachable')})"
        )

    async def wait_room(self, verb: str, target: Target, deadline: float | None, endpoint: str, label: str) -> None:
        """Wait for room in ``target``'s mailbox (backpressure), until the deadline, to ``verb`` ``endpoint``."""
        if deadline is None:
            await self.flow.take(target)
            return
        try:
            async with asyncio.timeout_at(deadline):
                await self.flow.take(target)
        except TimeoutError:
            raise TimeoutError(
                f"deadline passed while waiting for room in the mailbox of {label} to {verb} {endpoint!r} "
                f"({self.flow.window} messages from node {self.rank} are waiting there)"
            ) from None

    def backlog(self, rank: int) -> int:
        """Bytes sent toward ``rank`` that it has not taken yet: the transport's, and the data plane's lends."""
        return self.transport.backlog(rank) + self.plane.on_way(rank)

    async def wait_backlog(self, verb: str, rank: int, deadline: float | None, endpoint: str, label: str) -> None:
        """Wait until what this node sent toward ``rank`` is back under the send budget (within the deadline)."""
        budget = self.send_budget
        try:
            async with asyncio.timeout_at(deadline):
                # The transport's threads, the kernel and the receiver drain the backlog: no event tells when.
                while self.backlog(rank) > budget and not (rank in self.lost or self.closed):  # noqa: ASYNC110
                    await asyncio.sleep(BACKLOG_POLL)
        except TimeoutError:
            raise TimeoutError(
                f"deadline passed while waiting to {verb} {endpoint!r} of {label}: "
                f"{self.backlog(rank):,} bytes toward node {rank} have not reached it "
                f"(send_budget {budget:,}; the node may be frozen or overloaded)"
            ) from None

    def take_arguments(
        self,
        src: int,
        cell: Cell,
        received: Message,
        body: bytes,
        tensors: list[Any],
        shared: dict[torch.device | None, Any] | None = None,
    ) -> bool:
        """Set the arguments of ``received`` from ``body``; False if it was refused (too large, unreadable).

        ``shared`` keeps what one decoding gave, by actor device, for the
        other actors a ``CAST`` goes to; None for a message to one actor.
        """
        size = message_size(body, tensors)
        if size > self.max_message_size:
            refused = MessageTooLargeError(
                f"{received.endpoint!r} of {cell.label} refused a message of {size:,} bytes from node {src}: over "
                f"max_message_size ({self.max_message_size:,})"
            )
            cell.fail(received, refused)
            if shared is None:
                self.codec.drop(body)
            return False
        decoded = None if shared is None else shared.get(cell.device)
        if decoded is None:
            try:
                decoded = self.codec.decode(body, tensors, self.decode_context, cell.device)
            except SerializationError as exc:
                cell.fail(received, SerializationError(f"arguments for {received.endpoint!r} of {cell.label}: {exc}"))
                if shared is None:
                    self.codec.drop(body)
                return False
            if shared is not None:
                shared[cell.device] = decoded
        received.args, received.kwargs = decoded
        return True
