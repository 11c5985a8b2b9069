"""Running a node's event loop so that it always ends: bounded clean-up, Ctrl-C that always works, a watchdog.

``asyncio.run`` waits, at the end, for every task it cancels; one task that
swallows its cancellation keeps the process alive forever. ``run_bounded`` gives
left-over tasks a few seconds and then closes the loop anyway. A worker whose
event loop is stuck in user code (a handler that blocks without awaiting)
cannot run any clean-up at all, so its ``Watchdog`` thread ends the process once
the system is over and the process has not exited in time.

Ctrl-C has the same problem on the node that runs ``main``: ``run_bounded``
hands the signal to the main task, and an ``InterruptWatcher`` (``interrupts``)
ends the process when the main thread does not take it in time.
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
from dataclasses import replace
from typing import Any, ClassVar, NoReturn, TypeVar

import structlog

from actorch._base.deadline import DeadlineLoop
from actorch._launch.world.interrupts import TERMINATE_EXIT_CODE, InterruptPolicy, InterruptWatcher

__all__ = ["LEFTOVER_WAIT", "Watchdog", "interruption", "run_bounded"]

T = TypeVar("T")

LEFTOVER_WAIT = 2.0
"""Seconds tasks still running when the main coroutine ends get to finish after being cancelled."""

log = structlog.get_logger("actorch")


def run_bounded(coro: Coroutine[Any, Any, T], *, interrupts: InterruptPolicy | None = None) -> T:
    """Run ``coro`` in a new event loop and close it in bounded time, like ``asyncio.run`` otherwise.

    In the main thread, where SIGINT has Python's default handler, Ctrl-C
    cancels ``coro`` so that its clean-up runs, and then raises
    ``KeyboardInterrupt``. An ``InterruptWatcher`` makes that bounded: the
    process ends at once with ``INTERRUPT_EXIT_CODE`` on a second Ctrl-C, when
    the main thread has not taken the interrupt within
    ``interrupts.respond_within`` seconds (it is blocked in a call that Python
    cannot interrupt), or when the clean-up is not over
    ``interrupts.finish_within`` seconds after it did. With
    ``interrupts.terminate``, SIGTERM does the same (where the program left it
    at its default), and the run then raises ``SystemExit(TERMINATE_EXIT_CODE)``.
    Elsewhere (in another thread, or where the program handles or ignores
    SIGINT itself) signals are left alone. The handlers and the wakeup fd are
    restored on return.

    Args:
        coro: The coroutine to run.
        interrupts: Ctrl-C's bounds and what to do before a forced exit
            (``InterruptPolicy()`` if None).

    Returns:
        What ``coro`` returned.

    Raises:
        KeyboardInterrupt: Ctrl-C cancelled ``coro``.
        SystemExit: SIGTERM cancelled ``coro`` (``interrupts.terminate``); its code is ``TERMINATE_EXIT_CODE``.
        RuntimeError: An event loop is already running in this thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError("actorch.run() cannot be called from a running event loop; await your code in main instead")
    loop = DeadlineLoop()  # a call reads its caller's asyncio.timeout scopes in one lookup there
    asyncio.set_event_loop(loop)
    main = loop.create_task(coro)
    signals = _MainSignals(loop, main, interrupts or InterruptPolicy())
    try:
        try:
            return loop.run_until_complete(main)
        except asyncio.CancelledError:
            ending = signals.ending()
            if ending is not None:
                raise ending from None
            raise
        finally:
            try:
                _finish(loop)
            finally:
                asyncio.set_event_loop(None)
                loop.close()
    finally:
        signals.restore()


def interruption() -> str | None:
    """What interrupted the ``run_bounded`` of the main thread, if anything did: ``"Ctrl-C"`` or ``"SIGTERM"``.

    Read where the main task's cancellation arrives (``lead`` records a run
    so interrupted as such, not as failed).
    """
    signals = _MainSignals.current
    if signals is None:
        return None
    if signals.interrupted:
        return "Ctrl-C"
    return "SIGTERM" if signals.terminated else None


class _MainSignals:
    """Ctrl-C, and SIGTERM where the policy asks, for one ``run_bounded``: each cancels the main task, watched.

    Only in the main thread, and only for signals the program left at their
    defaults; ``restore`` puts the defaults back and closes the watcher.
    """

    current: ClassVar[_MainSignals | None] = None
    """The signals of the main thread's ``run_bounded`` now, if any."""

    def __init__(self, loop: asyncio.AbstractEventLoop, main: asyncio.Task[Any], policy: InterruptPolicy) -> None:
        self._loop = loop
        self._main = main
        self.interrupted = 0
        self.terminated = False
        self.watcher: InterruptWatcher | None = None
        self.sigint = (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        self.sigterm = self.sigint and policy.terminate and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        if self.sigint:
            self.watcher = InterruptWatcher(policy if self.sigterm else replace(policy, terminate=False))
            signal.signal(signal.SIGINT, self._on_sigint)
        if self.sigterm:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.sigint:
            _MainSignals.current = self

    def __repr__(self) -> str:
        return f"<_MainSignals interrupted={self.interrupted} terminated={self.terminated}>"

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupted += 1
        if self.watcher is not None:
            self.watcher.acknowledge()
            if self.interrupted == 1:
                self.watcher.announce()  # before main is cancelled: what it waits for is still there to tell
        if self.interrupted == 1 and not self._main.done():
            self._loop.call_soon_threadsafe(self._main.cancel)
            return
        if self.watcher is not None and self.interrupted > 1:
            return  # the watcher saw it too, and ends the process at once
        raise KeyboardInterrupt

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.watcher is not None:
            self.watcher.acknowledge()
        if not self.terminated and not self._main.done():
            self.terminated = True
            self._loop.call_soon_threadsafe(self._main.cancel)

    def ending(self) -> BaseException | None:
        """What the run raises when a signal cancelled the main task; None if none did."""
        if self.interrupted:
            return KeyboardInterrupt()
        if self.terminated:
            return SystemExit(TERMINATE_EXIT_CODE)
        return None

    def restore(self) -> None:
        """Give the signals back their default handlers and stop watching."""
        if _MainSignals.current is self:
            _MainSignals.current = None
        try:
            if self.sigint:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            if self.sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        finally:
            if self.watcher is not None:
                self.watcher.close()


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

    def end_now(self, reason: str) -> NoReturn:
        """End the process at once with ``code``, saying ``reason`` on stderr (from any thread, the loop's blocked)."""
        sys.stderr.write(f"actorch: node process {os.getpid()} ends: {reason}; exiting with code {self.code}\n")
        sys.stderr.flush()
        os._exit(self.code)

    def _watch(self) -> None:
        self._armed.wait()
        time.sleep(self.limit)
        self.end_now(f"it did not exit within {self.limit:g} s after {self._reason}")
