"""The fast lane on its own, in one event loop: hellos, frames in order, closes, forgetting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from actorch._transport.lane import Lane

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
    peer.lane = Lane(
        loop, rank, SECRET, lambda *bundle: peer.delivered.append(bundle), lambda *why: peer.lost.append(why)
    )
    await peer.lane.start("127.0.0.1")
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


async def test_lane_closes_a_connection_whose_hello_does_not_prove_the_secret() -> None:
    peer = await open_peer(0)
    assert peer.lane.address is not None
    host, _, port = peer.lane.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    hello = b"actorch-lane/1\n" + (3).to_bytes(4, "little") + b"wrong secret...."
    writer.write(len(hello).to_bytes(4, "little") + hello)
    writer.write(b"\x10\x00\x00\x00" + b"\x00" * 16)  # a frame after it must not be delivered
    async with asyncio.timeout(5):
        assert await reader.read() == b""  # closed by the lane
    writer.close()
    assert peer.delivered == []
    assert peer.lost == []
    assert peer.lane.inbound == {}
    await peer.lane.close()


async def test_lane_reports_a_peer_lost_when_its_connection_closes_unasked(pair: tuple[Peer, Peer]) -> None:
    zero, one = pair
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
