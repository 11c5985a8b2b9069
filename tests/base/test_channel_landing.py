"""Staged copies on one host that land chunk by chunk while their message travels.

Two nodes of one host, played by two codecs of this process (as in
``test_channel_shm``), with the fake accelerator of ``mp_scripts/fake_gpus.py``:
``meta`` tensors stand for GPU tensors, its copies into a segment land on a
thread of their own one chunk at a time (a host copy full of 7s) once its
gate is open, and a move to a device adds 100.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import torch
from fake_gpus import MOVED, STAGED, FakeAccelerator, installed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensor_cases import bits, dense

from actorch._base.channels import landing
from actorch._base.channels.landing import CHUNK, Landing, Landings, chunk_for
from actorch._base.channels.plane import DataPlane
from actorch._base.channels.route import TensorRoute
from actorch._base.channels.segments import COPY_FAILED, Segment, SegmentPool, host_identity
from actorch._base.channels.shm import REACH_KEY, SEGMENTS_KEY, SharedMemoryChannel, dense_strides, extent_of
from actorch._base.codec import Codec
from actorch._base.devices import Accelerator
from actorch._base.errors import SerializationError

pytestmark = pytest.mark.skipif(host_identity() is None, reason="no /dev/shm on this machine")

KIB = 1 << 10
CUDA = torch.device("cuda", 0)


class Side:
    """One node of the pair: its pool, its codec, and the route toward the other."""

    def __init__(self, rank: int, tag: str, pid: int | None = None) -> None:
        self.rank = rank
        self.pool = SegmentPool(64 << 20, prefix=f"actorch-{pid or os.getpid()}-{tag * 8}")
        self.shm = SharedMemoryChannel(self.pool)
        self.codec = Codec(plane=DataPlane.standard(("shm", "staged"), shm=self.shm))

    def send(self, other: Side, value: Any) -> tuple[bytes, list[Any]]:
        reach = {REACH_KEY: host_identity() or "", SEGMENTS_KEY: other.pool.prefix}
        return self.codec.encode(value, route=TensorRoute(other.rank, reach=reach))

    def staged(self) -> int:
        return self.codec.plane.statistics()["staged"]["through_shared_memory"]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAccelerator]:
    monkeypatch.setattr(landing, "CHUNK", 64 * KIB)  # a 256 KiB tensor lands in 4 chunks
    with installed(FakeAccelerator()) as accelerator:
        yield accelerator


@pytest.fixture
def pair(fake: FakeAccelerator) -> Iterator[tuple[Side, Side]]:
    a, b = Side(0, "a"), Side(1, "b")
    yield a, b
    fake.gate.set()
    a.shm.close()
    b.shm.close()


def meta(elements: int) -> torch.Tensor:
    return torch.empty(elements, device="meta")


def receive_in_thread(side: Side, message: tuple[bytes, list[Any]], device: torch.device | None) -> dict[str, Any]:
    """Decode ``message`` on a thread of its own (the receiver's event loop); what it got or raised, once done."""
    outcome: dict[str, Any] = {}

    def decode() -> None:
        try:
            outcome["value"] = side.codec.decode(*message, device=device)
        except SerializationError as exc:
            outcome["error"] = exc

    outcome["thread"] = thread = threading.Thread(target=decode, daemon=True)
    thread.start()
    return outcome


def test_the_message_leaves_before_its_copy_lands_and_the_receiver_reads_each_chunk_once_landed(
    pair: tuple[Side, Side], fake: FakeAccelerator
) -> None:
    a, b = pair
    fake.gate.clear()  # the sender's GPU has copied nothing yet
    message = a.send(b, [meta(64 * KIB)])  # 256 KiB: four chunks
    assert message[1] == [], "it goes by a segment, not the transport"
    assert fake.synced == ["meta"], "the sender waited for the work queued before the copy, once"
    assert fake.chunks_landed == 0, "the message left with its copy still queued"
    outcome = receive_in_thread(b, message, CUDA)
    time.sleep(0.2)
    assert fake.chunks_read == [], "the receiver reads no chunk before it lands"
    fake.delay = 0.02
    fake.gate.set()
    outcome["thread"].join(10)
    [arrived] = outcome["value"]
    assert arrived.tolist() == [STAGED + MOVED] * (64 * KIB)
    assert fake.chunks_read == [0, 1, 2, 3]
    assert a.staged() == 1


def test_a_receiver_without_a_device_gets_the_host_copy_once_every_chunk_landed(
    pair: tuple[Side, Side], fake: FakeAccelerator
) -> None:
    a, b = pair
    fake.delay = 0.01
    [arrived] = b.codec.decode(*a.send(b, [meta(64 * KIB)]))
    assert fake.chunks_landed == 4
    assert arrived.device.type == "cpu"
    assert arrived.tolist() == [STAGED] * (64 * KIB)


def test_the_senders_segment_is_not_reused_before_its_copy_lands_even_if_the_message_is_dropped(
    pair: tuple[Side, Side], fake: FakeAccelerator
) -> None:
    a, b = pair
    fake.gate.clear()
    body, _ = a.send(b, [meta(64 * KIB)])
    b.codec.drop(body)  # the receiver let go of the lend unread, with the copy still landing
    a.send(b, [meta(64 * KIB)])
    assert a.pool.statistics()["segments"] == 2, "the first segment is still being written: a second one"
    fake.gate.set()
    assert a.shm.landings.close()
    gc.collect()
    assert a.pool.statistics()["lent"] == 1, "the first is free again once landed; the second is still lent"


def test_a_copy_that_fails_on_the_senders_gpu_is_refused_by_the_receiver(
    pair: tuple[Side, Side], fake: FakeAccelerator
) -> None:
    a, b = pair
    fake.fail_at = 2
    fake.delay = 0.02
    with pytest.raises(SerializationError, match="copy out of the sender's GPU failed"):
        b.codec.decode(*a.send(b, [meta(64 * KIB)]), device=CUDA)
    assert fake.chunks_read in ([], [0], [0, 1]), "nothing past the failed chunk is read"
    assert a.shm.landings.failed == 1
    assert a.codec.plane.statistics()["shm"]["staged_copies_failed"] == 1
    gc.collect()
    assert a.pool.statistics()["lent"] == 0, "the failed lend is let go: its segment is free"


def test_a_copy_that_stops_landing_is_refused_after_the_stall_bound(
    pair: tuple[Side, Side], fake: FakeAccelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    monkeypatch.setattr(landing, "STALL", 0.3)
    fake.gate.clear()  # a sender that died with its copy queued
    started = time.monotonic()
    with pytest.raises(SerializationError, match=r"stopped at chunk 0 of 4 for 0.3 s"):
        b.codec.decode(*a.send(b, [meta(64 * KIB)]), device=CUDA)
    assert 0.3 <= time.monotonic() - started < 5


def test_a_copy_whose_sender_process_is_gone_is_refused_at_once(
    fake: FakeAccelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # a process of this host that is gone
    dead.wait()
    a, b = Side(0, "9", pid=dead.pid), Side(1, "8")  # a's segments are named as the dead process's
    monkeypatch.setattr(landing, "STALL", 30.0)
    fake.gate.clear()  # it died with its copy queued
    try:
        started = time.monotonic()
        with pytest.raises(
            SerializationError, match=rf"stopped at chunk 0 of 4: the sender's process {dead.pid} is gone"
        ):
            b.codec.decode(*a.send(b, [meta(64 * KIB)]), device=CUDA)
        assert time.monotonic() - started < 2, "refused at once, not after the stall bound"
    finally:
        fake.gate.set()
        a.shm.close()
        b.shm.close()


def test_a_segment_names_its_maker_only_to_processes_of_its_pid_namespace() -> None:
    segment = Segment.create(f"actorch-{os.getpid()}-{'7' * 8}-1", 64 * KIB)
    try:
        assert segment.maker() == os.getpid()
        seen = Segment.open(segment.name, segment.size)  # as a receiver maps it
        assert seen.maker() == os.getpid()
        segment.view[8:16] = (12345).to_bytes(8, "little")  # made in another pid namespace (a container)
        assert seen.maker() is None, "a pid of another namespace says nothing here"
    finally:
        segment.unlink()


def test_malformed_staged_references_are_refused(pair: tuple[Side, Side], fake: FakeAccelerator) -> None:
    a, b = pair
    good = a.shm.staged(meta(64 * KIB), 1)
    assert good is not None
    reference, chunk, chunks = good
    for payload in ([reference, chunk], [reference, chunk, chunks + 1], [reference, 0, chunks], "x", [[1], 2, 3]):
        with pytest.raises(SerializationError, match="staged tensor"):
            b.shm.arriving(payload, pin=False)


def test_close_waits_for_copies_still_landing(fake: FakeAccelerator) -> None:
    side = Side(2, "c")
    fake.gate.clear()
    assert side.shm.staged(meta(64 * KIB), 3) is not None
    assert not side.shm.landings.close(timeout=0.2), "a copy still landing: close says so"
    fake.gate.set()
    side.shm.close()
    assert side.pool.closed


def test_a_landed_word_belongs_to_its_generation(tmp_path: Any) -> None:
    pool = SegmentPool(1 << 20, prefix=f"actorch-{os.getpid()}-{'d' * 8}")
    try:
        placed = pool.place(4096, 1)
        assert placed is not None
        segment, slot, generation = placed
        segment.copying(slot, generation, 2)
        assert segment.busy()
        segment.land(slot, generation, 1)
        assert (segment.landed(slot, generation), segment.landed(slot, generation + 1)) == (1, 0)
        waiting = Landing(segment, slot, generation, 2)
        waiting.wait(0)  # landed: returns at once
        segment.land(slot, generation, COPY_FAILED)
        assert segment.landed(slot, generation) == -1
        with pytest.raises(SerializationError, match="failed"):
            waiting.wait(1)
        segment.receive(slot, generation)
        segment.release(slot, generation)
        assert not segment.busy(), "a failed copy lands no more: the segment is free"
    finally:
        pool.close()


def test_landings_mark_each_chunk_and_a_failed_event_marks_the_lend_failed() -> None:
    class Event:
        def __init__(self, fails: bool = False) -> None:
            self.fails = fails

        def synchronize(self) -> None:
            if self.fails:
                raise RuntimeError("CUDA error (pretend)")

    pool = SegmentPool(1 << 20, prefix=f"actorch-{os.getpid()}-{'e' * 8}")
    try:
        first, second = pool.place(4096, 1), pool.place(4096, 1)
        assert first is not None
        assert second is not None
        watcher = Landings()
        watcher.watch(first[0], first[1], first[2], [Event(), Event(), Event()])
        watcher.watch(second[0], second[1], second[2], [Event(), Event(fails=True), Event()])
        assert watcher.close()
        assert first[0].landed(first[1], first[2]) == 3
        assert second[0].landed(second[1], second[2]) == -1
        assert (watcher.watched, watcher.failed) == (2, 1)
    finally:
        pool.close()


def test_a_chunk_is_larger_only_where_a_copy_would_take_too_many() -> None:
    assert chunk_for(1) == CHUNK
    assert chunk_for(100 * CHUNK) == CHUNK
    huge = CHUNK * COPY_FAILED * 3
    assert -(-huge // chunk_for(huge)) < COPY_FAILED


def test_a_segment_that_cuda_will_not_pin_is_not_asked_again() -> None:
    segment = Segment.create(f"actorch-{os.getpid()}-{'f' * 8}-1", 64 * KIB)
    try:
        assert segment.pin() is torch.cuda.is_available()
        assert segment.pin_refused is not torch.cuda.is_available()
    finally:
        segment.unpin()
        segment.unlink()


class _Stream:
    def synchronize(self) -> None:
        pass


class _Event:
    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(tensor=dense().filter(lambda tensor: tensor.numel() > 0), chunk=st.sampled_from([7, 256, 4096, 1 << 20]))
def test_the_cuda_accelerators_chunked_copies_keep_every_byte_and_layout(tensor: torch.Tensor, chunk: int) -> None:
    """The real accelerator's chunked copies out and in, on CPU tensors (CUDA's streams and events stood in for)."""
    strides = dense_strides(tensor)
    extent = extent_of(tensor.shape, strides, tensor.element_size())
    target = torch.empty(extent, dtype=torch.uint8)
    ready: list[int] = []
    with (
        mock.patch.object(torch.cuda, "current_stream", return_value=_Stream()),
        mock.patch.object(torch.cuda, "Event", _Event),
    ):
        events = Accelerator().copy_in_chunks(tensor.detach(), target, strides, chunk)
        host = target.view(tensor.dtype).as_strided(tensor.shape, strides, 0)
        arrived = Accelerator().to_device_in_chunks(host, target, torch.device("cpu"), chunk, ready.append)
    assert len(events) == -(-extent // chunk)
    assert ready == list(range(len(events))), "each chunk is asked for once, in order"
    assert bits(host) == bits(tensor), "the host copy holds the tensor's values in its dense layout"
    assert bits(arrived) == bits(tensor)
    assert list(arrived.stride()) == strides
