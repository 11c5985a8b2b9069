"""The caller's effective deadline, read from asyncio and anyio scopes and our own context.

A call carries the time left before its caller's deadline; the callee runs the
handler under that deadline and sets it in context, so calls it makes inherit it.
"""

from __future__ import annotations

import asyncio
import math
from contextvars import ContextVar

import anyio

__all__ = ["current_deadline", "inherited_deadline"]

inherited_deadline: ContextVar[float | None] = ContextVar("actorch_deadline", default=None)
"""Deadline (event-loop time) that a handler inherited from its caller, if any."""


def _asyncio_timeout_deadline(loop: asyncio.AbstractEventLoop, task: asyncio.Task[object]) -> float:
    # asyncio.timeout() keeps no per-task registry; its armed timers are the only
    # trace of it, so look for those that will cancel this very task.
    earliest = math.inf
    scheduled = getattr(loop, "_scheduled", ())
    for handle in scheduled:
        callback = getattr(handle, "_callback", None)
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Timeout) and getattr(owner, "_task", None) is task and not handle.cancelled():
            earliest = min(earliest, handle.when())
    return earliest


def current_deadline() -> float | None:
    """Return the earliest deadline (event-loop time) that applies to the current task.

    Considers ``asyncio.timeout``/``timeout_at`` scopes, anyio cancel scopes
    (``fail_after``, ``move_on_after``) and a deadline inherited from a remote caller.
    """
    task = asyncio.current_task()
    if task is None:
        return inherited_deadline.get()
    loop = task.get_loop()
    earliest = _asyncio_timeout_deadline(loop, task)
    try:  # a try block costs nothing on the way through; this runs once per call made
        scoped = anyio.current_effective_deadline()
    except Exception:  # noqa: BLE001 - anyio raises different errors outside its scopes
        scoped = math.inf
    earliest = min(earliest, scoped)
    inherited = inherited_deadline.get()
    if inherited is not None:
        earliest = min(earliest, inherited)
    return None if math.isinf(earliest) else earliest
