"""The fast lane's connections: this node's listener, its connection to each peer, the handshake, the frames.

A torch RPC round trip costs about 200 µs of CPU at each end on this kind of
machine (pickling, a pool thread, TensorPipe's threads, a hand-over to the
event loop), ten to twenty times what the same bytes cost on an asyncio TCP
connection. Most messages of an actor system are a few hundred bytes (small
tensors ride inside them, see the codec), so ``LaneTransport`` sends such
bundles on the lane and leaves to the transport it wraps what only that one
can carry: tensors of their own (and CUDA tensors through device maps), torch
RRefs, and calls inside a distributed autograd context.

Each node listens on the interface its main path uses, at a free port, once
it holds the world's secret, and opens one connection to every peer for
what it sends there; what a peer sends arrives on the peer's own connection.

Nothing is trusted before it proves the secret. The listener speaks first: a
challenge with its rank and a fresh nonce. The connecting node answers with its
rank, a nonce of its own and an HMAC of the listener's nonce and both ranks;
the listener answers with an HMAC of the connector's nonce and both ranks. So
the secret never travels, a claimed rank is bound to its proof, and a recorded
hello is worth nothing on another connection. Until a connection has proven
itself it may hold only a handshake's bytes, must finish within
``HELLO_TIMEOUT``, and at most ``MAX_STRANGERS`` such connections are open at
once; a refused one costs a warning line (rate-limited), never a traceback.
This keeps strangers out; it does not make the lane safe from a process that
can read the rendezvous store, where the secret is kept (docs/security.md).

After the handshake, a frame is a bundle: its length, its sequence number on
the link (shared with the main path's bundles, so that the receiver puts the
two paths back in order), and its messages. A frame that does not parse closes the
link as a protocol error, and the peer is lost with that reason. A proven
connection that closes unasked loses its peer too, once it has carried a frame:
one that closes before has lost nothing (its connector gave up the handshake
and tries again), and a peer that died is reported by the main path.

The lane's own health is judged by the kernel's view of each connection
(:meth:`Lane.stalled`): bytes written to a peer that its kernel does not
acknowledge, while its window is open, mean the link is silent, whatever the
main path's heartbeats say. Everything else runs on the node's event loop;
nothing here touches torch.

One module past 600 lines, on purpose: the handshake, the frames and the connection that reads and
writes them are one protocol, checked against each other (what the listener sends first, what a
connection accepts before the proof), and each state of a connection decides how the next bytes on
it are read; split, the order of its steps would be spread over files.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["HELLO_TIMEOUT", "MAX_STRANGERS", "Lane", "LaneDelivery"]

log = structlog.get_logger("actorch")

HELLO_TIMEOUT = 5.0
"""Seconds a new connection has to complete its handshake."""
MAX_STRANGERS = 32
"""Connections to one node that may be open, and not yet authenticated, at once; more are closed at once."""
HANDSHAKE_TRIES = 3
"""Times a node tries to open its connection to a peer whose listener does not answer in time (its loop was busy)."""
REFUSAL_LOG_INTERVAL = 10.0
"""At most one warning about refused connections per this many seconds (the rest are counted into the next)."""

_MAGIC = b"actlane2"
_CHALLENGE = struct.Struct("<8sI16s")  # magic, listener's rank, listener's nonce
_HELLO = struct.Struct("<8sI16s32s")  # magic, connector's rank, connector's nonce, its proof
_PROOF = struct.Struct("<32s")  # the listener's proof
_HEADER = struct.Struct("<IQI")  # frame length (after these 4 bytes), sequence number, message count
_LENGTH = struct.Struct("<I")
_SEQ_COUNT = struct.Struct("<QI")  # a frame's header after its length
_MAX_FRAME = 1 << 31
_EXPEL = (1 << 64) - 1  # a frame's sequence number that says: the sender counts this node lost

# struct tcp_info (linux/tcp.h): offsets of the fields that tell a silent link from a slow one.
_TCP_INFO_SIZE = 232
_UNACKED = struct.Struct("<I")  # tcpi_unacked: segments sent, not yet acknowledged (offset 24)
_BYTES_ACKED = struct.Struct("<Q")  # tcpi_bytes_acked (offset 120)
_NOTSENT = struct.Struct("<I")  # tcpi_notsent_bytes (offset 144)
_SND_WND = struct.Struct("<I")  # tcpi_snd_wnd: the window the peer last advertised (offset 228)

LaneDelivery = Callable[[int, int, list[bytes]], None]
"""Called on the loop with a bundle that came on the lane: the sender's rank, its sequence number, its messages."""


class LaneProtocolError(Exception):
    """A peer sent bytes that are not the lane's protocol."""


def _proof(secret: bytes, role: bytes, nonce: bytes, prover: int, verifier: int) -> bytes:
    """What ``prover`` sends to show ``verifier`` that it knows the secret: an HMAC of the verifier's nonce."""
    message = role + nonce + prover.to_bytes(4, "little") + verifier.to_bytes(4, "little")
    return hmac.new(secret, message, hashlib.sha256).digest()


def parse_frame(buffer: bytes | bytearray, start: int, end: int) -> tuple[int, list[bytes]]:
    """The sequence number and messages of the frame in ``buffer[start:end]`` (after its length); raises if malformed.

    On every bundle that arrives: it reads the buffer in place, and checks
    each length before it trusts it.
    """
    if end - start < _SEQ_COUNT.size:
        raise LaneProtocolError(f"a frame of {end - start} bytes is shorter than its header")
    seq, count = _SEQ_COUNT.unpack_from(buffer, start)
    at = start + _SEQ_COUNT.size
    if count > (end - at) >> 2:
        raise LaneProtocolError(f"a frame of {end - start} bytes cannot hold {count} messages")
    messages: list[bytes] = []
    for index in range(count):
        if at + 4 > end:
            raise LaneProtocolError(f"message {index} of {count} runs past the frame's {end - start} bytes")
        (length,) = _LENGTH.unpack_from(buffer, at)
        at += 4
        stop = at + length
        if stop > end:
            raise LaneProtocolError(f"message {index} of {count} runs past the frame's {end - start} bytes")
        messages.append(bytes(buffer[at:stop]))
        at = stop
    if at != end:
        raise LaneProtocolError(f"{end - at} bytes follow the last of the frame's {count} messages")
    return seq, messages


class _Inbound(asyncio.Protocol):
    """A peer's connection to this node: the challenge, the peer's hello, then frames handed to the lane."""

    def __init__(self, lane: Lane) -> None:
        self._lane = lane
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._nonce = os.urandom(16)
        self._expires: asyncio.TimerHandle | None = None
        self._peer = "?"
        self.src: int | None = None
        self.carried = False  # whether a frame came on it: only then can its close have lost one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._peer = _address(transport.get_extra_info("peername"))
        lane = self._lane
        if len(lane.strangers) >= MAX_STRANGERS or lane.closing:
            lane.refused(self._peer, f"{MAX_STRANGERS} connections are already proving themselves")
            transport.abort()
            return
        lane.strangers.add(self)
        _no_delay(transport)
        self._expires = lane.loop.call_later(HELLO_TIMEOUT, self._hello_expired)
        transport.write(_frame(_CHALLENGE.pack(_MAGIC, lane.rank, self._nonce)))

    def _hello_expired(self) -> None:
        self._refuse(f"no hello within {HELLO_TIMEOUT:g} s")

    def _refuse(self, why: str) -> None:
        """Close a connection that did not prove the secret, with one (rate-limited) warning."""
        self._lane.refused(self._peer, why)
        self._forget_stranger()
        if self._transport is not None:
            self._transport.abort()

    def _forget_stranger(self) -> None:
        self._lane.strangers.discard(self)
        if self._expires is not None:
            self._expires.cancel()
            self._expires = None

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if self.src is None:
            if not self._greet():
                return
            if not buffer:
                return
        start = 0
        deliver = self._lane.deliver
        size = len(buffer)
        try:
            while size - start >= 4:
                (length,) = _LENGTH.unpack_from(buffer, start)
                if length >= _MAX_FRAME:
                    raise LaneProtocolError(f"a frame declares {length} bytes (at most {_MAX_FRAME - 1})")
                end = start + 4 + length
                if end > size:
                    break
                seq, messages = parse_frame(buffer, start + 4, end)
                start = end
                self.carried = True
                if seq == _EXPEL:
                    self._lane.expelled_by(self.src)  # type: ignore[arg-type]  # set by the hello
                else:
                    deliver(self.src, seq, messages)  # type: ignore[arg-type]
        except LaneProtocolError as exc:
            self._protocol_error(str(exc))
            return
        if start:
            del buffer[:start]

    def _greet(self) -> bool:
        """Read the hello once it is all in: close the connection unless it proves the secret for a new peer."""
        buffer = self._buffer
        if len(buffer) >= 4 and _LENGTH.unpack_from(buffer)[0] != _HELLO.size:
            self._refuse(f"a hello of {_LENGTH.unpack_from(buffer)[0]} bytes, not {_HELLO.size}")
            return False
        if len(buffer) < 4 + _HELLO.size:
            return False
        magic, src, nonce, proof = _HELLO.unpack_from(buffer, 4)
        del buffer[: 4 + _HELLO.size]
        lane = self._lane
        if magic != _MAGIC:
            self._refuse("not the lane's protocol")
            return False
        if not hmac.compare_digest(proof, _proof(lane.secret, b"hello", self._nonce, src, lane.rank)):
            self._refuse(f"claims to be node {src} without proving the world's secret")
            return False
        if src == lane.rank or src in lane.inbound:
            self._refuse(f"claims to be node {src}, which is {'this node' if src == lane.rank else 'connected'}")
            return False
        self._forget_stranger()
        self.src = src
        lane.inbound[src] = self
        assert self._transport is not None
        self._transport.write(_frame(_PROOF.pack(_proof(lane.secret, b"proof", nonce, lane.rank, src))))
        return True

    def _protocol_error(self, why: str) -> None:
        """A proven peer sent what the lane cannot read: close its link, and count it lost with that reason."""
        src = self.src
        assert src is not None
        assert self._transport is not None
        log.error("fast lane protocol error", node=self._lane.rank, peer=src, error=why)
        self._lane.inbound.pop(src, None)
        self._transport.abort()
        self._lane.report_lost(src, f"fast lane protocol error: {why}")

    def connection_lost(self, exc: Exception | None) -> None:
        """A proven peer's connection closed: lost, unless it closed before carrying a frame.

        A connector gives up a handshake whose proof it has not read in time
        (its loop was held up) and tries again; the listener has taken its hello
        by then. Such a connection carried nothing, so its close lost nothing,
        and a dead peer is the main path's to report.
        """
        self._forget_stranger()
        if self.src is not None and self._lane.inbound.get(self.src) is self:
            del self._lane.inbound[self.src]
            if self.carried:
                self._lane.closed_by(self.src, exc)
            else:
                log.debug("fast lane connection closed before it carried a frame", node=self._lane.rank, peer=self.src)

    def close(self) -> None:
        """Close the connection (this node closes, or forgets the peer)."""
        if self._transport is not None:
            self._transport.close()


class _Outbound(asyncio.Protocol):
    """This node's connection to a peer, for what it sends there: usable once both sides proved the secret."""

    def __init__(self, lane: Lane, dest: int) -> None:
        self._lane = lane
        self._dest = dest
        self._buffer = bytearray()
        self._nonce = os.urandom(16)
        self._transport: asyncio.Transport | None = None
        self._challenged = False
        self.ready: asyncio.Future[None] = lane.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        _no_delay(transport)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        try:
            if self.ready.done():
                raise LaneProtocolError(f"node {self._dest} sent {len(data)} bytes after its proof")
            if not self._challenged:
                self._take_challenge()
            if self._challenged:
                self._take_proof()
        except LaneProtocolError as exc:
            assert self._transport is not None
            self._transport.abort()
            if not self.ready.done():
                self._fail(exc)
            else:
                self._lane.report_lost(self._dest, f"fast lane protocol error: {exc}")

    def _take_challenge(self) -> None:
        buffer, lane = self._buffer, self._lane
        if not _complete(buffer, _CHALLENGE.size, "challenge"):
            return
        magic, rank, nonce = _CHALLENGE.unpack_from(buffer, 4)
        del buffer[: 4 + _CHALLENGE.size]
        if magic != _MAGIC:
            raise LaneProtocolError("the listener does not speak the lane's protocol")
        if rank != self._dest:
            raise LaneProtocolError(f"the listener says it is node {rank}, not node {self._dest}")
        self._challenged = True
        assert self._transport is not None
        self._transport.write(
            _frame(_HELLO.pack(_MAGIC, lane.rank, self._nonce, _proof(lane.secret, b"hello", nonce, lane.rank, rank)))
        )

    def _take_proof(self) -> None:
        buffer, lane = self._buffer, self._lane
        if not _complete(buffer, _PROOF.size, "proof"):
            return
        (proof,) = _PROOF.unpack_from(buffer, 4)
        del buffer[: 4 + _PROOF.size]
        if not hmac.compare_digest(proof, _proof(lane.secret, b"proof", self._nonce, self._dest, lane.rank)):
            raise LaneProtocolError(f"the listener did not prove the world's secret for node {self._dest}")
        if buffer:
            raise LaneProtocolError(f"node {self._dest} sent {len(buffer)} bytes after its proof")
        self.ready.set_result(None)

    def _fail(self, exc: Exception) -> None:
        """End the handshake with ``exc`` (raised where the connection is opened, if that still waits)."""
        self.ready.set_exception(exc)
        self.ready.exception()  # retrieved: an opener that was cancelled leaves no "never retrieved" error

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self._fail(ConnectionError(f"closed during the handshake ({exc or 'by the peer'})"))
        lane = self._lane
        if lane.outbound.get(self._dest) is self._transport and self._transport is not None:
            lane.outbound.pop(self._dest)
            lane.sockets.pop(self._dest, None)
            lane.closed_by(self._dest, exc)


class Lane:
    """This node's end of the fast lane: its listener, and its connection to each peer.

    Args:
        loop: The node's event loop (everything runs on it).
        rank: This node's rank.
        deliver: Takes each bundle that arrives (see :data:`LaneDelivery`).
        lost: Called with a peer's rank and why, when a connection to or from
            it closes while neither side meant it (the peer died, most likely)
            or breaks the protocol.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rank: int,
        deliver: LaneDelivery,
        lost: Callable[[int, str], None],
    ) -> None:
        self.loop = loop
        self.rank = rank
        self.secret = b""
        self.deliver = deliver
        self._lost = lost
        self.outbound: dict[int, asyncio.Transport] = {}
        self.sockets: dict[int, Any] = {}  # the socket under each outbound connection, read by ``stalled``
        self.inbound: dict[int, _Inbound] = {}
        self.strangers: set[_Inbound] = set()  # connections still proving themselves
        self._connecting: dict[int, asyncio.Task[None]] = {}
        self._forgotten: set[int] = set()
        self._reported: set[int] = set()  # peers reported lost (once each: both connections close)
        self._progress: dict[int, tuple[int, float]] = {}  # per peer with bytes waiting: bytes acked, since when
        self._server: asyncio.Server | None = None
        self._refusals = 0  # refused since the last warning
        self._warned = -REFUSAL_LOG_INTERVAL
        self.refused_total = 0
        """Connections refused since start (strangers, failed proofs, broken handshakes)."""
        self.closing = False
        self.address: str | None = None
        """``host:port`` this lane listens on, once started."""

    def __repr__(self) -> str:
        return f"<Lane rank={self.rank} at={self.address} out={sorted(self.outbound)} in={sorted(self.inbound)}>"

    async def start(self, host: str, secret: bytes) -> str:
        """Listen on ``host`` at a free port, taking hellos that prove ``secret``; return ``host:port``.

        Raises:
            ValueError: ``secret`` is empty: a lane that listened without one would
                take anyone who proves nothing.
        """
        if len(secret) < 16:
            raise ValueError(f"the fast lane needs a secret of at least 16 bytes, not {len(secret)}")
        self.secret = secret
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
        """Connect to ``dest`` and complete the handshake, trying again if its listener was too busy to answer.

        Until this succeeds, and for good if it does not, the main path carries
        everything to that peer; its loss, if it is lost, is reported there.
        """
        host, _, port = address.rpartition(":")
        for _ in range(HANDSHAKE_TRIES):
            try:
                transport, protocol = await self.loop.create_connection(
                    lambda: _Outbound(self, dest), host.strip("[]"), int(port)
                )
            except OSError:
                return
            try:
                async with asyncio.timeout(HELLO_TIMEOUT):
                    await protocol.ready
            except (TimeoutError, ConnectionError):
                transport.abort()  # a listener whose loop was busy: try again
                continue
            except LaneProtocolError as exc:
                transport.abort()
                self.refused(address, f"node {dest}'s listener failed the handshake: {exc}")
                return
            except BaseException:
                transport.abort()
                raise
            if self.closing or dest in self._forgotten:
                transport.close()
                return
            self.sockets[dest] = transport.get_extra_info("socket")
            self.outbound[dest] = transport
            return
        log.warning(
            "fast lane not opened: the main path carries what goes there",
            node=self.rank,
            peer=dest,
            why=f"no handshake in {HANDSHAKE_TRIES} tries of {HELLO_TIMEOUT:g} s",
        )

    def send(self, dest: int, seq: int, messages: list[bytes]) -> bool:
        """Write one bundle to ``dest``; False if no connection is up (the main path carries it then)."""
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

    def backlog(self, dest: int) -> int:
        """Bytes written to ``dest`` that this process still holds (the kernel has not taken them yet)."""
        transport = self.outbound.get(dest)
        return 0 if transport is None else transport.get_write_buffer_size()

    def stalled(self, now: float | None = None) -> dict[int, float]:
        """Peers whose connection holds bytes their kernel has not acknowledged, and for how long (any thread).

        A peer whose window is closed (its process does not read: it is busy or
        stopped) is not stalled: its kernel answers, and the main path's heartbeats
        judge the process. Called at intervals; a stall counts from the first
        call that saw bytes waiting with no acknowledgement since, so it is
        never longer than the truth (up to one interval shorter). Linux only
        (``TCP_INFO``); elsewhere nothing is ever stalled.
        """
        now = time.monotonic() if now is None else now
        stalled: dict[int, float] = {}
        for dest, sock in list(self.sockets.items()):
            progress = _tcp_progress(sock)
            if progress is None:
                continue
            waiting, acked = progress
            last = self._progress.get(dest)
            if not waiting:
                self._progress.pop(dest, None)
            elif last is None or last[0] != acked:
                self._progress[dest] = (acked, now)
            else:
                stalled[dest] = now - last[1]
        return stalled

    def forget(self, rank: int) -> None:
        """Peer ``rank`` left on purpose: close both connections, and never connect to it again."""
        transport = self._cut_off(rank)
        if transport is not None:
            transport.close()
        inbound = self.inbound.pop(rank, None)
        if inbound is not None:
            inbound.close()

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
        self.sockets.pop(rank, None)
        self._progress.pop(rank, None)
        return self.outbound.pop(rank, None)

    def expelled_by(self, rank: int) -> None:
        """Peer ``rank`` says it counts this node lost: this node counts it lost in turn."""
        self.report_lost(rank, f"node {rank} counts this node lost (it was silent too long)")

    def closed_by(self, rank: int, exc: Exception | None) -> None:
        """A connection to or from ``rank`` closed: unless this node or that peer meant it, the peer is lost."""
        if rank in self._forgotten:
            return
        self.report_lost(rank, f"fast lane closed ({exc or 'the peer closed it'})")

    def report_lost(self, rank: int, why: str) -> None:
        """Tell the transport that ``rank`` is lost, once, unless this node is closing."""
        if self.closing or rank in self._reported:
            return
        self._reported.add(rank)
        self._lost(rank, why)

    def refused(self, address: str, why: str) -> None:
        """Log a refused connection: one warning per ``REFUSAL_LOG_INTERVAL``, counting those in between."""
        self.refused_total += 1
        self._refusals += 1
        now = time.monotonic()
        if now - self._warned < REFUSAL_LOG_INTERVAL:
            return
        self._warned = now
        count, self._refusals = self._refusals, 0
        log.warning("fast lane refused a connection", node=self.rank, peer=address, why=why, refused=count)

    async def close(self) -> None:
        """Close every connection and the listener; what was written is sent first."""
        self.closing = True
        for task in list(self._connecting.values()):
            task.cancel()
        for transport in list(self.outbound.values()):
            transport.close()
        for inbound in [*self.inbound.values(), *self.strangers]:
            inbound.close()
        self.outbound.clear()
        self.sockets.clear()
        self.inbound.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def _frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


def _complete(buffer: bytearray, size: int, what: str) -> bool:
    """Whether ``buffer`` holds a whole handshake frame of ``size`` bytes; raises if it declares another size."""
    if len(buffer) < 4:
        return False
    (length,) = _LENGTH.unpack_from(buffer)
    if length != size:
        raise LaneProtocolError(f"a {what} of {length} bytes, not {size}")
    return len(buffer) >= 4 + size


def _address(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peername)


def _tcp_progress(sock: Any) -> tuple[bool, int] | None:
    """Whether a TCP socket holds bytes not yet acknowledged while its peer's window is open, and bytes acked.

    None where the kernel does not say (not Linux, or a closed socket).
    """
    tcp_info = getattr(socket, "TCP_INFO", None)
    if tcp_info is None or sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, _TCP_INFO_SIZE)
    except OSError:
        return None
    if len(raw) < _TCP_INFO_SIZE:
        return None
    (unacked,) = _UNACKED.unpack_from(raw, 24)
    (notsent,) = _NOTSENT.unpack_from(raw, 144)
    (window,) = _SND_WND.unpack_from(raw, 228)
    (acked,) = _BYTES_ACKED.unpack_from(raw, 120)
    return (unacked > 0 or notsent > 0) and window > 0, acked


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """Send small frames at once (no Nagle delay)."""
    sock: Any = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
