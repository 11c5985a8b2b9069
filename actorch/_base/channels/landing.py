"""Copies out of a GPU that land in a segment chunk by chunk, while their message travels.

A tensor staged through shared memory on one host is not waited for before
its message leaves: the sender queues its copy to the segment in chunks, one
CUDA event after each, and lends the segment at once. :class:`Landings`, one
thread per process, waits for those events in order and writes each landed
chunk into the lend's *landed* word; the receiver's :class:`Landing` reads a
chunk (copying it to its own GPU) only once it is counted there. So the
device-to-host copy overlaps the message's trip and the receiver's
host-to-device copy, and the sender's event loop does not wait for the copy.

The sender still waits, before it queues the copy, for the work already
queued on the tensor's stream (as it always did): a receiver waits only for
the copy itself (4 MiB a chunk: well under a millisecond each), never for
the sender's training step. A copy that fails marks its lend failed; one
whose sender process is gone (the segment's maker, where this process can
see it: same pid namespace) is refused at once; one that stops landing for
:data:`STALL` seconds (a stopped sender, a hung GPU) is refused then. Either
way the receiver raises ``SerializationError`` rather than read what never
landed, and its event loop, which waits meanwhile, is held no longer.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from actorch._base.channels.segments import COPY_FAILED, Segment
from actorch._base.errors import SerializationError
from actorch._base.processes import alive

__all__ = ["CHUNK", "STALL", "Landing", "Landings", "chunk_for"]

CHUNK = 4 << 20
"""Bytes of one chunk of a staged copy: at a host link's 25-50 GB/s, 80-160 µs each."""

STALL = 10.0
"""Seconds a receiver waits for the next chunk of a staged copy before it gives the tensor up.

Under what a live node is given before it is counted lost (ten times ``liveness_timeout``,
25 s by default), so a receiver that waits this long is not lost for it.
"""

_LOOK = 0.05
"""Seconds between looks at whether the sender's process is still there, while a receiver waits."""

_MOST_CHUNKS = COPY_FAILED - 1


def chunk_for(extent: int) -> int:
    """The chunk size for a copy of ``extent`` bytes: :data:`CHUNK`, or larger where that would be too many chunks."""
    return max(CHUNK, -(-extent // _MOST_CHUNKS))


_Watched = tuple[Segment, int, int, list[Any]]


class Landings:
    """The thread that announces each chunk of this process's staged copies as it lands (see the module's docstring).

    It is started by the first copy it is given and ends with :meth:`close`.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Watched | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.watched = 0
        """Copies given to the thread."""
        self.failed = 0
        """Copies whose events raised (a CUDA error): their lends were marked failed."""

    def __repr__(self) -> str:
        return f"<Landings watched={self.watched} failed={self.failed}>"

    def watch(self, segment: Segment, slot: int, generation: int, events: list[Any]) -> None:
        """Mark in the lend ``generation`` in ``slot`` of ``segment`` each chunk whose event in ``events`` is done."""
        self.watched += 1
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="actorch-landings", daemon=True)
                self._thread.start()
        self._queue.put((segment, slot, generation, events))

    def close(self, timeout: float = 10.0) -> bool:
        """Wait (at most ``timeout`` seconds) until every copy given has landed, then end the thread; False if not."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return True
        self._queue.put(None)
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        while (watched := self._queue.get()) is not None:
            segment, slot, generation, events = watched
            for landed, event in enumerate(events, 1):
                try:
                    event.synchronize()
                except Exception:  # noqa: BLE001 - a CUDA error: the receiver must not read what never landed
                    self.failed += 1
                    segment.land(slot, generation, COPY_FAILED)
                    break
                segment.land(slot, generation, landed)


class Landing:
    """One staged lend as its receiver reads it: :meth:`wait` returns once a chunk has landed."""

    __slots__ = ("_seen", "chunks", "generation", "maker", "segment", "slot")

    def __init__(self, segment: Segment, slot: int, generation: int, chunks: int) -> None:
        self.segment, self.slot, self.generation, self.chunks = segment, slot, generation, chunks
        self.maker = segment.maker()
        self._seen = 0

    def __repr__(self) -> str:
        return f"<Landing {self.segment.name} slot {self.slot}: {self._seen} of {self.chunks} chunks seen>"

    def wait(self, index: int) -> None:
        """Return once chunk ``index`` (from 0) has landed.

        Raises:
            SerializationError: The sender's copy failed, or no chunk landed for :data:`STALL` seconds.
        """
        if index < self._seen:
            return
        segment, slot, generation = self.segment, self.slot, self.generation
        landed = segment.landed(slot, generation)
        last, since, pause = landed, time.monotonic(), 0.0
        looked = since
        while 0 <= landed <= index:
            now = time.monotonic()
            if landed != last:
                last, since = landed, now
            elif now - since > STALL:
                raise SerializationError(
                    f"a staged tensor's copy out of the sender's GPU stopped at chunk {landed} of {self.chunks} "
                    f"for {STALL:g} s (the sender is stopped, or its GPU stalled)"
                )
            if now - looked > _LOOK:
                looked = now
                if self.maker is not None and not alive(self.maker) and segment.landed(slot, generation) == landed:
                    raise SerializationError(
                        f"a staged tensor's copy stopped at chunk {landed} of {self.chunks}: "
                        f"the sender's process {self.maker} is gone"
                    )
            time.sleep(pause)
            pause = min(2 * pause or 20e-6, 1e-3)
            landed = segment.landed(slot, generation)
        if landed < 0:
            raise SerializationError("a staged tensor's copy out of the sender's GPU failed there")
        self._seen = landed

    def wait_all(self) -> None:
        """Return once every chunk has landed (see :meth:`wait`)."""
        if self.chunks:
            self.wait(self.chunks - 1)
