"""Ctrl-C and SIGTERM that always end the process: the ``InterruptPolicy`` and the ``InterruptWatcher`` thread.

Python runs signal handlers only in the main thread, between two bytecodes, so
a main thread blocked inside a C++ call that never returns (a torch future's
``wait()``, distributed autograd's backward) never sees the interrupt. The
C-level handler still writes the signal's number to the wakeup fd, so an
``InterruptWatcher`` thread reads it there and ends the process itself when
the main thread does not take the interrupt in time.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["INTERRUPT_EXIT_CODE", "TERMINATE_EXIT_CODE", "InterruptPolicy", "InterruptWatcher"]

INTERRUPT_EXIT_CODE = 130
"""Exit code of a process that Ctrl-C ended by force: 128 + SIGINT, as shells report a process ended by Ctrl-C."""
TERMINATE_EXIT_CODE = 143
"""Exit code of a run that SIGTERM ended (in order, or by force): 128 + SIGTERM, as shells report it."""
SAME_PRESS = 0.1
"""Seconds within which two SIGINTs count as one Ctrl-C (a launcher may forward the terminal's own)."""


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
        describe: Called on the watcher's thread at the first Ctrl-C: what
            the run waits for now, in words, for the line written at once to
            stderr (which also says that a second Ctrl-C ends it).
    """

    respond_within: float = 11.0
    finish_within: float = 52.0
    on_force: Callable[[], str] | None = None
    terminate: bool = False
    describe: Callable[[], str] | None = None


class InterruptWatcher:
    """Ends the process with ``INTERRUPT_EXIT_CODE`` when Ctrl-C cannot end it in order.

    It owns the process's signal wakeup fd (a pipe) until ``close``: Python's
    C-level handler writes every caught signal's number there, even while the
    main thread is blocked in C++, and a daemon thread reads it. From the first
    Ctrl-C, the main thread must take the interrupt (the SIGINT handler calls
    ``acknowledge``) within ``policy.respond_within`` seconds, and then end
    the run within ``policy.finish_within`` seconds; a second Ctrl-C ends the
    process at once. The first Ctrl-C writes one line to stderr at once, from
    the watcher's thread (so also while the main thread is blocked): what the
    run waits for (``policy.describe``), and that a second Ctrl-C ends it.
    Ending it means calling ``policy.on_force``, writing one line to stderr
    and ``os._exit``. With ``policy.terminate``, SIGTERM counts
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
        self._announced = False
        self._announce_lock = threading.Lock()  # apart from _lock, which a forced exit holds to the end
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
            if pressed[0] == signal.SIGINT:
                self.announce()
        if self.presses > 1:
            self._force(f"a second {_press_name(pressed[0])}")

    def announce(self) -> None:
        """Write the first Ctrl-C's line, once: the run stops in order, what it waits for, how to end it now.

        The SIGINT handler calls it before it cancels ``main`` (so the calls
        ``main`` waits on are still pending), and the watcher's thread when it
        reads the signal: whichever comes first writes it.
        """
        with self._announce_lock:  # held while it describes: the SIGINT handler cancels main only after
            if self._announced:
                return
            self._announced = True
            waits = ""
            if self.policy.describe is not None:
                try:
                    waits = self.policy.describe()
                except Exception as exc:  # noqa: BLE001 - the line goes out without it
                    waits = f"(what it waits for could not be told: {exc!r})"
            steps = "; ".join(filter(None, ["actorch: Ctrl-C: stopping in order", waits, "Ctrl-C again ends it now"]))
            with contextlib.suppress(Exception):
                sys.stderr.write(f"{steps}\n")
                sys.stderr.flush()

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
