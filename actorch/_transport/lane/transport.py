"""``LaneTransport``: the fast lane beside a transport's main path, as a wrapper of that transport.

Bundles with no tensors of their own go on the lane (``connections``) once a
connection to their destination is up; everything else, and everything sent
inside a distributed autograd context, goes on the wrapped transport's path.
Both paths number their bundles from the wrapped transport's links, and the
lane hands what it receives to that transport, which takes both paths'
bundles in their links' order (``capabilities.SharedLinks``): the wrapped
transport also hands the lane the world's secret and every peer it meets
(``capabilities.SidePath``).

A peer is lost once, whichever path saw it go: the lane tells the wrapped
transport, which reports it through this wrapper; then the lane tells the peer
it is counted lost (if it was only stalled, it hears so) and sends it nothing
more. A thread of the lane's own judges the lane's silence: bytes written to
a peer that its kernel does not acknowledge, while its window is open, for
the liveness timeout mean the peer is cut off, whatever the main path's
heartbeats say. It runs off the event loop, as heartbeats do, so a loop busy
with a long handler does not make a peer look silent.

Peers cut off on purpose (``Severable``, for fault injection) are cut off on
the lane too: what the lane hears of them (a peer saying it counts this node
lost, a connection it closes) would not cross a real partition, so it is not
heard, and the wrapped transport's heartbeats judge them by their silence.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Collection

from actorch._transport.base import Bundle, NodeInfo, Transport
from actorch._transport.capabilities import SharedLinks, severable_of
from actorch._transport.lane.connections import Lane
from actorch._transport.wrapper import Wrapper

__all__ = ["LANE", "LaneTransport"]

LANE = "lane"
"""The lane's path, as the byte counters and a trace name it."""

STALL_CHECKS_PER_TIMEOUT = 5
"""The lane's silence is looked at this many times per liveness timeout."""


class LaneTransport(Wrapper):
    """The fast lane beside ``inner``'s main path; ``inner`` shares its links (it is ``SharedLinks``).

    It is a ``FastLane``. The lane listens once ``inner`` knows the world's
    secret, and connects to each peer as ``inner`` meets it.

    Args:
        inner: The transport whose main path the lane runs beside.
        liveness_timeout: Seconds the lane to a peer may hold bytes its kernel
            has not acknowledged (its window open) before the peer is lost.

    Raises:
        TypeError: ``inner`` does not share its links.
    """

    name = LANE

    def __init__(self, inner: Transport, *, liveness_timeout: float) -> None:
        if not isinstance(inner, SharedLinks):
            raise TypeError(f"the fast lane runs beside a transport that shares its links, not {inner!r}")
        super().__init__(inner, (*inner.paths, LANE))
        self._shared = inner
        self._next_seq = inner.links.next_seq  # the links' numbers: one sequence for both paths
        self._liveness_timeout = liveness_timeout
        self._lane: Lane | None = None
        self._lost_peers: set[int] = set()  # peers reported lost, by either path
        self._severed: frozenset[int] = frozenset()  # peers cut off on purpose: the lane does not hear them
        self._stop_watch = threading.Event()
        self.lane_bundles_sent = 0
        """Bundles sent on the fast lane (they count among ``bundles_sent`` too)."""
        inner.put_beside(self)

    def __repr__(self) -> str:
        return f"<LaneTransport {self._lane!r} over {self.inner!r}>"

    @property
    def lane(self) -> Lane | None:
        """This node's end of the lane, once the transport starts."""
        return self._lane

    async def start(self) -> None:
        """Make the lane (it listens once the world's secret is known), join through ``inner``, watch for stalls."""
        loop = asyncio.get_running_loop()
        self._lane = Lane(loop, self.rank, self._shared.arrived_beside, self._lane_lost)
        try:
            await super().start()
        except BaseException:
            await self._lane.close()
            raise
        threading.Thread(target=self._watch_stalls, args=(loop,), name="actorch-lane-watch", daemon=True).start()

    async def open_beside(self, secret: bytes, host: str) -> str | None:
        """Listen on ``host`` for peers that prove ``secret``; ``host:port``, for this node's ``NodeInfo.lane``."""
        assert self._lane is not None, "opened before start()"
        return await self._lane.start(host, secret)

    def met(self, info: NodeInfo) -> None:
        """Connect to peer ``info`` where its lane listens (any thread); until then its bundles go by ``inner``."""
        lane = self._lane
        if lane is not None and info.lane is not None:
            lane.connect(info.rank, info.lane)

    async def close(self) -> None:
        """Send what is queued, close the lane (what was written leaves first), then leave through ``inner``."""
        self._flush()
        self._stop_watch.set()
        if self._lane is not None:
            await self._lane.close()
        await self.inner.close()

    def forget(self, rank: int) -> None:
        """Node ``rank`` left on purpose: ``inner`` forgets it, and the lane closes both its connections."""
        self.inner.forget(rank)
        if self._lane is not None:
            self._lane.forget(rank)

    def backlog(self, dest: int) -> int:
        """What ``inner`` counts, and what the lane to ``dest`` still holds (its kernel has not taken it)."""
        waiting = self._queued.get(dest, 0) + self.inner.backlog(dest)
        lane = self._lane
        if lane is not None:
            connection = lane.outbound.get(dest)
            if connection is not None:
                waiting += connection.get_write_buffer_size()
        return waiting

    def path(self, dest: int, tensors: bool) -> str:
        """``"lane"`` for a message without tensors of its own while the lane to ``dest`` is up, else ``inner``'s.

        A message sent inside a distributed autograd context goes by ``inner``
        whatever this says.
        """
        lane = self._lane
        if lane is not None and not tensors and dest in lane.outbound:
            return LANE
        return self.inner.path(dest, tensors)

    def _send_bundle(self, dest: int, bundle: Bundle, in_context: bool) -> str | None:
        lane = self._lane
        if lane is not None and not bundle[1] and not in_context:
            next_seq = self._next_seq
            seq = next_seq.get(dest)
            if seq is not None and dest not in self._lost_peers and lane.send(dest, seq, bundle[0]):
                next_seq[dest] = seq + 1
                self.lane_bundles_sent += 1
                return LANE
        return self.inner.carry(dest, bundle, in_context)

    def sever(self, ranks: Collection[int]) -> None:
        """Cut ``ranks`` off (any thread): the lane no longer hears them, and ``inner`` neither hears nor pings them."""
        self._severed = self._severed | frozenset(ranks)
        inner = severable_of(self.inner)
        if inner is not None:
            inner.sever(ranks)

    def heal(self, ranks: Collection[int]) -> None:
        """Hear ``ranks`` again (any thread), on the lane and through ``inner``."""
        self._severed = self._severed - frozenset(ranks)
        inner = severable_of(self.inner)
        if inner is not None:
            inner.heal(ranks)

    def _lane_lost(self, rank: int, why: str) -> None:
        """The lane saw ``rank`` lost (on the loop): ``inner`` counts it lost too, and reports it through here.

        Not a peer cut off on purpose: what the lane heard of it could not
        have crossed the cut, and its silence decides.
        """
        if rank in self._severed:
            return
        self._shared.lose(rank, why)

    def _inner_lost(self, rank: int, why: str) -> None:
        """``inner`` lost ``rank``: the lane tells it so (it may be only stalled) and sends it nothing more."""
        if rank not in self._lost_peers:
            self._lost_peers.add(rank)
            if self._lane is not None:
                self._lane.expel(rank)
        self._report_lost(rank, why)

    def _watch_stalls(self, loop: asyncio.AbstractEventLoop) -> None:
        """Report a peer whose lane has acknowledged nothing for the liveness timeout (the lane's own thread).

        Its pings may still come back on the main path's connection while every
        bundle on the lane, and every later one held behind it, waits. A stall
        is counted only while this thread runs: one that wakes late was held up
        itself (its process starved or stopped), and what it missed meanwhile
        says nothing of the peers.
        """
        assert self._lane is not None
        lane, timeout = self._lane, self._liveness_timeout
        interval = timeout / STALL_CHECKS_PER_TIMEOUT
        reported: set[int] = set()
        planned = judged_from = time.monotonic()
        while not self._stop_watch.wait(max(planned + interval - time.monotonic(), 0.0)):
            now = time.monotonic()
            if now - planned > 2 * interval:
                judged_from = now
            planned = now
            for peer, since in lane.stalled(now).items():
                stalled = min(since, now - judged_from)
                if stalled < timeout or peer in reported or peer in self._lost_peers or peer in self._severed:
                    continue
                reported.add(peer)
                why = f"its fast lane acknowledged nothing for {stalled:.1f} s (liveness timeout {timeout:g} s)"
                hook = self.lost_in_thread
                if hook is not None:
                    hook(peer, why)
                try:
                    loop.call_soon_threadsafe(self._lane_lost, peer, why)
                except RuntimeError:  # the loop has closed: nobody is left to tell
                    return
