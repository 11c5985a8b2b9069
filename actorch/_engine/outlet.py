"""The producing end of a stream: it runs the endpoint's generator only as far as the consumer's credits allow.

A streaming endpoint is an ``async def`` that ``yield``s. Its stream is one
message in the actor's mailbox, whose handler is :meth:`Outlet.pump`: it asks
the generator for an item only while it holds a credit, and hands each item to
:meth:`Outlet.put` (straight to a consumer on this node, or onto the wire). So
the producer is never more than the consumer's window ahead, and when the
stream ends for any reason the generator is closed on this node and its
``finally`` runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actorch._engine.message import Message

__all__ = ["ItemRefused", "Outlet"]


class ItemRefused(Exception):  # noqa: N818 - a carrier, never raised to users
    """An item could not be sent (it cannot be encoded, or it is too large): the stream ends with ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Outlet:
    """Where a stream's items go, and how many more the consumer will take (its credits)."""

    __slots__ = ("_loop", "_wakeup", "credit", "message", "sent")

    def __init__(self, loop: asyncio.AbstractEventLoop, window: int) -> None:
        self._loop = loop
        self._wakeup: asyncio.Future[None] | None = None
        self.credit = window
        self.sent = 0
        self.message: Message | None = None  # the stream's message in its actor's mailbox

    def __repr__(self) -> str:
        return f"<{type(self).__name__} sent={self.sent} credit={self.credit}>"

    def more(self, count: int) -> None:
        """The consumer took ``count`` items: the producer may make that many more."""
        self.credit += count
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def put(self, item: Any) -> None:
        """Deliver one item (the ``sent``-th, from 0) to the consumer; raise :class:`ItemRefused` if it cannot go."""
        raise NotImplementedError

    async def pump(self, items: AsyncGenerator[Any, None], running: set[Outlet]) -> None:
        """Run ``items`` to its end, one item per credit; close it however the stream ends.

        The outlet is in ``running`` (its actor's) meanwhile, so that stopping the actor can end it.
        """
        running.add(self)
        try:
            while True:
                while self.credit <= 0:
                    self._wakeup = self._loop.create_future()
                    try:
                        await self._wakeup
                    finally:
                        self._wakeup = None
                try:
                    item = await items.__anext__()
                except StopAsyncIteration:
                    return
                self.credit -= 1
                self.put(item)
                self.sent += 1
        finally:
            running.discard(self)
            await items.aclose()  # a no-op if it ended; else GeneratorExit at its yield: its finally runs
