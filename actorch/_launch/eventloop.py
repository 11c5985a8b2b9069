"""Running a node's event loop so that it always ends: bounded clean-up, Ctrl-C that always works, a watchdog.

``asyncio.run`` waits, at the end, for every task it cancels; one task that
swallows its cancellation keeps the process alive forever. ``run_bounded`` gives
left-over tasks a few seconds and then closes the loop anyway. A worker whose
event loop is stuck in user code (a handler that blocks without awaiting)
cannot run any clean-up at all, so its ``Watchdog`` thread ends the process once
the system is over and the process has not exited in time.

Ctrl-C has the same problem on the node that runs ``main``: Python runs signal
handlers only in the main thread, between two bytecodes, so a main thread
blocked inside a C++ call that never returns (a torch future's ``wait()``,
distributed autograd's backward) never sees the interrupt. The C-level handler
still writes the signal's number to the wakeup fd, so an ``InterruptWatcher``
thread reads it there and ends the process itself when the main thread does
not take the interrupt in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

import structlog

from actorch._base.deadline import DeadlineLoop

__all__ = [
    "INTERRUPT_EXIT_CODE",
    "LEFTOVER_WAIT",
    "TERMINATE_EXIT_CODE",
    "InterruptPolicy",
    "InterruptWatcher",
    "Watchdog",
    "run_bounded",
]

T = TypeVar("T")

LEFTOVER_WAIT = 2.0
"""Seconds tasks still running when the main coroutine ends get to finish after being cancelled."""
INTERRUPT_EXIT_CODE = 130
"""Exit code of a process that Ctrl-C ended by force: 128 + SIGINT, as shells report a process ended by Ctrl-C."""
TERMINATE_EXIT_CODE = 143
"""Exit code of a run that SIGTERM ended (in order, or by force): 128 + SIGTERM, as shells report it."""
SAME_PRESS = 0.1
"""Seconds within which two SIGINTs count as one Ctrl-C (a launcher may forward the terminal's own)."""

log = structlog.get_logger("actorch")


@dataclass(frozen=True)
class InterruptPolicy:
    """How long Ctrl-C waits for an orderly end before the process is ended by force.

    The defaults are what ``actorch.run`` uses with the default ``stop_grace``
    of 10 s.

    Attributes:
        respond_within: Seconds the main thread has to take the interrupt
            (to run the Python signal handler that cancels the main task).
        finish_within: Seconds the orderly shutdown may take once the main
            thread took the interrupt.
        on_force: Called on the watcher's thread just before a forced exit
            (to kill local worker processes); returns what it did, for the
            line written to stderr.
        terminate: SIGTERM (what schedulers send) ends the run as Ctrl-C
            does, in order and within the same bounds; the process then
            exits with ``TERMINATE_EXIT_CODE``.
    """

    respond_within: float = 11.0
    finish_within: float = 52.0
    on_force: Callable[[], str] | None = None
    terminate: bool = False


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


class _MainSignals:
    """Ctrl-C, and SIGTERM where the policy asks, for one ``run_bounded``: each cancels the main task, watched.

    Only in the main thread, and only for signals the program left at their
    defaults; ``restore`` puts the defaults back and closes the watcher.
    """

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

    def __repr__(self) -> str:
        return f"<_MainSignals interrupted={self.interrupted} terminated={self.terminated}>"

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupted += 1
        if self.watcher is not None:
            self.watcher.acknowledge()
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


class InterruptWatcher:
    """Ends the process with ``INTERRUPT_EXIT_CODE`` when Ctrl-C cannot end it in order.

    It owns the process's signal wakeup fd (a pipe) until ``close``: Python's
    C-level handler writes every caught signal's number there, even while the
    main thread is blocked in C++, and a daemon thread reads it. From the first
    Ctrl-C, the main thread must take the interrupt (the SIGINT handler calls
    ``acknowledge``) within ``policy.respond_within`` seconds, and then end
    the run within ``policy.finish_within`` seconds; a second Ctrl-C ends the
    process at once. Ending it means calling ``policy.on_force``, writing one
    line to stderr and ``os._exit``. With ``policy.terminate``, SIGTERM counts
    as a press too, and a run it began ends with ``TERMINATE_EXIT_CODE``.
    Create and close it in the main thread.
    """

    current: ClassVar[InterruptWatcher | None] = None
    """The watcher that owns the wakeup fd now, if any."""

    def __init__(self, policy: InterruptPolicy) -> None:
        self.policy = policy
        self.presses = 0
        self._first_signal = signal.SIGINT
        self._first_press: float | None = None
        self._last_press = float("-inf")
        self._acknowledged_at: float | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        try:
            self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        except ValueError:
            os.close(self._read_fd)
            os.close(self._write_fd)
            raise
        InterruptWatcher.current = self
        self._thread = threading.Thread(target=self._watch, name="actorch-interrupts", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"presses={self.presses}"
        return f"<InterruptWatcher respond_within={self.policy.respond_within:g}s {state}>"

    def acknowledge(self) -> None:
        """Note that the main thread took an interrupt (call it from the signal handler; it takes no lock).

        The watcher's thread is woken to count its new deadline: it may have
        read the signal first, and be waiting out the longer one.
        """
        if self._acknowledged_at is None:
            self._acknowledged_at = time.monotonic()
            if not self._closed:
                with contextlib.suppress(OSError):  # the pipe is full, or closing: the thread is awake anyway
                    os.write(self._write_fd, b"\0")

    def close(self) -> None:
        """Stop watching: give the wakeup fd back to its previous owner and end the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if InterruptWatcher.current is self:
            InterruptWatcher.current = None
        self._give_back_wakeup_fd()
        os.close(self._write_fd)  # the thread reads the end of the pipe and closes its side
        self._thread.join(1.0)

    def _give_back_wakeup_fd(self) -> None:
        try:
            signal.set_wakeup_fd(self._previous_fd)
        except (ValueError, OSError):  # its owner closed it meanwhile
            signal.set_wakeup_fd(-1)

    def _watch(self) -> None:
        try:
            while True:
                deadline, reason = self._deadline()
                timeout = None if deadline is None else deadline - time.monotonic()
                if timeout is not None and timeout <= 0:
                    self._force(reason)
                    return
                ready, _, _ = select.select([self._read_fd], [], [], timeout)
                if not ready:
                    continue  # a deadline passed: look again, the main thread may have just answered
                data = os.read(self._read_fd, 512)
                if not data:
                    return
                self._received(data)
        finally:
            os.close(self._read_fd)

    def _received(self, data: bytes) -> None:
        if self._previous_fd >= 0:
            with contextlib.suppress(OSError):  # its owner still hears of its signals
                os.write(self._previous_fd, data)
        now = time.monotonic()
        pressed = [signum for signum in self._counted() if signum in data]
        if not pressed or now - self._last_press < SAME_PRESS:
            return
        self._last_press = now
        self.presses += 1
        if self._first_press is None:
            self._first_press = now
            self._first_signal = pressed[0]
        if self.presses > 1:
            self._force(f"a second {_press_name(pressed[0])}")

    def _counted(self) -> tuple[signal.Signals, ...]:
        return (signal.SIGINT, signal.SIGTERM) if self.policy.terminate else (signal.SIGINT,)

    def _deadline(self) -> tuple[float | None, str]:
        if self._first_press is None:
            return None, ""
        what = _press_name(self._first_signal)
        if self._acknowledged_at is None:
            return self._first_press + self.policy.respond_within, (
                f"{what} did not reach main within {self.policy.respond_within:g} s "
                "(its thread is blocked in a call that Python cannot interrupt)"
            )
        return self._acknowledged_at + self.policy.finish_within, (
            f"the shutdown after {what} did not end within {self.policy.finish_within:g} s"
        )

    def _force(self, reason: str) -> None:
        with self._lock:  # held until the exit: close() cannot slip in between
            if self._closed:
                return
            done = ""
            if self.policy.on_force is not None:
                try:
                    done = self.policy.on_force()
                except Exception as exc:  # noqa: BLE001 - the process ends anyway
                    done = f"could not end the local workers ({exc!r})"
            steps = "; ".join(filter(None, [reason, done]))
            code = TERMINATE_EXIT_CODE if self._first_signal == signal.SIGTERM else INTERRUPT_EXIT_CODE
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            with contextlib.suppress(Exception):
                sys.stderr.write(f"actorch: {steps}; process {os.getpid()} exits with code {code}\n")
                sys.stderr.flush()
            os._exit(code)


def _press_name(signum: int) -> str:
    return "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"


def _forget_watcher_in_child() -> None:
    # A forked child (a DataLoader worker) must not report its own SIGINTs into
    # the watcher's pipe: the parent would count them as Ctrl-C pressed twice.
    watcher = InterruptWatcher.current
    if watcher is not None:
        InterruptWatcher.current = None
        with contextlib.suppress(ValueError, OSError):
            watcher._give_back_wakeup_fd()


os.register_at_fork(after_in_child=_forget_watcher_in_child)


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
