"""Running a node's event loop so that it always ends: bounded clean-up and a watchdog.

``asyncio.run`` waits, at the end, for every task it cancels; one task that
swallows its cancellation keeps the process alive forever. ``run_bounded`` gives
left-over tasks a few seconds and then closes the loop anyway. A worker whose
event loop is stuck in user code (a handler that blocks without awaiting)
cannot run any clean-up at all, so its ``Watchdog`` thread ends the process once
the system is over and the process has not exited in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

__all__ = ["LEFTOVER_WAIT", "Watchdog", "run_bounded"]

T = TypeVar("T")

LEFTOVER_WAIT = 2.0
"""Seconds tasks still running when the main coroutine ends get to finish after being cancelled."""

log = structlog.get_logger("actorch")


def run_bounded(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` in a new event loop and close it in bounded time, like ``asyncio.run`` otherwise.

    Ctrl-C (in the main thread, where SIGINT has Python's default handler)
    cancels ``coro`` once, so its clean-up runs, and then raises
    ``KeyboardInterrupt``; a second Ctrl-C interrupts at once.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError("actorch.run() cannot be called from a running event loop; await your code in main instead")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(coro)
    interrupts = 0

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1 and not main.done():
            loop.call_soon_threadsafe(main.cancel)
            return
        raise KeyboardInterrupt

    handles_sigint = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    if handles_sigint:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        try:
            return loop.run_until_complete(main)
        except asyncio.CancelledError:
            if interrupts:
                raise KeyboardInterrupt from None
            raise
    finally:
        if handles_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            _finish(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _finish(loop: asyncio.AbstractEventLoop) -> None:
    leftovers = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        done, stuck = loop.run_until_complete(asyncio.wait(leftovers, timeout=LEFTOVER_WAIT))
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("task failed during shutdown", task=task.get_name(), error=repr(task.exception()))
        if stuck:
            log.error(
                "tasks ignored cancellation; closing the loop without them",
                tasks=sorted(task.get_name() for task in stuck),
            )
    loop.run_until_complete(loop.shutdown_asyncgens())
    with contextlib.suppress(TimeoutError):  # a thread stuck in the default executor stays behind
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), LEFTOVER_WAIT))


class Watchdog:
    """Ends the process with ``code`` if it is still alive ``limit`` seconds after being armed.

    Arming is safe from any thread and happens once; the thread is a daemon, so
    a process that exits normally is not held by it.
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.code = 1
        self._armed = threading.Event()
        self._reason = ""
        threading.Thread(target=self._watch, name="actorch-watchdog", daemon=True).start()

    def __repr__(self) -> str:
        return f"<Watchdog limit={self.limit:g}s armed={self._armed.is_set()}>"

    def arm(self, reason: str) -> None:
        """Start the countdown (only the first call counts)."""
        if not self._armed.is_set():
            self._reason = reason
            self._armed.set()

    def _watch(self) -> None:
        self._armed.wait()
        time.sleep(self.limit)
        sys.stderr.write(
            f"actorch: node process {os.getpid()} did not exit within {self.limit:g} s after {self._reason}; "
            f"exiting with code {self.code}\n"
        )
        sys.stderr.flush()
        os._exit(self.code)
