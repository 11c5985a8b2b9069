"""The transport interface, its per-destination batching, and the in-process transport.

A transport moves opaque messages (bytes plus the tensors they reference) between
ranks. Messages sent to one destination during one loop iteration leave as one
batch, in order; the receiver gets them in that order. Nothing above this layer
knows which transport runs, and only ``_rpc_transport`` touches torch RPC.
"""

from __future__ import annotations

import asyncio
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Batch", "InProcessHub", "InProcessTransport", "PeerInfo", "Transport"]

Batch = tuple[list[bytes], dict[int, list[torch.Tensor]]]
"""Messages in send order, and the tensors of those that have any, by index."""

ReceiveFn = Callable[[int, Batch], None]
LostFn = Callable[[int, str], None]


@dataclass(frozen=True)
class PeerInfo:
    """What a node knows of a rank: its number, its worker name, its host and pid."""

    rank: int
    name: str
    host: str
    pid: int


class Transport(ABC):
    """Moves message batches between ranks; implementations differ in how.

    Subclasses implement :meth:`_send_batch`; everything runs on the node's loop
    except where a method says otherwise.
    """

    rank: int
    world_size: int

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._receive: ReceiveFn | None = None
        self._lost: LostFn | None = None
        self._outgoing: dict[int, Batch] = {}
        self._flush_scheduled = False
        self.batches_sent = 0
        self.messages_sent = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank={self.rank}/{self.world_size}>"

    def attach(self, loop: asyncio.AbstractEventLoop, receive: ReceiveFn, lost: LostFn) -> None:
        """Route incoming batches to ``receive(src, batch)`` and peer loss to ``lost(rank, why)``."""
        self._loop = loop
        self._receive = receive
        self._lost = lost

    @abstractmethod
    async def start(self) -> None:
        """Join the world; return when every peer can be reached."""

    @abstractmethod
    async def close(self) -> None:
        """Leave the world at once; pending sends may be dropped."""

    @abstractmethod
    def peers(self) -> list[PeerInfo]:
        """Every rank of the world, this one included, by rank."""

    @abstractmethod
    def _send_batch(self, dest: int, batch: Batch) -> None:
        """Send one batch to ``dest`` (never blocks); report failure through ``lost``."""

    def send(self, dest: int, message: bytes, tensors: list[torch.Tensor] | None = None) -> None:
        """Queue ``message`` for ``dest``; it leaves with the others of this loop iteration."""
        batch = self._outgoing.get(dest)
        if batch is None:
            batch = self._outgoing[dest] = ([], {})
        if tensors:
            batch[1][len(batch[0])] = tensors
        batch[0].append(message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None, "transport used before attach()"
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outgoing, self._outgoing = self._outgoing, {}
        for dest, batch in outgoing.items():
            self.batches_sent += 1
            self.messages_sent += len(batch[0])
            self._send_batch(dest, batch)

    def _report_lost(self, rank: int, why: str) -> None:
        if self._lost is not None:
            self._lost(rank, why)


class InProcessHub:
    """Connects in-process transports that share one event loop (tests, ``world_size=1``)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.transports: dict[int, InProcessTransport] = {}

    def __repr__(self) -> str:
        return f"<InProcessHub ranks={sorted(self.transports)}>"

    def transport(self, rank: int) -> InProcessTransport:
        """Create the transport of ``rank`` on this hub."""
        transport = InProcessTransport(self, rank)
        self.transports[rank] = transport
        return transport

    def disconnect(self, rank: int, why: str = "disconnected") -> None:
        """Cut ``rank`` off, as if its process died: every other rank sees it lost."""
        self.transports.pop(rank, None)
        for other in list(self.transports.values()):
            other._report_lost(rank, why)


class InProcessTransport(Transport):
    """Delivers batches on the same loop, after the current iteration, in order."""

    def __init__(self, hub: InProcessHub, rank: int) -> None:
        super().__init__(rank, hub.world_size)
        self._hub = hub

    async def start(self) -> None:
        """Nothing to join: the hub is the world."""

    async def close(self) -> None:
        """Leave the hub; the others see this rank lost only if they still run."""
        if self._hub.transports.get(self.rank) is self:
            del self._hub.transports[self.rank]

    def peers(self) -> list[PeerInfo]:
        """Every rank of the hub, all in this process."""
        return [
            PeerInfo(rank, f"node{rank}", socket.gethostname(), os.getpid())
            for rank in range(self.world_size)
        ]

    def _send_batch(self, dest: int, batch: Batch) -> None:
        target = self._hub.transports.get(dest)
        if target is None or target._receive is None:
            self._report_lost(dest, f"rank {dest} is not connected")
            return
        assert target._loop is not None
        target._loop.call_soon(target._receive, self.rank, batch)
