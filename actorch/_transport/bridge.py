"""Crossing between torch RPC threads and the node's asyncio loop, never blocking a thread.

``Inbox`` hands items from any thread to one loop callback, waking the loop once
per burst rather than once per item. ``to_asyncio`` bridges a torch ``Future``
into an asyncio future with a done-callback; ``to_torch`` goes the other way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

__all__ = ["Inbox", "in_daemon_thread", "to_asyncio", "to_torch"]

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


def to_asyncio(future: torch.futures.Future[Any], loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    """Return an asyncio future that settles like the torch ``future``, from any thread."""
    result: asyncio.Future[Any] = loop.create_future()

    def settle(done: torch.futures.Future[Any]) -> None:
        try:
            value = done.value()
        except Exception as exc:  # noqa: BLE001 - carried over to the loop as is
            loop.call_soon_threadsafe(_set_exception, result, exc)
        else:
            loop.call_soon_threadsafe(_set_result, result, value)

    future.add_done_callback(settle)
    return result


def to_torch(future: asyncio.Future[Any]) -> torch.futures.Future[Any]:
    """Return a torch future completed with ``future``'s outcome (call on the loop)."""
    result: torch.futures.Future[Any] = torch.futures.Future()

    def settle(done: asyncio.Future[Any]) -> None:
        if done.cancelled():
            # torch futures take only Exception subclasses, and asyncio's is a BaseException.
            result.set_exception(concurrent.futures.CancelledError("the asyncio future was cancelled"))
        elif (exc := done.exception()) is not None:
            result.set_exception(exc)
        else:
            result.set_result(done.result())

    future.add_done_callback(settle)
    return result


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


async def in_daemon_thread(fn: Callable[[], None]) -> None:
    """Run the blocking ``fn`` in a daemon thread of its own and wait for it without blocking the loop.

    Not the default executor: the loop's end waits for its threads, and a
    rendezvous stuck waiting for a dead peer would hold the process forever.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting coroutine
            loop.call_soon_threadsafe(_settle_from_thread, done, exc)
        else:
            loop.call_soon_threadsafe(_settle_from_thread, done, None)

    threading.Thread(target=target, name="actorch-rpc-control", daemon=True).start()
    await done


def _settle_from_thread(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
