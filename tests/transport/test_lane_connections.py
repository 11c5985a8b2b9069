"""The fast lane's connections on their own, in one event loop: handshakes, strangers, frames in order, closes."""

from __future__ import annotations

import asyncio
import os
import random
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog

from actorch._transport.lane import connections as lane_module
from actorch._transport.lane.connections import Lane, LaneProtocolError, parse_frame

SECRET = b"0123456789abcdef"


@dataclass
class Peer:
    """A lane and what it saw: bundles delivered, peers reported lost."""

    lane: Lane = field(init=False)
    delivered: list[tuple[int, int, list[bytes]]] = field(default_factory=list)
    lost: list[tuple[int, str]] = field(default_factory=list)


async def open_peer(rank: int) -> Peer:
    peer = Peer()
    loop = asyncio.get_running_loop()
    peer.lane = Lane(loop, rank, lambda *bundle: peer.delivered.append(bundle), lambda *why: peer.lost.append(why))
    await peer.lane.start("127.0.0.1", SECRET)
    return peer


async def until(condition: object, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # type: ignore[operator]  # noqa: ASYNC110 - nothing to wait on but the condition
            await asyncio.sleep(0.005)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Peer, Peer]]:
    zero, one = await open_peer(0), await open_peer(1)
    assert zero.lane.address is not None
    assert one.lane.address is not None
    zero.lane.connect(1, one.lane.address)
    one.lane.connect(0, zero.lane.address)
    await until(lambda: 1 in zero.lane.outbound and 0 in one.lane.outbound)
    yield zero, one
    await zero.lane.close()
    await one.lane.close()


async def test_lane_delivers_bundles_in_order_with_their_sequence_numbers(pair: tuple[Peer, Peer]) -> None:
    zero, one = pair
    big = bytes(range(256)) * 4096  # a megabyte: many reads make one frame
    bundles = [[b"a"], [b"b", b"", b"c"], [big, b"d"], [b"e" * 70000]]
    for seq, messages in enumerate(bundles):
        assert zero.lane.send(1, seq, messages)
    await until(lambda: len(one.delivered) == len(bundles))
    assert one.delivered == [(0, seq, messages) for seq, messages in enumerate(bundles)]
    assert one.lane.send(0, 7, [b"back"])
    await until(lambda: zero.delivered)
    assert zero.delivered == [(1, 7, [b"back"])]


async def test_lane_sends_nothing_to_a_peer_it_has_no_connection_to() -> None:
    lonely = await open_peer(0)
    assert not lonely.lane.send(5, 0, [b"x"])  # torch RPC carries it then
    await lonely.lane.close()


async def test_lane_reports_a_peer_lost_when_its_connection_closes_unasked(pair: tuple[Peer, Peer]) -> None:
    zero, one = pair
    assert one.lane.send(0, 0, [b"carried"])
    await until(lambda: zero.delivered)
    for transport in list(one.lane.outbound.values()):
        transport.abort()  # as if its process died
    await until(lambda: zero.lost)
    assert zero.lost[0][0] == 1
    assert "fast lane closed" in zero.lost[0][1]


async def test_lane_forgets_a_peer_that_left_and_never_reports_it_lost(pair: tuple[Peer, Peer]) -> None:
    zero, one = pair
    zero.lane.forget(1)
    one.lane.forget(0)
    await asyncio.sleep(0.05)
    assert not zero.lane.send(1, 0, [b"x"])
    assert zero.lost == []
    assert one.lost == []
    assert one.lane.address is not None
    zero.lane.connect(1, one.lane.address)  # a forgotten peer is not met again
    await asyncio.sleep(0.05)
    assert 1 not in zero.lane.outbound


async def test_lane_that_closes_reports_nobody_lost(pair: tuple[Peer, Peer]) -> None:
    zero, one = pair
    await zero.lane.close()
    await asyncio.sleep(0.05)
    assert zero.lost == []
    assert [rank for rank, _ in one.lost] == [0]  # the other side sees it go, as torch RPC's watch would


async def test_lane_tells_a_peer_it_counts_lost_so_and_the_peer_hears_it_once(pair: tuple[Peer, Peer]) -> None:
    zero, one = pair
    zero.lane.expel(1)
    await until(lambda: one.lost)
    await asyncio.sleep(0.05)
    assert one.lost == [(0, "node 0 counts this node lost (it was silent too long)")]
    assert zero.lost == []  # it expelled the peer: nothing more to report
    assert not zero.lane.send(1, 0, [b"x"])


# ---------------------------------------------------------------- strangers and handshakes


@dataclass
class Stranger:
    """A raw TCP connection to a lane, speaking its protocol by hand (or not)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    nonce: bytes = b""  # the listener's challenge
    rank: int = -1  # the rank the listener says it has

    async def challenge(self) -> None:
        frame = await self.reader.readexactly(4 + lane_module._CHALLENGE.size)
        magic, self.rank, self.nonce = lane_module._CHALLENGE.unpack_from(frame, 4)
        assert magic == lane_module._MAGIC

    def hello(self, rank: int, secret: bytes = SECRET, mine: bytes | None = None) -> bytes:
        """A hello frame claiming ``rank``, proving ``secret`` against the listener's nonce, with ``mine`` as own."""
        proof = lane_module._proof(secret, b"hello", self.nonce, rank, self.rank)
        return frame_of(lane_module._HELLO.pack(lane_module._MAGIC, rank, mine or os.urandom(16), proof))

    async def closed(self, seconds: float = 5.0) -> bool:
        """Whether the lane closes the connection within ``seconds`` (what it sent before is skipped)."""
        async with asyncio.timeout(seconds):
            try:
                while await self.reader.read(65536):
                    pass
            except ConnectionResetError:
                pass  # closed with a reset: what it was sending was refused
        return True


def frame_of(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def bundle_frame(seq: int, messages: list[bytes]) -> bytes:
    body = struct.pack("<QI", seq, len(messages)) + b"".join(struct.pack("<I", len(m)) + m for m in messages)
    return frame_of(body)


async def stranger_to(peer: Peer) -> Stranger:
    assert peer.lane.address is not None
    host, _, port = peer.lane.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    return Stranger(reader, writer)


async def proven(peer: Peer, rank: int) -> Stranger:
    """A connection that completed the handshake as node ``rank`` (it knows the secret)."""
    stranger = await stranger_to(peer)
    await stranger.challenge()
    stranger.writer.write(stranger.hello(rank))
    await stranger.reader.readexactly(4 + lane_module._PROOF.size)
    await until(lambda: rank in peer.lane.inbound)
    return stranger


@pytest.fixture
def refusals() -> Iterator[list[dict[str, Any]]]:
    """The lane's warnings about refused connections, with the rate limit reset."""
    with structlog.testing.capture_logs() as logs:
        yield [entry for entry in logs if entry["event"] == "fast lane refused a connection"]


def refused_logs(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "fast lane refused a connection"]


async def test_lane_refuses_to_listen_without_a_secret() -> None:
    loop = asyncio.get_running_loop()
    lane = Lane(loop, 0, lambda *_: None, lambda *_: None)
    with pytest.raises(ValueError, match="needs a secret of at least 16 bytes, not 0"):
        await lane.start("127.0.0.1", b"")
    assert lane.address is None
    await lane.close()


async def test_lane_challenges_first_and_proves_itself_after_a_good_hello() -> None:
    peer = await open_peer(0)
    stranger = await stranger_to(peer)
    await stranger.challenge()
    assert stranger.rank == 0
    mine = os.urandom(16)
    stranger.writer.write(stranger.hello(3, mine=mine))
    frame = await stranger.reader.readexactly(4 + lane_module._PROOF.size)
    # the listener proves the secret too, against the nonce the hello carried
    assert frame[4:] == lane_module._proof(SECRET, b"proof", mine, 0, 3)
    await until(lambda: 3 in peer.lane.inbound)
    stranger.writer.write(bundle_frame(0, [b"hi"]))
    await until(lambda: peer.delivered)
    assert peer.delivered == [(3, 0, [b"hi"])]
    stranger.writer.close()
    await peer.lane.close()


async def test_lane_closes_a_connection_whose_hello_does_not_prove_the_secret() -> None:
    peer = await open_peer(0)
    with structlog.testing.capture_logs() as logs:
        stranger = await stranger_to(peer)
        await stranger.challenge()
        stranger.writer.write(stranger.hello(3, secret=b"wrong secret...."))
        stranger.writer.write(bundle_frame(0, [b"x"]))  # a frame after it must not be delivered
        assert await stranger.closed()
    stranger.writer.close()
    assert peer.delivered == []
    assert peer.lost == []
    assert peer.lane.inbound == {}
    [warning] = refused_logs(logs)
    assert warning["log_level"] == "warning"
    assert "without proving the world's secret" in warning["why"]
    assert warning["peer"].startswith("127.0.0.1:")
    assert "exc_info" not in warning
    await peer.lane.close()


async def test_lane_refuses_a_hello_replayed_on_another_connection() -> None:
    peer = await open_peer(0)
    first = await stranger_to(peer)
    await first.challenge()
    recorded = first.hello(4)  # as an eavesdropper would record it
    first.writer.write(recorded)
    await until(lambda: 4 in peer.lane.inbound)
    first.writer.close()
    await until(lambda: 4 not in peer.lane.inbound)
    second = await stranger_to(peer)
    await second.challenge()
    second.writer.write(recorded)  # the nonce it proved was the first connection's
    assert await second.closed()
    assert 4 not in peer.lane.inbound
    second.writer.close()
    await peer.lane.close()


async def test_lane_binds_the_claimed_rank_to_the_proof() -> None:
    peer = await open_peer(0)
    stranger = await stranger_to(peer)
    await stranger.challenge()
    hello = bytearray(stranger.hello(1))
    struct.pack_into("<I", hello, 4 + 8, 2)  # claim rank 2 with rank 1's proof
    stranger.writer.write(bytes(hello))
    assert await stranger.closed()
    assert peer.lane.inbound == {}
    stranger.writer.close()
    await peer.lane.close()


async def test_lane_does_not_let_a_second_connection_take_a_connected_rank() -> None:
    peer = await open_peer(0)
    first = await proven(peer, 1)
    second = await stranger_to(peer)
    await second.challenge()
    second.writer.write(second.hello(1))
    assert await second.closed()
    first.writer.write(bundle_frame(0, [b"still mine"]))
    await until(lambda: peer.delivered)
    assert peer.delivered == [(1, 0, [b"still mine"])]
    first.writer.close()
    second.writer.close()
    await peer.lane.close()


async def test_lane_takes_a_proven_connection_closed_before_any_frame_as_a_handshake_given_up() -> None:
    # A connector whose loop was held up past its handshake's timeout gives the
    # connection up after the listener took its hello, then connects again.
    peer = await open_peer(0)
    given_up = await proven(peer, 1)
    given_up.writer.transport.abort()
    await until(lambda: 1 not in peer.lane.inbound)
    again = await proven(peer, 1)
    again.writer.write(bundle_frame(0, [b"on the second try"]))
    await until(lambda: peer.delivered)
    assert peer.lost == []
    assert peer.delivered == [(1, 0, [b"on the second try"])]
    again.writer.transport.abort()
    await until(lambda: peer.lost)
    assert peer.lost[0][0] == 1  # once it carried a frame, its close is a loss
    await peer.lane.close()


async def test_lane_closes_a_stranger_that_declares_a_huge_hello_without_buffering_it() -> None:
    peer = await open_peer(0)
    stranger = await stranger_to(peer)
    await stranger.challenge()
    stranger.writer.write(struct.pack("<I", (4 << 30) - 1))  # "4 GiB follow"
    try:
        for _ in range(64):
            stranger.writer.write(b"\0" * 65536)
            await stranger.writer.drain()
    except ConnectionError:
        pass  # closed while it streamed
    assert await stranger.closed()
    assert not peer.lane.strangers
    stranger.writer.close()
    await peer.lane.close()


async def test_lane_closes_a_stranger_that_does_not_finish_its_hello_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane_module, "HELLO_TIMEOUT", 0.2)
    peer = await open_peer(0)
    with structlog.testing.capture_logs() as logs:
        stranger = await stranger_to(peer)
        await stranger.challenge()
        stranger.writer.write(stranger.hello(3)[:10])  # half a hello, then nothing
        assert await stranger.closed(seconds=3)
    assert not peer.lane.strangers
    assert "no hello within 0.2 s" in refused_logs(logs)[0]["why"]
    stranger.writer.close()
    await peer.lane.close()


async def test_lane_bounds_the_connections_still_proving_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane_module, "MAX_STRANGERS", 4)
    peer = await open_peer(0)
    idle = [await stranger_to(peer) for _ in range(4)]
    for stranger in idle:
        await stranger.challenge()
    await until(lambda: len(peer.lane.strangers) == 4)
    extra = await stranger_to(peer)
    assert await extra.closed()  # closed at once, before any challenge
    assert len(peer.lane.strangers) == 4
    for stranger in idle:  # the ones waiting are not disturbed, and a peer still gets in once they go
        stranger.writer.close()
    await until(lambda: not peer.lane.strangers)
    good = await proven(peer, 1)
    good.writer.close()
    extra.writer.close()
    await peer.lane.close()


async def test_lane_warns_about_refused_strangers_once_per_interval() -> None:
    peer = await open_peer(0)
    with structlog.testing.capture_logs() as logs:
        for _ in range(20):
            stranger = await stranger_to(peer)
            await stranger.challenge()
            stranger.writer.write(b"GET / HTTP/1.1\r\n\r\n")
            assert await stranger.closed()
            stranger.writer.close()
    assert len(refused_logs(logs)) == 1
    assert peer.lane.refused_total == 20
    await peer.lane.close()


async def test_lane_connects_only_to_a_listener_that_proves_the_secret() -> None:
    zero = await open_peer(0)
    impostor = Peer()
    loop = asyncio.get_running_loop()
    impostor.lane = Lane(loop, 1, lambda *b: impostor.delivered.append(b), lambda *w: impostor.lost.append(w))
    await impostor.lane.start("127.0.0.1", b"another world's secret")
    assert impostor.lane.address is not None
    with structlog.testing.capture_logs() as logs:
        zero.lane.connect(1, impostor.lane.address)
        await until(lambda: refused_logs(logs) and not zero.lane._connecting)
    assert 1 not in zero.lane.outbound  # torch RPC carries what goes to node 1
    assert not zero.lane.send(1, 0, [b"secret data"])
    assert impostor.delivered == []
    await zero.lane.close()
    await impostor.lane.close()


# ---------------------------------------------------------------- frames from a proven peer


async def test_lane_closes_a_proven_peer_that_sends_a_malformed_frame_as_a_protocol_error() -> None:
    peer = await open_peer(0)
    unhandled: list[Any] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        with structlog.testing.capture_logs() as logs:
            stranger = await proven(peer, 2)
            body = struct.pack("<QI", 0, 1) + struct.pack("<I", 1000) + b"short"  # a message longer than its frame
            stranger.writer.write(frame_of(body))
            assert await stranger.closed()
            await until(lambda: peer.lost)
    finally:
        asyncio.get_running_loop().set_exception_handler(None)
    assert unhandled == []
    assert peer.delivered == []
    [(rank, why)] = peer.lost
    assert rank == 2
    assert why == "fast lane protocol error: message 0 of 1 runs past the frame's 21 bytes"
    [error] = [entry for entry in logs if entry["event"] == "fast lane protocol error"]
    assert error["peer"] == 2
    assert "exc_info" not in error
    stranger.writer.close()
    await peer.lane.close()


def valid_frames(rng: random.Random) -> bytes:
    return b"".join(
        bundle_frame(seq, [rng.randbytes(rng.randrange(0, 40)) for _ in range(rng.randrange(0, 4))])
        for seq in range(rng.randrange(1, 4))
    )


def mutated(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        what = rng.randrange(4)
        if what == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif what == 1 and data:
            del data[rng.randrange(len(data)) :]
        elif what == 2:
            data[rng.randrange(len(data) + 1) : 0] = rng.randbytes(rng.randrange(1, 9))
        else:
            at = rng.randrange(max(len(data) - 3, 1))
            data[at : at + 4] = struct.pack(
                "<I", rng.choice([0, 1, 11, 12, 0xFFFFFFFF, 1 << 31, rng.randrange(1 << 32)])
            )
    return bytes(data)


def test_frame_parser_takes_every_valid_frame_and_refuses_every_other_with_its_own_error() -> None:
    rng = random.Random(33)
    for _ in range(3000):
        data = mutated(rng, valid_frames(rng)) if rng.random() < 0.8 else rng.randbytes(rng.randrange(0, 64))
        if len(data) < 4:
            continue
        body = data[4:]
        try:
            seq, messages = parse_frame(data, 4, len(data))
        except LaneProtocolError:
            continue
        # what parses is exactly what was framed: the same frame built again gives the same bytes
        assert bundle_frame(seq, messages)[4:] == bytes(body)


async def test_lane_survives_random_bytes_from_a_proven_peer_without_an_escaping_exception() -> None:
    rng = random.Random(7)
    peer = await open_peer(0)
    unhandled: list[Any] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        for rank in range(1, 41):
            stranger = await proven(peer, rank)
            stranger.writer.write(mutated(rng, valid_frames(rng)))
            stranger.writer.close()
            await until(lambda rank=rank: rank not in peer.lane.inbound)
    finally:
        asyncio.get_running_loop().set_exception_handler(None)
    assert unhandled == []
    for rank, why in peer.lost:
        assert why.startswith(("fast lane protocol error: ", "fast lane closed")), (rank, why)
    await peer.lane.close()


async def test_lane_survives_random_bytes_from_strangers() -> None:
    rng = random.Random(11)
    peer = await open_peer(0)
    unhandled: list[Any] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        for _ in range(40):
            stranger = await stranger_to(peer)
            stranger.writer.write(rng.randbytes(rng.randrange(4, 300)))
            assert await stranger.closed()
            stranger.writer.close()
            await stranger.writer.wait_closed()
        await until(lambda: not peer.lane.strangers)
    finally:
        asyncio.get_running_loop().set_exception_handler(None)
    assert unhandled == []
    assert peer.lane.inbound == {}
    assert peer.delivered == []
    await peer.lane.close()


async def test_lane_counts_bytes_a_peer_has_not_taken_as_backlog(pair: tuple[Peer, Peer]) -> None:
    zero, one = pair
    assert zero.lane.backlog(1) == 0
    for inbound in one.lane.inbound.values():
        assert inbound._transport is not None
        inbound._transport.pause_reading()  # node 1 takes nothing: its kernel's buffers fill, then ours
    big = b"x" * (1 << 20)
    for seq in range(64):
        zero.lane.send(1, seq, [big])
    await until(lambda: zero.lane.backlog(1) > 16 << 20)
    assert zero.lane.stalled() == {}  # a closed window is a busy peer, not a silent link
    await asyncio.sleep(0.3)
    assert zero.lane.stalled() == {}
    assert zero.lane.backlog(7) == 0


async def test_lane_tries_a_silent_listener_again_then_leaves_the_peer_to_torch_rpc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lane_module, "HELLO_TIMEOUT", 0.1)
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # a listener whose loop is too busy to answer

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    zero = await open_peer(0)
    with structlog.testing.capture_logs() as logs:
        zero.lane.connect(1, f"127.0.0.1:{port}")
        await until(lambda: any(entry["event"].startswith("fast lane not opened") for entry in logs))
    assert len(accepted) == lane_module.HANDSHAKE_TRIES
    assert 1 not in zero.lane.outbound
    [warning] = [entry for entry in logs if entry["event"].startswith("fast lane not opened")]
    assert warning["why"] == "no handshake in 3 tries of 0.1 s"
    for writer in accepted:
        writer.close()
    server.close()
    await server.wait_closed()
    await zero.lane.close()
