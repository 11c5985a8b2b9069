"""The caller's effective deadline, read from asyncio and anyio scopes and our own context.

A call carries the time left before its caller's deadline; the callee runs the
handler under that deadline and sets it in context, so calls it makes inherit it.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Awaitable, Callable, Sized
from contextvars import Context, ContextVar
from typing import Any

import anyio

__all__ = [
    "DeadlineLoop",
    "PastDeadlineError",
    "current_deadline",
    "deadline_of",
    "inherited_deadline",
    "outer_deadline",
    "within",
]

_running_loop = asyncio.events._get_running_loop
if sys.version_info < (3, 12):  # asyncio.current_task() reads this dict (later versions keep tasks elsewhere)
    _current_task: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None] = asyncio.tasks._current_tasks.get  # type: ignore[attr-defined]
else:  # pragma: no cover - newer Pythons
    _current_task = asyncio.current_task

inherited_deadline: ContextVar[float | None] = ContextVar("actorch_deadline", default=None)
"""Deadline (event-loop time) that a handler inherited from its caller, if any."""

try:  # anyio's own answer for asyncio, without its per-call detection of the running library
    from anyio._backends._asyncio import AsyncIOBackend, _task_states

    _anyio_deadline: Callable[[], float] = AsyncIOBackend.current_effective_deadline
    _anyio_tasks: Sized = _task_states  # empty while no task has entered an anyio scope
except (ImportError, AttributeError):  # pragma: no cover - another anyio layout: the public call
    _anyio_deadline = anyio.current_effective_deadline
    _anyio_tasks = (None,)


class DeadlineLoop(asyncio.SelectorEventLoop):
    """An event loop that files each ``asyncio.timeout`` timer under the task it will cancel.

    A call reads its caller's ``asyncio.timeout`` scopes from their timers. On
    this loop that read is one lookup by task; on another it looks through every
    armed timer of the loop, which thousands of sleeping actors make slow.
    """

    def __init__(self) -> None:
        super().__init__()
        self.timeouts_by_task: dict[asyncio.Task[Any], list[asyncio.TimerHandle]] = {}

    def call_at(  # type: ignore[override]  # typeshed's variadic generics; the same signature
        self, when: float, callback: Callable[..., object], *args: Any, context: Context | None = None
    ) -> asyncio.TimerHandle:
        """Schedule ``callback`` at ``when``, as any loop does; file it if it is an ``asyncio.timeout``'s."""
        handle = super().call_at(when, callback, *args, context=context)
        owner = getattr(callback, "__self__", None)
        if type(owner) is asyncio.Timeout:
            task = getattr(owner, "_task", None)
            if task is not None:
                self._file(task, handle)
        return handle

    def _file(self, task: asyncio.Task[Any], handle: asyncio.TimerHandle) -> None:
        filed = self.timeouts_by_task.get(task)
        if filed is None:
            self.timeouts_by_task[task] = [handle]
            task.add_done_callback(self._forget)
        else:
            filed[:] = [timer for timer in filed if _armed(timer)]  # scopes left, moved or expired since
            filed.append(handle)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self.timeouts_by_task.pop(task, None)


def _armed(timer: asyncio.TimerHandle) -> bool:
    """Whether ``timer`` is still to fire: not cancelled, and not run (an expired scope does not cancel its timer)."""
    return not timer.cancelled() and timer._scheduled  # type: ignore[attr-defined]  # the loop clears it as it runs


def _asyncio_timeout_deadline(loop: asyncio.AbstractEventLoop, task: asyncio.Task[object]) -> float:
    """The earliest ``asyncio.timeout`` timer armed to cancel ``task`` (inf if none)."""
    by_task = getattr(loop, "timeouts_by_task", None)
    if by_task is not None:
        filed = by_task.get(task)
        return _filed_deadline(filed) if filed else math.inf
    # Another loop: asyncio.timeout() keeps no per-task registry, and its armed
    # timers are the only trace of it, so look for those that will cancel this task.
    earliest = math.inf
    for handle in getattr(loop, "_scheduled", ()):
        if handle.cancelled():
            continue
        owner = getattr(getattr(handle, "_callback", None), "__self__", None)
        if isinstance(owner, asyncio.Timeout) and getattr(owner, "_task", None) is task:
            earliest = min(earliest, handle.when())
    return earliest


def _filed_deadline(filed: list[asyncio.TimerHandle]) -> float:
    """The earliest of a task's filed timers still armed; with none, the list is emptied for the next read."""
    earliest = math.inf
    for handle in filed:
        if _armed(handle) and handle.when() < earliest:
            earliest = handle.when()
    if earliest == math.inf:
        filed.clear()  # every scope was left: the next call of this task skips the loop above
    return earliest


def outer_deadline() -> float:
    """The part of the current task's deadline that another task cannot read later: anyio scopes, inheritance.

    Cheap, so that a call reads it where it is made; :func:`deadline_of` adds the
    ``asyncio.timeout`` scopes, which can be found from any task while they last.
    """
    earliest = math.inf
    if _anyio_tasks:
        try:  # a try block costs nothing on the way through; this runs once per call made
            earliest = _anyio_deadline()
        except Exception:  # noqa: BLE001 - anyio raises different errors outside its scopes
            earliest = math.inf
    inherited = inherited_deadline.get()
    return earliest if inherited is None else min(earliest, inherited)


def deadline_of(task: asyncio.Task[Any] | None, outer: float) -> float | None:
    """The deadline (event-loop time) of a call made in ``task`` with ``outer`` read there, or None."""
    earliest = outer if task is None else min(outer, _asyncio_timeout_deadline(task.get_loop(), task))
    return None if math.isinf(earliest) else earliest


def current_deadline() -> float | None:
    """Return the earliest deadline (event-loop time) that applies to the current task.

    Considers ``asyncio.timeout``/``timeout_at`` scopes, anyio cancel scopes
    (``fail_after``, ``move_on_after``) and a deadline inherited from a remote caller.
    Every call reads it, so it is :func:`deadline_of` with the current task spelled out.
    """
    earliest = outer_deadline()
    loop = _running_loop()
    if loop is not None:
        task = _current_task(loop)
        if task is not None:
            by_task = getattr(loop, "timeouts_by_task", None)
            if by_task is None:  # another loop: look through its timers, if any is armed
                if getattr(loop, "_scheduled", None):
                    earliest = min(earliest, _asyncio_timeout_deadline(loop, task))
            else:
                filed = by_task.get(task)
                if filed:  # on actorch.run's loop: only the timers filed under this task
                    earliest = min(earliest, _filed_deadline(filed))
    return None if earliest == math.inf else earliest


class PastDeadlineError(TimeoutError):
    """A handler ran past the deadline it was run :func:`within` (not a ``TimeoutError`` of its own)."""


async def within(handler: Awaitable[Any], deadline: float) -> Any:
    """Await ``handler`` until ``deadline`` (event-loop time); past it, cancel it and raise ``PastDeadlineError``."""
    timeout = asyncio.timeout_at(deadline)
    try:
        async with timeout:
            return await handler
    except TimeoutError:
        if timeout.expired():
            raise PastDeadlineError from None
        raise
