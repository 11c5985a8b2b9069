"""The shared-memory channel and leases: two nodes of one host, played by two codecs of this process.

Each side has its own pool (its segments named after it, as a process's are),
and each route says what the other side's node said of its reach, so tensors
go through real ``/dev/shm`` segments, mapped by the receiving side.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from tensor_cases import bits, payloads

import actorch
from actorch._base.channels.leases import process_pool
from actorch._base.channels.plane import DataPlane
from actorch._base.channels.route import TensorRoute
from actorch._base.channels.segments import SHM_DIR, SegmentPool, host_identity
from actorch._base.channels.shm import REACH_KEY, SEGMENTS_KEY, SharedMemoryChannel, dense_strides
from actorch._base.codec import Codec

pytestmark = [
    pytest.mark.skipif(host_identity() is None, reason="no /dev/shm on this machine"),
    pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:Sparse (CSR|CSC|BSR|BSC) tensor support is in beta state:UserWarning"),
    pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning"),
]

MIB = 1 << 20


class Side:
    """One node of the pair: its pool, its codec, and the route toward the other."""

    def __init__(self, rank: int, tag: str, per_peer: int = 256 * MIB, limit: int = 256 * MIB) -> None:
        self.rank = rank
        self.pool = SegmentPool(limit, prefix=f"actorch-{os.getpid()}-{tag * 8}")
        self.shm = SharedMemoryChannel(self.pool, per_peer=per_peer)
        self.codec = Codec(plane=DataPlane.standard(shm=self.shm))

    def reach(self) -> dict[str, str]:
        return {REACH_KEY: host_identity() or "", SEGMENTS_KEY: self.pool.prefix}

    def send(self, other: Side, value: Any, *, copy: bool = False) -> tuple[bytes, list[Any]]:
        return self.codec.encode(value, route=TensorRoute(other.rank, reach=other.reach()), copy_tensors=copy)

    def receive(self, message: tuple[bytes, list[Any]]) -> Any:
        return self.codec.decode(*message)

    def counts(self) -> dict[str, int]:
        return self.codec.plane.statistics()["shm"]


@pytest.fixture
def pair() -> Iterator[tuple[Side, Side]]:
    a, b = Side(0, "a"), Side(1, "b")
    yield a, b
    a.pool.close()
    b.pool.close()


def test_a_tensor_for_this_host_goes_by_reference_and_arrives_bitwise(pair: tuple[Side, Side]) -> None:
    a, b = pair
    sent = torch.randn(256, 1024)
    body, side = a.send(b, [sent, sent.t(), sent[::3, 7::5]])
    assert side == [], "nothing rides the transport's path"
    assert len(body) < 1024, "the bytes stay out of the message"
    arrived = b.receive((body, side))
    assert [bits(tensor) for tensor in arrived] == [bits(sent), bits(sent.t()), bits(sent[::3, 7::5])]
    assert arrived[1].stride() == sent.t().stride(), "a dense layout is kept"
    assert a.counts()["tensors"] == 3


def test_a_received_tensor_is_the_receivers_to_write_and_the_sender_can_change_its_own(
    pair: tuple[Side, Side],
) -> None:
    a, b = pair
    sent = torch.zeros(64 * 1024)
    message = a.send(b, [sent], copy=True)
    sent.fill_(1.0)  # tell's promise: what arrives is what was sent
    [arrived] = b.receive(message)
    assert arrived.sum().item() == 0.0
    arrived.add_(5.0)  # the receiver owns it
    assert sent.sum().item() == 64 * 1024


def test_a_segment_is_reused_once_the_receiver_frees_what_it_got(pair: tuple[Side, Side]) -> None:
    a, b = pair
    for _ in range(5):
        [arrived] = b.receive(a.send(b, [torch.ones(MIB)]))
        assert arrived.sum().item() == MIB
        del arrived
        gc.collect()
    assert a.pool.statistics()["segments"] == 1
    assert b.counts()["mapped"] == 1, "the receiver maps it once"


def test_kept_tensors_past_the_per_peer_bound_go_by_value() -> None:
    a, b = Side(0, "c", per_peer=2 * MIB), Side(1, "d")
    try:
        kept = [b.receive(a.send(b, [torch.ones(MIB // 4)])) for _ in range(2)]  # 2 MiB held by the receiver
        _, side = a.send(b, [torch.ones(MIB // 4)])
        assert len(side) == 1, "by value now"
        assert a.counts()["peer_full"] == 1
        assert kept
    finally:
        a.pool.close()
        b.pool.close()


def test_a_full_pool_sends_by_value_and_counts_it() -> None:
    a, b = Side(0, "e", limit=MIB), Side(1, "f")
    try:
        held = b.receive(a.send(b, [torch.ones(MIB // 4)]))
        _, side = a.send(b, [torch.ones(MIB // 4)])
        assert len(side) == 1
        assert a.counts()["by_value"] == 1
        assert a.counts()["pool_full"] == 1
        assert held
    finally:
        a.pool.close()
        b.pool.close()


def test_a_tensor_sent_back_to_where_it_came_from_goes_without_a_copy(pair: tuple[Side, Side]) -> None:
    a, b = pair
    sent = torch.randn(MIB // 4)
    [arrived] = b.receive(a.send(b, [sent]))
    arrived.mul_(2.0)  # a stage that works in place, then answers
    reply = b.send(a, arrived)
    assert b.counts()["handed_back"] == 1
    assert b.pool.statistics()["segments"] == 0, "the answer needed no segment of its own"
    del arrived
    gc.collect()
    assert a.pool.statistics()["lent"] == 1, "handed back, not yet taken: the segment stays busy"
    back = a.receive(reply)
    assert torch.equal(back, sent * 2.0)
    del back
    gc.collect()
    assert a.pool.statistics()["lent"] == 0


def test_a_dropped_message_gives_its_lends_back_on_either_side(pair: tuple[Side, Side]) -> None:
    a, b = pair
    body, _ = a.send(b, [torch.ones(MIB // 4), (torch.ones(MIB // 4),)])
    assert a.pool.statistics()["lent"] == 2
    b.codec.drop(body)  # the receiver refused it unread (its actor stopped, its caller gave up)
    assert a.pool.statistics()["lent"] == 0
    assert a.pool.on_way_to(1) == 0
    unsent, _ = a.send(b, {"w": torch.ones(MIB // 4)})
    a.codec.drop(unsent)  # the sender never sent it (too large, mailbox full)
    assert a.pool.statistics()["lent"] == 0
    a.codec.drop(b"\xc1 not msgpack")  # what cannot be read lends nothing, and raises nothing


def test_a_lost_node_gives_back_its_lends_and_loses_its_files(pair: tuple[Side, Side]) -> None:
    a, b = pair
    held = b.receive(a.send(b, [torch.ones(MIB // 4)]))
    b.send(a, [torch.ones(MIB // 4)])  # b's own segment, which a is told to remove when b is lost
    a.codec.plane.forget(1, b.reach())
    assert a.pool.statistics()["lent"] == 0
    assert not [name for name in os.listdir(SHM_DIR) if name.startswith(b.pool.prefix + "-")]
    assert torch.equal(held[0], torch.ones(MIB // 4)), "what the lost node held stays readable here"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(payload=payloads())
def test_every_drawn_tensor_crosses_shared_memory_bitwise(payload: list[torch.Tensor]) -> None:
    a, b = Side(0, "1"), Side(1, "2")
    try:
        expected = [bits(tensor) for tensor in payload]
        for copy in (False, True):
            assert [bits(tensor) for tensor in b.receive(a.send(b, payload, copy=copy))] == expected
    finally:
        a.pool.close()
        b.pool.close()


def test_dense_strides_keep_a_permuted_layout_and_make_others_contiguous() -> None:
    base = torch.empty(2, 3, 4)
    assert dense_strides(base.permute(2, 0, 1)) == [1, 12, 4]
    assert dense_strides(base[:, ::2]) == [8, 4, 1]
    assert dense_strides(base[:1].expand(5, 3, 4)) == [12, 4, 1]


# ---------------------------------------------------------------- leases


def test_a_lease_goes_by_reference_without_a_copy_and_is_in_use_while_held(pair: tuple[Side, Side]) -> None:
    _, b = pair
    lease = actorch.lease((1024, 256), torch.float32)
    assert lease.shared
    lease.tensor.fill_(3.0)
    channel = SharedMemoryChannel(actorch_pool(), per_peer=256 * MIB)
    codec = Codec(plane=DataPlane.standard(shm=channel))
    message = codec.encode([lease.tensor[100:]], route=TensorRoute(1, reach=b.reach()))
    assert channel.statistics()["from_leases"] == 1
    assert channel.statistics()["segments"] == 1, "the lease's own segment: nothing new was made"
    [arrived] = b.receive(message)
    assert lease.in_use
    assert torch.equal(arrived, torch.full((924, 256), 3.0))
    del arrived
    gc.collect()
    assert not lease.in_use
    asyncio.run(asyncio.wait_for(lease.wait_free(), 1.0))
    lease.close()


def test_a_lease_with_no_room_is_an_ordinary_tensor() -> None:
    pool = actorch_pool()
    limit, pool.limit = pool.limit, 1
    try:
        with actorch.lease(1000) as lease:
            assert not lease.shared
            assert lease.tensor.shape == (1000,)
            assert not lease.in_use
    finally:
        pool.limit = limit


def test_lease_refuses_a_bad_shape_or_dtype_and_leases_are_made_only_by_lease() -> None:
    with pytest.raises(ValueError, match="shape"):
        actorch.lease((2, -1))
    with pytest.raises(ValueError, match="dtype"):
        actorch.lease(3, "float32")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("made by actorch.lease(shape, dtype)")):
        actorch.Lease(torch.ones(1), None, None)  # type: ignore[call-arg]


def actorch_pool() -> SegmentPool:
    return process_pool()


def test_a_multicast_places_a_tensor_once_and_lends_it_to_every_node_of_the_host() -> None:
    a, b, c = Side(0, "3"), Side(1, "4"), Side(2, "5")
    try:
        sent = torch.randn(MIB // 4)
        shared: dict[Any, Any] = {}
        to_b = a.codec.encode([sent], route=TensorRoute(1, reach=b.reach()), shared=shared)
        to_c = a.codec.encode([sent], route=TensorRoute(2, reach=c.reach()), shared=shared)
        assert a.pool.statistics()["segments"] == 1, "one copy for the whole host"
        [at_b], [at_c] = b.receive(to_b), c.receive(to_c)
        assert torch.equal(at_b, sent)
        assert torch.equal(at_c, sent)
        del at_b
        gc.collect()
        assert a.pool.statistics()["lent"] == 1, "c still holds it"
        del at_c
        gc.collect()
        assert a.pool.statistics()["lent"] == 1, "the placement is kept while the multicast's dict lives"
        del shared, to_b, to_c
        gc.collect()
        assert a.pool.statistics()["lent"] == 0
        a.codec.encode([sent], route=TensorRoute(1, reach=b.reach()))
        a.codec.encode([sent], route=TensorRoute(2, reach=c.reach()))
        assert a.pool.statistics()["segments"] == 2, "without a multicast, each message its own copy"
    finally:
        for side in (a, b, c):
            side.pool.close()


def test_a_shared_value_sent_in_many_messages_is_placed_once_while_it_lives() -> None:
    a, b, c = Side(0, "6"), Side(1, "7"), Side(2, "8")
    try:
        weights = actorch.shared({"w": torch.randn(MIB // 4), "step": 3})
        assert repr(weights).startswith("<actorch.Shared dict")
        first = a.send(b, weights)
        a.pool.place(MIB, rank=9)  # other sends meanwhile must not take its segment
        second = a.send(c, weights)
        third = a.send(b, weights)
        assert a.pool.statistics()["segments"] == 2, "the weights' segment once, and the other send's"
        got = [side.receive(message) for side, message in ((b, first), (c, second), (b, third))]
        assert all(torch.equal(value["w"], weights.value["w"]) and value["step"] == 3 for value in got)
        assert type(got[0]) is dict, "receivers get the value, not the wrapper"
        del got, first, second, third
        gc.collect()
        assert a.pool.statistics()["lent"] == 2, "the shared value keeps its placement; the other send is out"
        del weights
        gc.collect()
        assert a.pool.statistics()["lent"] == 1
    finally:
        for side in (a, b, c):
            side.pool.close()


def test_a_shared_value_for_this_very_process_is_its_value() -> None:
    codec = Codec()
    value = {"w": torch.ones(3)}
    body, side = codec.encode([actorch.shared(value)])
    [received] = codec.decode(body, side)
    assert received["w"] is value["w"]
