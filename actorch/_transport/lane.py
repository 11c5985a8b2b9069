"""The fast lane: direct TCP connections between nodes, for bundles that carry no tensors of their own.

A torch RPC round trip costs about 200 µs of CPU at each end on this kind of
machine (pickling, a pool thread, TensorPipe's threads, a hand-over to the
event loop), ten to twenty times what the same bytes cost on an asyncio TCP
connection. Most messages of an actor system are a few hundred bytes (small
tensors ride inside them, see the codec), so the torch RPC transport sends
such bundles on the lane and keeps torch RPC for what only it can carry:
tensors of their own (and CUDA tensors through device maps), torch RRefs, and
calls inside a distributed autograd context.

Each node listens on the interface its torch RPC agent uses, at a free port,
and opens one connection to every peer for what it sends there; what a peer
sends arrives on the peer's own connection. A connection begins with a hello
that names the sender's rank and proves the world's secret, which keeps
stray connections out (it does not make the lane safe from an attacker who
can read the rendezvous store: every process that reaches a node's ports must
be trusted, as with torch RPC itself). A frame is a bundle: its length, its
sequence number on the link (shared with torch RPC's bundles, so that the
receiver puts the two lanes back in order), and its messages. Everything runs
on the node's event loop; nothing here touches torch.
"""

from __future__ import annotations

import asyncio
import hmac
import socket
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["Lane", "LaneDelivery"]

_HELLO = b"actorch-lane/1"
_HEADER = struct.Struct("<IQI")  # frame length (after these 4 bytes), sequence number, message count
_LENGTH = struct.Struct("<I")
_MAX_FRAME = 1 << 31
_EXPEL = (1 << 64) - 1  # a frame's sequence number that says: the sender counts this node lost

LaneDelivery = Callable[[int, int, list[bytes]], None]
"""Called on the loop with a bundle that came on the lane: the sender's rank, its sequence number, its messages."""


class _Inbound(asyncio.Protocol):
    """A peer's connection to this node: a hello, then frames, each handed to the lane's delivery."""

    def __init__(self, lane: Lane) -> None:
        self._lane = lane
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self.src: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        _no_delay(transport)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        deliver = self._lane.deliver
        size = len(buffer)
        while size - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            end = start + 4 + length
            if end > size:
                break
            if self.src is None:
                if not self._greet(bytes(buffer[start + 4 : end])):
                    return
            else:
                _, seq, count = _HEADER.unpack_from(buffer, start)
                if seq == _EXPEL:
                    self._lane.expelled_by(self.src)
                    start = end
                    continue
                messages: list[bytes] = []
                at = start + _HEADER.size
                for _ in range(count):
                    (length,) = _LENGTH.unpack_from(buffer, at)
                    messages.append(bytes(buffer[at + 4 : at + 4 + length]))
                    at += 4 + length
                deliver(self.src, seq, messages)
            start = end
        if start:
            del buffer[:start]

    def _greet(self, hello: bytes) -> bool:
        """Read the hello: the protocol, the sender's rank, the proof of the secret; close if it is wrong."""
        lane = self._lane
        name, _, rest = hello.partition(b"\n")
        if name != _HELLO or len(rest) < 4 or not hmac.compare_digest(rest[4:], lane.secret):
            assert self._transport is not None
            self._transport.close()
            return False
        self.src = int.from_bytes(rest[:4], "little")
        lane.inbound[self.src] = self
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.src is not None and self._lane.inbound.get(self.src) is self:
            del self._lane.inbound[self.src]
            self._lane.closed_by(self.src, exc)


class _Outbound(asyncio.Protocol):
    """This node's connection to a peer, for what it sends there."""

    def __init__(self, lane: Lane, dest: int) -> None:
        self._lane = lane
        self._dest = dest

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _no_delay(transport)

    def data_received(self, data: bytes) -> None:
        """Nothing comes back on a node's own connection."""

    def connection_lost(self, exc: Exception | None) -> None:
        lane = self._lane
        if lane.outbound.pop(self._dest, None) is not None:
            lane.closed_by(self._dest, exc)


class Lane:
    """This node's end of the fast lane: its listener, and its connection to each peer.

    Args:
        loop: The node's event loop (everything runs on it).
        rank: This node's rank.
        secret: The world's secret, which every hello proves.
        deliver: Takes each bundle that arrives (see :data:`LaneDelivery`).
        lost: Called with a peer's rank and why, when a connection to or from
            it closes while neither side meant it (the peer died, most likely).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rank: int,
        secret: bytes,
        deliver: LaneDelivery,
        lost: Callable[[int, str], None],
    ) -> None:
        self.loop = loop
        self.rank = rank
        self.secret = secret
        self.deliver = deliver
        self._lost = lost
        self.outbound: dict[int, asyncio.Transport] = {}
        self.inbound: dict[int, _Inbound] = {}
        self._connecting: dict[int, asyncio.Task[None]] = {}
        self._forgotten: set[int] = set()
        self._reported: set[int] = set()  # peers reported lost (once each: both connections close)
        self._server: asyncio.Server | None = None
        self.closing = False
        self.address: str | None = None
        """``host:port`` this lane listens on, once started."""

    def __repr__(self) -> str:
        return f"<Lane rank={self.rank} at={self.address} out={sorted(self.outbound)} in={sorted(self.inbound)}>"

    async def start(self, host: str) -> str:
        """Listen on ``host`` at a free port; return ``host:port``."""
        self._server = await self.loop.create_server(lambda: _Inbound(self), host, 0, reuse_address=True)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return self.address

    def connect(self, dest: int, address: str) -> None:
        """Open the connection to peer ``dest`` at ``address`` (from any thread); sends use it once it is up."""
        self.loop.call_soon_threadsafe(self._connect, dest, address)

    def _connect(self, dest: int, address: str) -> None:
        if self.closing or dest in self._forgotten or dest in self.outbound or dest in self._connecting:
            return
        task = self.loop.create_task(self._open(dest, address), name=f"actorch-lane-{dest}")
        self._connecting[dest] = task
        task.add_done_callback(lambda _: self._connecting.pop(dest, None))

    async def _open(self, dest: int, address: str) -> None:
        host, _, port = address.rpartition(":")
        try:
            transport, _ = await self.loop.create_connection(lambda: _Outbound(self, dest), host.strip("[]"), int(port))
        except OSError:
            return  # torch RPC carries everything to this peer; its loss, if it is lost, is reported there
        if self.closing or dest in self._forgotten:
            transport.close()
            return
        hello = _HELLO + b"\n" + self.rank.to_bytes(4, "little") + self.secret
        transport.write(_LENGTH.pack(len(hello)) + hello)
        self.outbound[dest] = transport

    def send(self, dest: int, seq: int, messages: list[bytes]) -> bool:
        """Write one bundle to ``dest``; False if no connection is up (torch RPC carries it then)."""
        transport = self.outbound.get(dest)
        if transport is None:
            return False
        parts: list[bytes] = []
        length = _HEADER.size - 4
        for message in messages:
            parts.append(_LENGTH.pack(len(message)))
            parts.append(message)
            length += 4 + len(message)
        if length >= _MAX_FRAME:
            return False
        parts.insert(0, _HEADER.pack(length, seq, len(messages)))
        transport.write(b"".join(parts))
        return True

    def forget(self, rank: int) -> None:
        """Peer ``rank`` left on purpose: close both connections, and never connect to it again."""
        transport = self._cut_off(rank)
        if transport is not None:
            transport.close()
        inbound = self.inbound.pop(rank, None)
        if inbound is not None and inbound._transport is not None:
            inbound._transport.close()

    def expel(self, rank: int) -> None:
        """This node counts ``rank`` lost: tell it so, and close the connection to it for good.

        The connection from it stays open, and what comes on it is refused
        above, so that the peer (if it was only stalled) reads the news before
        it sees any connection close. It closes when the peer's process ends.
        """
        transport = self._cut_off(rank)
        if transport is not None:
            transport.write(_HEADER.pack(_HEADER.size - 4, _EXPEL, 0))
            transport.close()  # after what was written

    def _cut_off(self, rank: int) -> asyncio.Transport | None:
        """Never connect to ``rank`` again: cancel a connection under way, and hand back the open one, if any."""
        self._forgotten.add(rank)
        connecting = self._connecting.pop(rank, None)
        if connecting is not None:
            connecting.cancel()
        return self.outbound.pop(rank, None)

    def expelled_by(self, rank: int) -> None:
        """Peer ``rank`` says it counts this node lost: this node counts it lost in turn."""
        if self.closing or rank in self._reported:
            return
        self._reported.add(rank)
        self._lost(rank, f"node {rank} counts this node lost (it was silent too long)")

    def closed_by(self, rank: int, exc: Exception | None) -> None:
        """A connection to or from ``rank`` closed: unless this node or that peer meant it, the peer is lost."""
        if self.closing or rank in self._forgotten or rank in self._reported:
            return
        self._reported.add(rank)
        self._lost(rank, f"fast lane closed ({exc or 'the peer closed it'})")

    async def close(self) -> None:
        """Close every connection and the listener; what was written is sent first."""
        self.closing = True
        for task in list(self._connecting.values()):
            task.cancel()
        for transport in list(self.outbound.values()):
            transport.close()
        for inbound in list(self.inbound.values()):
            if inbound._transport is not None:
                inbound._transport.close()
        self.outbound.clear()
        self.inbound.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """Send small frames at once (no Nagle delay)."""
    sock: Any = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
