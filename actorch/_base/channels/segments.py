"""Segments of shared memory: files of ``/dev/shm`` that the processes of one host map, pooled by their maker.

A segment is one file: a header of *lend slots*, then the data. Its maker
(the sender) copies a tensor into it, or the user wrote one there through a
:class:`~actorch._base.channels.leases.Lease`, and lends it to a receiver: it
writes a fresh generation number into a free slot's *lent* word and sends the
segment's name, the slot and the generation. The receiver maps the segment
(once: mappings are cached), writes the generation into the slot's
*received* word, and hands out a tensor over its bytes, no copy; when the
last tensor over them is freed, it writes the generation into the slot's
*released* word. A segment is free again when every slot's released word
matches its lent word, which only its maker reads: no message, no lock, and a
receiver whose event loop is busy still lets go. Lends not yet received are
bytes on their way to their receiver, counted against the send budget as the
transport's are; lends received and kept only stop more from going that way
once they pass a bound (the tensors then go by value).

A lend staged out of a GPU is filled chunk by chunk while its message
travels: the maker queues the copies, lends at once, and writes how many
chunks have landed into the slot's *landed* word (tagged with the
generation) as each one does; the receiver reads each chunk only once it is
counted there (``landing``). The maker reuses the segment only once every
chunk has landed, whatever its receiver did.

The maker reserves a segment's pages when it makes it (``posix_fallocate``):
a full ``/dev/shm`` is an error then, never a ``SIGBUS`` when the pages are
first written. Its :class:`SegmentPool` reuses free segments, makes new ones
up to its byte limit (evicting idle ones of other sizes first) and otherwise
says no, and the tensor goes by value. Segments lent to a node that is lost
are taken back (``reclaim``); the files of a lost node are removed by its
peers on the same host (``remove_files``), and a node removes its own when it
closes or its process exits.

One module past 600 lines, on purpose: the header's words, the segment that holds them, the pool that
reuses segments and the maps of other makers' segments are one protocol of shared words, read and
written from both sides; split, each half would restate the layout the other relies on.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import functools
import itertools
import os
import re
import secrets
import stat
import tempfile
import weakref
from collections import OrderedDict
from typing import Any

import torch

from actorch._base.errors import SerializationError

__all__ = [
    "HEADER",
    "SHM_DIR",
    "SLOTS",
    "Segment",
    "SegmentMaps",
    "SegmentPool",
    "host_identity",
    "process_prefix",
    "remove_files",
    "segment_size",
]

SHM_DIR = "/dev/shm"  # noqa: S108 - shared memory by name lives there on Linux
HEADER = 4096
"""Bytes before a segment's data: the magic and the lend slots (a page, so the data is page-aligned)."""

SLOTS = 62
"""Lends a segment can have out at once (a tensor sent to that many nodes of the host without a copy each)."""

_LENT, _RECEIVED, _RELEASED, _HANDED_BACK, _LANDED = 0, 1, 2, 3, 4  # the words of a slot, in order
_WORDS = 5

CHUNK_BITS = 24
"""Bits of a slot's *landed* word that count chunks; the rest hold the lend's generation."""

COPY_FAILED = (1 << CHUNK_BITS) - 1
"""The chunk count a *landed* word holds when the copy into the lend failed."""


MIN_SEGMENT = 64 << 10
"""The smallest segment's data: tensors that small ride inside the message anyway."""

MAX_SEGMENT = 1 << 44
"""The largest segment a receiver maps (16 TiB): a bound on what a malformed reference can ask for."""

_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every GPU of the process, not only the current one
_MAGIC = b"actorch\x02"  # 2: a slot has a landed word, the maker's pid namespace follows the magic
_NAMESPACE_AT = 8
_WORDS_AT = 16
_NAME = re.compile(r"actorch-[0-9]+-[0-9a-f]{8}-[0-9]+\Z")
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def host_identity() -> str | None:
    """What two processes share when they can map each other's segments: the boot, ``/dev/shm``, the user.

    None where there is no ``/dev/shm`` (another system): no segments then.
    Processes in containers with namespaces of their own differ here even on
    one machine; so do network namespaces that share a ``/dev/shm`` not (they
    do share it: limit the channels there, ``run(channels=...)``).
    """
    return _host_identity(os.getuid())


@functools.cache
def _host_identity(uid: int) -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        shm = os.stat(SHM_DIR)
    except OSError:
        return None
    temporary = os.stat(tempfile.gettempdir())  # torch's shared-memory manager, which the collector's users share
    return f"{boot_id}:{shm.st_dev}:{shm.st_ino}:{temporary.st_dev}:{temporary.st_ino}:{uid}"


@functools.cache
def _pid_namespace() -> int:
    """This process's pid namespace (its inode), 0 where the system does not say."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def process_prefix() -> str:
    """The prefix of this process's segment names (its pid and a random part): what its peers remove when it is lost."""
    return _prefix(os.getpid())


@functools.cache
def _prefix(pid: int) -> str:
    return f"actorch-{pid}-{secrets.token_hex(4)}"


def segment_size(nbytes: int) -> int:
    """The data size of a segment made for ``nbytes``: rounded up to an eighth of its power of two (25 % at most)."""
    if nbytes <= MIN_SEGMENT:
        return MIN_SEGMENT
    step = max(4096, 1 << (nbytes - 1).bit_length() >> 3)
    return -(-nbytes // step) * step


def remove_files(prefix: str) -> int:
    """Remove every segment file named with ``prefix`` (a lost node's); how many went. Mappings stay valid."""
    if not re.fullmatch(r"actorch-[0-9]+-[0-9a-f]{8}", prefix):
        return 0
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix + "-") and _NAME.match(name):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except OSError:
                pass  # another peer removed it first
    return removed


class Segment:
    """One file of shared memory mapped into this process: the lend slots, then ``size`` bytes of data."""

    __slots__ = (
        "__weakref__",
        "_copies",
        "_lends",
        "_map",
        "_words",
        "address",
        "data",
        "leased",
        "name",
        "owned",
        "pin_refused",
        "pinned",
        "size",
        "view",
    )

    def __init__(self, name: str, size: int, mapping: Any, *, owned: bool) -> None:
        self.name = name
        self.size = size
        self.owned = owned
        self._map = mapping
        self.view = memoryview(mapping)
        self._words = (ctypes.c_uint64 * (_WORDS * SLOTS)).from_buffer(mapping, _WORDS_AT)
        self.address = ctypes.addressof(self._words) - _WORDS_AT  # where the mapping starts in this process
        self._lends: dict[int, tuple[int, int]] = {}  # the maker's: slot -> (rank, generation) not seen back yet
        self._copies: dict[int, tuple[int, int]] = {}  # the maker's: slot -> (generation, chunks) not all landed
        self.leased = False  # the maker's: a user holds it as a Lease
        self.pinned = False  # registered with CUDA as pinned memory (copies to and from a GPU run at full speed)
        self.pin_refused = False  # CUDA refused to pin it (or is not there): not asked again
        self.data: torch.Tensor | None = None  # the maker's: its data as bytes, to copy tensors into

    def __repr__(self) -> str:
        return f"<Segment {self.name} {self.size:,} bytes lends={len(self._lends)} leased={self.leased}>"

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Make the segment file ``name`` with ``size`` bytes of data, its pages reserved now.

        Raises:
            OSError: The file cannot be made or its pages reserved (a full ``/dev/shm``).
        """
        path = os.path.join(SHM_DIR, name)
        descriptor = os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(descriptor, 0, HEADER + size)
                mapping = _mapped(descriptor, HEADER + size)
            except BaseException:
                os.unlink(path)
                raise
        finally:
            os.close(descriptor)
        mapping[: len(_MAGIC)] = _MAGIC
        ctypes.c_uint64.from_buffer(mapping, _NAMESPACE_AT).value = _pid_namespace()
        segment = cls(name, size, mapping, owned=True)
        segment.data = torch.frombuffer(segment.view[HEADER:], dtype=torch.uint8)
        return segment

    @classmethod
    def open(cls, name: Any, size: Any) -> Segment:
        """Map another process's segment ``name`` of ``size`` bytes of data.

        Raises:
            SerializationError: The name or size is malformed, or no such segment can be mapped.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise SerializationError(f"a tensor arrived in shared memory with a malformed segment name {name!r}")
        if not isinstance(size, int) or not 0 < size <= MAX_SEGMENT:
            raise SerializationError(f"a tensor arrived in shared memory segment {name} of a malformed size {size!r}")
        try:
            descriptor = os.open(os.path.join(SHM_DIR, name), _OPEN_FLAGS)
        except OSError as exc:
            raise SerializationError(f"shared memory segment {name} of a tensor cannot be opened: {exc}") from None
        try:
            found = os.fstat(descriptor)
            if not stat.S_ISREG(found.st_mode) or found.st_size != HEADER + size:
                raise SerializationError(
                    f"shared memory segment {name} holds {found.st_size:,} bytes, not the {HEADER + size:,} announced"
                )
            mapping = _mapped(descriptor, HEADER + size)
        except OSError as exc:
            raise SerializationError(f"shared memory segment {name} of a tensor cannot be mapped: {exc}") from None
        finally:
            os.close(descriptor)
        if mapping[: len(_MAGIC)] != _MAGIC:
            raise SerializationError(f"shared memory segment {name} is not one of actorch's")
        return cls(name, size, mapping, owned=False)

    def lend(self, rank: int, generation: int) -> int | None:
        """Lend the segment to node ``rank`` under ``generation`` (the maker's); the slot taken, or None: none free."""
        lends = self._lends
        for slot in range(SLOTS):
            if slot not in lends:
                self._words[_WORDS * slot + _LENT] = generation
                lends[slot] = (rank, generation)
                return slot
        return None

    def busy(self) -> bool:
        """Whether a lend is still out, or a copy into it still landing (the maker's): their words are read again."""
        copies = self._copies
        if copies:
            for slot, (generation, chunks) in list(copies.items()):
                landed = self.landed(slot, generation)
                if landed == chunks or landed < 0:
                    del copies[slot]
            if copies:
                return True
        lends = self._lends
        if not lends:
            return False
        words = self._words
        for slot, (_, generation) in list(lends.items()):
            at = _WORDS * slot
            if words[at + _RELEASED] == generation and words[at + _HANDED_BACK] != generation:
                del lends[slot]
        return bool(lends)

    def holds(self, slot: int, generation: int) -> bool:
        """Whether the lend ``generation`` in ``slot`` is still out (the maker's: not let go, not taken back)."""
        if self._lends.get(slot, (0, 0))[1] != generation:
            return False
        if self._words[_WORDS * slot + _RELEASED] == generation:
            del self._lends[slot]
            return False
        return True

    def arrived(self, slot: int, generation: int) -> bool:
        """Whether the lend ``generation`` in ``slot`` reached its receiver (or is over: let go, taken back)."""
        words = self._words
        return (
            self._lends.get(slot, (0, 0))[1] != generation
            or words[_WORDS * slot + _RECEIVED] == generation
            or words[_WORDS * slot + _RELEASED] == generation
        )

    def receive(self, slot: int, generation: int) -> None:
        """The receiver took the lend ``generation`` in ``slot``: it is no longer on its way."""
        self._words[_WORDS * slot + _RECEIVED] = generation

    def release(self, slot: int, generation: int) -> None:
        """The receiver let go of the lend ``generation`` in ``slot``: its maker may use the segment again."""
        self._words[_WORDS * slot + _RELEASED] = generation

    def hand_back(self, slot: int, generation: int) -> None:
        """The receiver of the lend ``generation`` in ``slot`` sends a tensor over it back to the maker, by reference.

        Until the maker takes it (:meth:`taken_back`), the segment stays busy,
        even if the receiver lets go of its own tensors in the meantime.
        """
        self._words[_WORDS * slot + _HANDED_BACK] = generation

    def taken_back(self, slot: int, generation: int) -> None:
        """The maker took what was handed back under ``generation`` in ``slot`` (or it was dropped)."""
        at = _WORDS * slot + _HANDED_BACK
        if self._words[at] == generation:
            self._words[at] = 0

    def copying(self, slot: int, generation: int, chunks: int) -> None:
        """The maker queued a copy of ``chunks`` chunks into the lend ``generation`` in ``slot``: none has landed yet.

        The segment stays busy until the last one lands (or the copy fails),
        even if its receiver lets go of the lend first.
        """
        self.land(slot, generation, 0)
        self._copies[slot] = (generation, chunks)

    def land(self, slot: int, generation: int, chunks: int) -> None:
        """``chunks`` chunks of the copy into the lend ``generation`` in ``slot`` have landed (the maker's watcher)."""
        self._words[_WORDS * slot + _LANDED] = (generation << CHUNK_BITS) | chunks

    def landed(self, slot: int, generation: int) -> int:
        """Chunks of the copy into the lend ``generation`` in ``slot`` that have landed; -1 if the copy failed."""
        word = self._words[_WORDS * slot + _LANDED]
        if word >> CHUNK_BITS != generation:
            return 0
        chunks = word & COPY_FAILED
        return -1 if chunks == COPY_FAILED else chunks

    def reclaim(self, rank: int) -> int:
        """Take back what was lent to node ``rank``, which is gone (the maker's); how many lends."""
        lends = self._lends
        gone = [slot for slot, (holder, _) in lends.items() if holder == rank]
        for slot in gone:
            del lends[slot]
            self._words[_WORDS * slot + _HANDED_BACK] = 0  # what it handed back and never arrived
        return len(gone)

    def maker(self) -> int | None:
        """The pid of the process that made the segment, as this process sees it (its name holds it).

        None where this process cannot see it: the maker runs in another pid
        namespace (a container sharing the host's ``/dev/shm``), or the name holds no pid.
        """
        parts = self.name.split("-")
        if len(parts) < 3 or not parts[1].isdigit():
            return None
        if ctypes.c_uint64.from_buffer(self._map, _NAMESPACE_AT).value != _pid_namespace():
            return None
        return int(parts[1])

    def pin(self) -> bool:
        """Register the mapping with CUDA as pinned memory (once), so copies to and from a GPU run at full speed.

        The maker pins what it stages into; a receiver what it copies to its
        GPU from. False where CUDA refuses (or is not there), and it is not
        asked again: copies still work, pageable, and without overlap.
        """
        if not self.pinned and not self.pin_refused:
            try:
                error = torch.cuda.cudart().cudaHostRegister(self.address, HEADER + self.size, _PORTABLE)  # type: ignore[no-untyped-call]
            except (AttributeError, RuntimeError, AssertionError):
                error = -1
            self.pinned = int(error) == 0
            self.pin_refused = not self.pinned
        return self.pinned

    def unpin(self) -> None:
        """Undo :meth:`pin` before the mapping goes."""
        if self.pinned:
            self.pinned = False
            with contextlib.suppress(AttributeError, RuntimeError, AssertionError):
                torch.cuda.cudart().cudaHostUnregister(self.address)  # type: ignore[no-untyped-call]

    def unlink(self) -> None:
        """Remove the segment's file (the maker's); mappings, this one and receivers', stay valid."""
        with contextlib.suppress(OSError):  # already gone (a peer removed a lost node's files)
            os.unlink(os.path.join(SHM_DIR, self.name))


def _mapped(descriptor: int, length: int) -> Any:
    import mmap  # noqa: PLC0415 - only processes that use shared memory need it

    return mmap.mmap(descriptor, length)


class SegmentPool:
    """The segments a process makes, reused for the tensors it sends and the leases it gives; bounded in bytes.

    ``limit`` bounds the bytes of data of every segment it keeps, leased ones
    included. When no free segment fits and a new one would pass the limit
    (after idle segments were removed), or ``/dev/shm`` has no room,
    :meth:`place` and :meth:`lease` say no and the counts say why.
    """

    def __init__(self, limit: int, prefix: str | None = None) -> None:
        self.limit = limit
        self.prefix = prefix or process_prefix()
        self._segments: OrderedDict[str, Segment] = OrderedDict()  # by last use, least recent first
        self._leased: dict[int, Segment] = {}  # by the address of its data
        self._names = itertools.count(1)
        self._generations = itertools.count(1)
        self._out: dict[int, collections.deque[tuple[Segment, int, int, int]]] = {}  # lends by receiver, oldest first
        self._out_bytes: dict[int, int] = {}
        self._on_way: dict[int, collections.deque[tuple[Segment, int, int, int]]] = {}  # not received yet
        self._on_way_bytes: dict[int, int] = {}
        self.bytes = 0
        self.full = 0
        """Times a segment was wanted and the limit left no room (the tensor went by value)."""
        self.refused = 0
        """Times ``/dev/shm`` refused a segment (full, or no such directory): the tensor went by value."""
        self.refusal: str | None = None
        """Why ``/dev/shm`` last refused one."""
        self.closed = False
        _live_pools.add(self)

    def __repr__(self) -> str:
        return f"<SegmentPool {self.prefix} {len(self._segments)} segments {self.bytes:,}/{self.limit:,} bytes>"

    def place(self, nbytes: int, rank: int) -> tuple[Segment, int, int] | None:
        """A free segment of at least ``nbytes``, lent to node ``rank``: the segment, slot and generation; or None."""
        segment = self._free(nbytes) or self._made(nbytes)
        if segment is None:
            return None
        return self.lend(segment, rank, nbytes)

    def lend(self, segment: Segment, rank: int, nbytes: int) -> tuple[Segment, int, int] | None:
        """Lend ``nbytes`` of ``segment`` (one of this pool's) to node ``rank``; None if every slot of it is out."""
        generation = next(self._generations)
        slot = segment.lend(rank, generation)
        if slot is None:
            return None
        self._segments.move_to_end(segment.name)
        lend = (segment, slot, generation, nbytes)
        for queues, totals in ((self._out, self._out_bytes), (self._on_way, self._on_way_bytes)):
            queue = queues.get(rank)
            if queue is None:
                queue = queues[rank] = collections.deque()
            queue.append(lend)
            totals[rank] = totals.get(rank, 0) + nbytes
        return segment, slot, generation

    def hold(self, segment: Segment) -> tuple[int, int] | None:
        """Lend ``segment`` to this process itself (its slot and generation), uncounted: kept until released."""
        generation = next(self._generations)
        slot = segment.lend(-1, generation)
        return None if slot is None else (slot, generation)

    def lent_to(self, rank: int) -> int:
        """Bytes lent to node ``rank`` that it has not let go of (counted from the oldest lend: at least this many)."""
        out = self._out.get(rank)
        if not out:
            return 0
        while out:
            segment, slot, generation, nbytes = out[0]
            if segment.holds(slot, generation):
                break
            out.popleft()
            self._out_bytes[rank] -= nbytes
        return self._out_bytes[rank]

    def on_way_to(self, rank: int) -> int:
        """Bytes lent to node ``rank`` that it has not received yet (counted from the oldest: at least this many)."""
        queue = self._on_way.get(rank)
        if not queue:
            return 0
        while queue:
            segment, slot, generation, nbytes = queue[0]
            if not segment.arrived(slot, generation):
                break
            queue.popleft()
            self._on_way_bytes[rank] -= nbytes
        return self._on_way_bytes[rank]

    def lease(self, nbytes: int) -> Segment | None:
        """A segment of at least ``nbytes`` that the pool will not use until :meth:`end_lease`; None: no room."""
        segment = self._free(nbytes) or self._made(nbytes)
        if segment is None:
            return None
        segment.leased = True
        assert segment.data is not None
        self._leased[segment.data.data_ptr()] = segment
        return segment

    def end_lease(self, segment: Segment) -> None:
        """``segment``'s lease ended: it is the pool's again (once its lends are back), or removed if closed."""
        if segment.data is not None:
            self._leased.pop(segment.data.data_ptr(), None)
        segment.leased = False
        if self.closed:
            segment.unlink()

    def segment(self, name: str) -> Segment | None:
        """This pool's segment ``name``, if it has one of that name."""
        return self._segments.get(name) if isinstance(name, str) else None

    def leased_at(self, address: int) -> Segment | None:
        """The leased segment whose data starts at ``address`` (a tensor's storage's), if any."""
        return self._leased.get(address) if self._leased else None

    def forget(self, rank: int) -> int:
        """Take back every lend out to node ``rank``, which is gone; how many."""
        for table in (self._out, self._out_bytes, self._on_way, self._on_way_bytes):
            table.pop(rank, None)
        return sum(segment.reclaim(rank) for segment in self._segments.values())

    def close(self) -> None:
        """Remove every segment's file: receivers' mappings (and tensors over them) stay valid until they let go."""
        self.closed = True
        for segment in self._segments.values():
            segment.unpin()
            segment.unlink()
        self._segments.clear()
        self.bytes = 0
        _live_pools.discard(self)

    def statistics(self) -> dict[str, int]:
        """Segments kept, their bytes, the limit, those out on lend or leased, and the times a tensor went by value."""
        segments = list(self._segments.values())
        return {
            "segments": len(segments),
            "segment_bytes": self.bytes,
            "limit": self.limit,
            "lent": sum(segment.busy() for segment in segments),
            "leased": sum(segment.leased for segment in segments),
            "pool_full": self.full,
            "shm_refused": self.refused,
        }

    def _free(self, nbytes: int) -> Segment | None:
        largest = max(2 * nbytes, MIN_SEGMENT)
        for segment in self._segments.values():
            if nbytes <= segment.size <= largest and not segment.leased and not segment.busy():
                return segment
        return None

    def _made(self, nbytes: int) -> Segment | None:
        if self.closed:
            return None
        size = segment_size(nbytes)
        if self.bytes + size > self.limit:
            self._evict(self.bytes + size - self.limit)
            if self.bytes + size > self.limit:
                self.full += 1
                return None
        name = f"{self.prefix}-{next(self._names)}"
        try:
            segment = Segment.create(name, size)
        except OSError as exc:
            self.refused += 1
            self.refusal = f"{SHM_DIR} refused a segment of {size:,} bytes: {exc}"
            return None
        self._segments[name] = segment
        self.bytes += size
        return segment

    def _evict(self, wanted: int) -> None:
        """Remove idle segments, least recently used first, until ``wanted`` bytes were freed or none is idle."""
        for segment in list(self._segments.values()):
            if wanted <= 0:
                return
            if segment.leased or segment.busy():
                continue
            del self._segments[segment.name]
            segment.unpin()
            segment.unlink()
            self.bytes -= segment.size
            wanted -= segment.size


_live_pools: weakref.WeakSet[SegmentPool] = weakref.WeakSet()


@atexit.register
def _remove_at_exit() -> None:
    """A process that exits without closing its pools removes their files (a killed one's peers do)."""
    for pool in list(_live_pools):
        pool.close()


class SegmentMaps:
    """The segments a receiver has mapped, by name (the most recently used ``keep``), and the lends it holds.

    A lend's bytes are one ``memoryview``, the same for every tensor made over
    them (a message decoded twice shares it), whose release is written into
    the segment when the last of those tensors is freed.
    """

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._maps: OrderedDict[str, Segment] = OrderedDict()
        self._held: weakref.WeakValueDictionary[tuple[str, int, int], memoryview] = weakref.WeakValueDictionary()
        self._addresses: dict[int, tuple[Segment, int, int, int]] = {}  # a held lend's first byte: what it is
        self.mapped = 0
        """Segments mapped (each costs a system call and a page-table walk; a cached one costs nothing)."""

    def __repr__(self) -> str:
        return f"<SegmentMaps {len(self._maps)} of at most {self.keep}, {len(self._held)} lends held>"

    def held(self, name: Any, size: Any, offset: Any, extent: Any, slot: Any, generation: Any) -> memoryview:
        """The ``extent`` bytes at ``offset`` of segment ``name``, lent under ``slot`` and ``generation``.

        Raises:
            SerializationError: The reference is malformed or the segment cannot be mapped.
        """
        key = (name, slot, generation)
        try:
            found = self._held.get(key)
        except TypeError:  # an unhashable part
            found = None
        if found is not None:
            return found
        if not all(isinstance(number, int) for number in (offset, extent, slot, generation)) or not (
            offset >= 0 and extent > 0 and 0 <= slot < SLOTS and isinstance(size, int) and offset + extent <= size
        ):
            raise SerializationError(
                f"a tensor arrived in shared memory segment {name!r} with a malformed place "
                f"(offset {offset!r}, {extent!r} bytes of {size!r}, slot {slot!r})"
            )
        segment = self.segment(name, size)
        lent = segment.view[HEADER + offset : HEADER + offset + extent]
        segment.receive(slot, generation)
        address = segment.address + HEADER + offset
        self._addresses[address] = (segment, slot, generation, offset)
        weakref.finalize(lent, self._let_go_held, address, segment, slot, generation)
        self._held[key] = lent
        return lent

    def held_at(self, address: int) -> tuple[Segment, int, int, int] | None:
        """The held lend whose bytes start at ``address`` (a received tensor's storage's), and where it lies."""
        return self._addresses.get(address) if self._addresses else None

    def _let_go_held(self, address: int, segment: Segment, slot: int, generation: int) -> None:
        self._addresses.pop(address, None)
        segment.release(slot, generation)

    def let_go(self, name: Any, size: Any, slot: Any, generation: Any) -> None:
        """Let go of a lend that will never be read (its message was dropped), unless a tensor holds it.

        Raises:
            SerializationError: The reference is malformed or the segment cannot be mapped.
        """
        if not isinstance(slot, int) or not 0 <= slot < SLOTS or not isinstance(generation, int):
            raise SerializationError(f"a shared-memory lend of {name!r} names a malformed slot {slot!r}")
        if self._held.get((name, slot, generation)) is None:
            segment = self.segment(name, size)
            segment.receive(slot, generation)
            segment.release(slot, generation)

    def let_go_hand_back(self, name: Any, size: Any, slot: Any, generation: Any) -> None:
        """A hand-back of the lend ``generation`` in ``slot`` of ``name`` was never sent: its maker need not wait.

        Raises:
            SerializationError: The reference is malformed or the segment cannot be mapped.
        """
        if not isinstance(slot, int) or not 0 <= slot < SLOTS or not isinstance(generation, int):
            raise SerializationError(f"a shared-memory lend of {name!r} names a malformed slot {slot!r}")
        self.segment(name, size).taken_back(slot, generation)

    def forget(self, prefix: str) -> None:
        """Drop the cached mappings of a lost node's segments (tensors over them keep theirs)."""
        for name in [name for name in self._maps if name.startswith(prefix + "-")]:
            self._maps.pop(name).unpin()

    def clear(self) -> None:
        """Drop every cached mapping (unpinned first: tensors over them keep their bytes, pageable)."""
        for segment in self._maps.values():
            segment.unpin()
        self._maps.clear()

    def segment(self, name: Any, size: Any) -> Segment:
        """The mapping of segment ``name`` of ``size`` bytes (cached: the most recently used ``keep``).

        Raises:
            SerializationError: The name or size is malformed, or no such segment can be mapped.
        """
        segment = self._maps.get(name)
        if segment is not None and segment.size == size:
            self._maps.move_to_end(name)
            return segment
        segment = Segment.open(name, size)
        self.mapped += 1
        self._maps[name] = segment
        while len(self._maps) > self.keep:
            self._maps.popitem(last=False)[1].unpin()
        return segment
