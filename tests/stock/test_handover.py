"""Batches by reference on one host: who may get them, and the leases a collector reuses once the reader let go."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from actorch._base.channels.leases import process_pool
from actorch._base.channels.segments import SegmentPool, host_identity
from actorch._stock.handover import Handover, Slots, usable

pytestmark = pytest.mark.skipif(host_identity() is None, reason="no /dev/shm on this machine")

SHAPE = (4, 2, 3)


def test_usable_hands_over_only_to_another_process() -> None:
    assert usable(None) is None
    assert usable((os.getpid(), 3)) is None, "the same process takes batches as they are"
    assert usable((os.getpid() + 1, 0)) is None
    assert usable((os.getpid() + 1, 3)) == Handover(os.getpid() + 1, 3)


def held_by_a_reader(pool: SegmentPool, tensor: torch.Tensor) -> None:
    """Lend the lease under ``tensor`` to node 1, as sending it to a reader of this host does."""
    segment = pool.leased_at(tensor.untyped_storage().data_ptr())
    assert segment is not None
    pool.lend(segment, 1, tensor.nbytes)


@pytest.fixture
def slots() -> Iterator[Slots]:
    made = Slots(2)
    yield made
    made.close()


def test_a_lease_is_written_again_once_the_reader_let_go(slots: Slots) -> None:
    first = slots.take(SHAPE, torch.uint8)
    assert first is not None
    assert first.shape == (2, *SHAPE)
    assert slots.take(SHAPE, torch.uint8) is first, "nobody holds it: it is reused"


def test_a_lease_the_reader_holds_is_not_written_and_past_the_count_the_batch_goes_by_value(slots: Slots) -> None:
    pool = process_pool()
    first = slots.take(SHAPE, torch.uint8)
    assert first is not None
    held_by_a_reader(pool, first)
    second = slots.take(SHAPE, torch.uint8)
    assert second is not None
    assert second.data_ptr() != first.data_ptr()
    held_by_a_reader(pool, second)
    assert slots.take(SHAPE, torch.uint8) is None, "both are held: private memory, by value"
    assert slots.busy == 1
    pool.forget(1)  # the reader is gone: what it held comes back
    assert slots.take(SHAPE, torch.uint8) is not None


def test_a_batch_of_another_shape_takes_a_lease_anew(slots: Slots) -> None:
    first = slots.take(SHAPE, torch.uint8)
    slots.take(SHAPE, torch.uint8)
    bigger = slots.take((8, 2, 3), torch.uint8)
    assert bigger is not None
    assert bigger.shape == (2, 8, 2, 3)
    assert first is not None


def test_no_room_in_shared_memory_says_why(slots: Slots) -> None:
    pool = process_pool()
    limit, pool.limit = pool.limit, 1
    try:
        pool._evict(pool.bytes)
        assert slots.take(SHAPE, torch.float32) is None
        assert "shm_pool" in (slots.refusal or "")
        assert slots.busy == 0
    finally:
        pool.limit = limit
