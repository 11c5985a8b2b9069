"""Segments of shared memory: made with their pages reserved, pooled, lent and let go, reclaimed, removed."""

from __future__ import annotations

import errno
import gc
import os
from collections.abc import Iterator

import pytest

from actorch import SerializationError
from actorch._base.channels import segments
from actorch._base.channels.segments import (
    HEADER,
    MIN_SEGMENT,
    SHM_DIR,
    SLOTS,
    Segment,
    SegmentMaps,
    SegmentPool,
    remove_files,
    segment_size,
)

pytestmark = pytest.mark.skipif(segments.host_identity() is None, reason="no /dev/shm on this machine")

MIB = 1 << 20


@pytest.fixture
def pool() -> Iterator[SegmentPool]:
    made = SegmentPool(64 * MIB, prefix=f"actorch-{os.getpid()}-0000{os.getpid() % 10000:04x}")
    yield made
    made.close()


def files(prefix: str) -> list[str]:
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefix + "-"))


def test_segment_sizes_round_up_by_an_eighth_of_their_power_of_two() -> None:
    assert segment_size(1) == MIN_SEGMENT
    assert segment_size(MIN_SEGMENT + 1) == MIN_SEGMENT + (MIN_SEGMENT * 2 >> 3)
    assert segment_size(64 * MIB) == 64 * MIB
    assert segment_size(64 * MIB + 1) == 64 * MIB + 16 * MIB
    for nbytes in (100_000, 3_000_000, 123_456_789):
        assert nbytes <= segment_size(nbytes) <= nbytes * 1.25


def test_a_pool_reuses_a_segment_once_its_receiver_lets_go(pool: SegmentPool) -> None:
    first, slot, generation = pool.place(MIB, rank=1) or pytest.fail("no segment")
    assert files(pool.prefix) == [first.name]
    assert first.busy()
    second, _, _ = pool.place(MIB, rank=1) or pytest.fail("no segment")
    assert second is not first, "a lent segment is not handed out again"
    first.release(slot, generation)  # what a receiver writes when its last tensor over it is freed
    again, _, _ = pool.place(MIB, rank=2) or pytest.fail("no segment")
    assert again is first
    assert pool.statistics()["segments"] == 2


def test_a_pool_at_its_limit_evicts_idle_segments_then_says_no(pool: SegmentPool) -> None:
    placed = [pool.place(16 * MIB, rank=1) for _ in range(4)]
    assert all(placed)
    assert pool.place(16 * MIB, rank=1) is None, "64 MiB are lent: no room"
    assert pool.full == 1
    segment, slot, generation = placed[0] or pytest.fail("no segment")
    segment.release(slot, generation)
    bigger = pool.place(40 * MIB, rank=1)  # the idle 16 MiB segment is removed to make room... not enough
    assert bigger is None
    assert pool.place(16 * MIB, rank=1) is not None, "the idle one is reused"


def test_a_full_dev_shm_is_a_refusal_counted_never_a_crash(pool: SegmentPool, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_room(descriptor: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    assert pool.place(MIB, rank=1) is None
    assert pool.refused == 1
    assert "No space left on device" in (pool.refusal or "")
    assert files(pool.prefix) == [], "the half-made file is removed"


def test_lends_on_their_way_count_until_received_and_lent_bytes_until_let_go(pool: SegmentPool) -> None:
    segment, slot, generation = pool.place(MIB, rank=3) or pytest.fail("no segment")
    assert pool.on_way_to(3) == MIB
    assert pool.lent_to(3) == MIB
    segment.receive(slot, generation)
    assert pool.on_way_to(3) == 0, "received: no longer on its way"
    assert pool.lent_to(3) == MIB, "but still held"
    segment.release(slot, generation)
    assert pool.lent_to(3) == 0


def test_lends_to_a_lost_node_are_taken_back(pool: SegmentPool) -> None:
    lost, _, _ = pool.place(MIB, rank=4) or pytest.fail("no segment")
    kept, _, _ = pool.place(MIB, rank=5) or pytest.fail("no segment")
    assert pool.forget(4) == 1
    assert not lost.busy()
    assert kept.busy()
    assert pool.on_way_to(4) == pool.lent_to(4) == 0


def test_a_segment_lends_to_as_many_nodes_as_it_has_slots() -> None:
    pool = SegmentPool(8 * MIB, prefix=f"actorch-{os.getpid()}-0000aaaa")
    try:
        segment, _, _ = pool.place(MIB, rank=0) or pytest.fail("no segment")
        for rank in range(1, SLOTS):
            assert pool.lend(segment, rank, MIB) is not None
        assert pool.lend(segment, SLOTS, MIB) is None
    finally:
        pool.close()


def test_closing_a_pool_removes_its_files_while_mappings_stay_valid(pool: SegmentPool) -> None:
    segment, slot, generation = pool.place(MIB, rank=1) or pytest.fail("no segment")
    assert segment.data is not None
    segment.data[:4].fill_(7)
    maps = SegmentMaps()
    held = maps.held(segment.name, segment.size, 0, 4, slot, generation)
    pool.close()
    assert files(pool.prefix) == []
    assert bytes(held) == b"\x07" * 4


def test_a_receiver_maps_a_segment_once_and_lets_go_when_its_view_is_freed(pool: SegmentPool) -> None:
    segment, slot, generation = pool.place(MIB, rank=1) or pytest.fail("no segment")
    maps = SegmentMaps()
    first = maps.held(segment.name, segment.size, 0, 1024, slot, generation)
    again = maps.held(segment.name, segment.size, 0, 1024, slot, generation)
    assert first is again, "a message decoded twice shares one lend"
    other = pool.lend(segment, 2, 1024) or pytest.fail("no slot")
    maps.held(segment.name, segment.size, 0, 1024, other[1], other[2])
    assert maps.mapped == 1
    assert pool.on_way_to(1) == 0
    del first, again
    gc.collect()
    assert not segment.holds(slot, generation)


@pytest.mark.parametrize(
    ("name", "size", "offset", "extent", "slot", "why"),
    [
        ("../../etc/passwd", MIB, 0, 4, 0, "malformed segment name"),
        ("actorch-1-00000000-1", MIB, 0, 4, 0, "cannot be opened"),
        (None, MIB, 0, 4, 0, "malformed segment name"),
        ("actorch-1-00000000-1", -1, 0, 4, 0, "malformed place"),
        ("actorch-1-00000000-1", 1 << 50, 0, 4, 0, "malformed size"),
        ("actorch-1-00000000-1", MIB, MIB, 4, 0, "malformed place"),
        ("actorch-1-00000000-1", MIB, 0, 0, 0, "malformed place"),
        ("actorch-1-00000000-1", MIB, 0, 4, SLOTS, "malformed place"),
        ("actorch-1-00000000-1", MIB, "0", 4, 0, "malformed place"),
    ],
)
def test_a_malformed_reference_is_a_serialization_error(
    name: object, size: object, offset: object, extent: object, slot: object, why: str
) -> None:
    with pytest.raises(SerializationError, match=why):
        SegmentMaps().held(name, size, offset, extent, slot, 1)


def test_a_segment_of_another_size_or_not_ours_is_refused(pool: SegmentPool) -> None:
    segment, _, _ = pool.place(MIB, rank=1) or pytest.fail("no segment")
    with pytest.raises(SerializationError, match="not the"):
        Segment.open(segment.name, segment.size + 4096)
    stranger = os.path.join(SHM_DIR, f"{pool.prefix}-999")
    with open(stranger, "wb") as handle:
        handle.write(b"\0" * (HEADER + MIN_SEGMENT))
    try:
        with pytest.raises(SerializationError, match="not one of actorch's"):
            Segment.open(f"{pool.prefix}-999", MIN_SEGMENT)
    finally:
        os.unlink(stranger)


def test_a_lost_nodes_files_are_removed_by_prefix_and_only_its_own(pool: SegmentPool) -> None:
    pool.place(MIB, rank=1)
    pool.place(MIB, rank=1)
    assert len(files(pool.prefix)) == 2
    assert remove_files("actorch-1-zz") == 0, "a malformed prefix removes nothing"
    assert remove_files(pool.prefix) == 2
    assert files(pool.prefix) == []


def test_a_hand_back_keeps_the_segment_busy_until_its_maker_takes_it(pool: SegmentPool) -> None:
    segment, slot, generation = pool.place(MIB, rank=1) or pytest.fail("no segment")
    segment.hand_back(slot, generation)  # the receiver sends a tensor over it back to its maker
    segment.release(slot, generation)  # and lets go of its own
    assert segment.busy(), "the maker has not taken it yet"
    segment.taken_back(slot, generation)
    assert not segment.busy()
