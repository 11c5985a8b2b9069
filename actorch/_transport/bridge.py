"""Crossing between torch RPC threads and the node's asyncio loop, never blocking a thread.

``Inbox`` hands items from any thread to one loop callback, waking the loop once
per burst rather than once per item. ``in_daemon_thread`` runs a blocking call
(torch RPC's set-up and shutdown) in a daemon thread of its own and lets a
coroutine await it without blocking the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Inbox", "in_daemon_thread"]

T = TypeVar("T")


class Inbox(Generic[T]):
    """A thread-safe queue drained on the event loop by ``handler``, one wake-up per burst."""

    __slots__ = ("_handler", "_items", "_loop", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop, handler: Callable[[T], None]) -> None:
        self._loop = loop
        self._handler = handler
        self._items: deque[T] = deque()
        self._scheduled = False

    def __repr__(self) -> str:
        return f"<Inbox pending={len(self._items)}>"

    def post(self, item: T) -> None:
        """Queue ``item`` from any thread; the loop will pass it to the handler."""
        self._items.append(item)
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # loop closed: nobody is left to handle it
                self._scheduled = False

    def _drain(self) -> None:
        # Clear the flag before taking items, so a post racing with us schedules anew.
        self._scheduled = False
        items = self._items
        while items:
            self._handler(items.popleft())


async def in_daemon_thread(fn: Callable[[], None]) -> None:
    """Run the blocking ``fn`` in a daemon thread of its own and wait for it without blocking the loop.

    Not the default executor: the loop's end waits for its threads, and a
    rendezvous stuck waiting for a dead peer would hold the process forever.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def target() -> None:
        outcome: BaseException | None = None
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting coroutine
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: its waiter went with it (a failed start)
            loop.call_soon_threadsafe(_settle_from_thread, done, outcome)

    threading.Thread(target=target, name="actorch-rpc-control", daemon=True).start()
    await done


def _settle_from_thread(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
