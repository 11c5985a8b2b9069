"""Bounded mailboxes: how many messages one node may have waiting at one actor.

Every node keeps, per actor it sends to, a count of its messages that the actor
has not finished with yet: calls until their reply comes back, tells until the
actor's node returns a credit for them. A node never has more than ``window``
such messages at one actor, so an actor's mailbox holds at most ``window``
messages per node of the system however fast its callers are. A call that finds
the window full waits for room (within its deadline); a tell cannot wait, so it
raises ``MailboxFullError`` instead of growing the queue. Actors whose id is at
most ``exempt`` (the system's own) are not bounded. The window's size is checked
where the system's options are (``SystemConfig``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

__all__ = ["BACKLOG_POLL", "FlowControl", "Target"]

BACKLOG_POLL = 0.01
"""Seconds between looks at the backlog toward a node, for a call that waits for it to drain (a rare path)."""

Target = tuple[int, int]
"""An actor as the flow control knows it: ``(rank, actor_id)``."""

SendCredits = Callable[[int, list[int]], None]
"""Sends ``[actor_id, count, actor_id, count, ...]`` back to the node that told them."""


class FlowControl:
    """One node's send windows to actors, and the credits it owes to tellers."""

    __slots__ = (
        "_credit_flush",
        "_loop",
        "_owed",
        "_send_credits",
        "_waiters",
        "exempt",
        "outstanding",
        "rank",
        "window",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, rank: int, window: int, send_credits: SendCredits, *, exempt: int = 0
    ) -> None:
        self._loop = loop
        self.rank = rank
        self.window = window
        self.exempt = exempt
        self.outstanding: dict[Target, int] = {}
        self._waiters: dict[Target, deque[asyncio.Future[None]]] = {}
        self._owed: dict[int, dict[int, int]] = {}
        self._send_credits = send_credits
        self._credit_flush: asyncio.Handle | None = None

    def __repr__(self) -> str:
        return f"<FlowControl window={self.window} targets={len(self.outstanding)} waiting={self.waiting()}>"

    def waiting(self) -> int:
        """Calls waiting for room right now."""
        return sum(len(waiters) for waiters in self._waiters.values())

    # ------------------------------------------------------------------ sending

    def try_take(self, target: Target) -> bool:
        """Take a slot of ``target``'s window if one is free and nobody waits for it."""
        if target[1] <= self.exempt:
            return True
        count = self.outstanding.get(target, 0)
        if count >= self.window or target in self._waiters:
            return False
        self.outstanding[target] = count + 1
        return True

    async def take(self, target: Target) -> None:
        """Take a slot of ``target``'s window, waiting in line for one if it is full.

        Cancellation (a deadline) while waiting leaves the line without a slot.
        """
        if self.try_take(target):
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.setdefault(target, deque()).append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(target)  # the slot was handed over just as we gave up: pass it on
            else:
                self._forget(target, waiter)
            raise

    def release(self, target: Target, count: int = 1) -> None:
        """Give back ``count`` slots of ``target``: hand each to the next waiter, or free it."""
        if target[1] <= self.exempt:
            return
        waiters = self._waiters.get(target)
        while count and waiters:
            waiter = waiters.popleft()
            if not waiters:
                del self._waiters[target]
                waiters = None
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands; the count stays
                count -= 1
        if count:
            left = self.outstanding.get(target, 0) - count
            if left > 0:
                self.outstanding[target] = left
            else:
                self.outstanding.pop(target, None)

    def release_local(self, actor_id: int) -> None:
        """Give back the slot of a message this node sent to its own actor ``actor_id``."""
        self.release((self.rank, actor_id))

    def fail_rank(self, rank: int, error: Callable[[], BaseException]) -> None:
        """Forget every window to actors of ``rank`` and fail the calls waiting for them."""
        for target in [target for target in self.outstanding if target[0] == rank]:
            del self.outstanding[target]
        for target in [target for target in self._waiters if target[0] == rank]:
            for waiter in self._waiters.pop(target):
                if not waiter.done():
                    waiter.set_exception(error())
        self._owed.pop(rank, None)

    def close(self, error: Callable[[], BaseException]) -> None:
        """Fail every waiting call; nothing is sent any more."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(error())
        self._waiters.clear()
        self.outstanding.clear()
        self._owed.clear()
        if self._credit_flush is not None:
            self._credit_flush.cancel()
            self._credit_flush = None

    def _forget(self, target: Target, waiter: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(target)
        if waiters is None:
            return
        try:
            waiters.remove(waiter)
        except ValueError:
            return
        if not waiters:
            del self._waiters[target]

    # ------------------------------------------------------------------ receiving

    def owe(self, src: int, actor_id: int) -> None:
        """A tell from ``src`` is done with: its credit goes back with the others of this iteration."""
        if actor_id <= self.exempt:
            return
        owed = self._owed.get(src)
        if owed is None:
            owed = self._owed[src] = {}
        owed[actor_id] = owed.get(actor_id, 0) + 1
        if self._credit_flush is None:
            self._credit_flush = self._loop.call_soon(self._flush_credits)

    def _flush_credits(self) -> None:
        self._credit_flush = None
        owed, self._owed = self._owed, {}
        for src, counts in owed.items():
            flat: list[int] = []
            for actor_id, count in counts.items():
                flat += (actor_id, count)
            self._send_credits(src, flat)

    def credited(self, src: int, flat: list[int]) -> None:
        """Credits came back from ``src``: release those slots."""
        for index in range(0, len(flat) - 1, 2):
            self.release((src, flat[index]), flat[index + 1])
