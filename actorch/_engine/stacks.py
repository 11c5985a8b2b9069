"""Where a node is, line by line: each actor's running handlers as await chains, its other tasks, every thread.

Read from a thread that is not the node's loop, so it answers also when a
handler blocks the loop and never yields. A suspended handler's chain is its
task's coroutine followed through what each awaits (``cr_await``), down to the
line it waits on and the future it waits for. The handler that runs now (its
task is the loop's current one, blocked or busy) has no await chain to follow:
its frames are read from the loop thread's stack instead, from its coroutine's
frame down to the line executing now. Everything is copied under the GIL, so a
loop that keeps running meanwhile at worst makes a chain a step out of date.
Each frame says whether it is the user's own (``user``): not actorch's, nor
the standard library's, nor an installed package's (torch...), which is what
``actorch stacks`` shows by default.
"""

from __future__ import annotations

import asyncio
import functools
import linecache
import os
import sys
import sysconfig
import threading
from collections.abc import Iterable
from time import perf_counter_ns
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actorch._engine.cell import Cell

__all__ = ["MAX_TASKS", "describe_frame", "is_user_file", "loop_stacks", "running_handler", "thread_stacks"]

MAX_TASKS = 200
"""Tasks other than handlers shown at most per node."""
_MAX_DEPTH = 64  # frames of one chain shown at most (innermost kept)
_current_tasks: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = asyncio.tasks._current_tasks  # type: ignore[attr-defined]


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """Folders whose files are not the user's: actorch's package, the standard library, installed packages."""
    paths = sysconfig.get_paths()
    found = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # actorch/
    found.update(os.path.abspath(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths)
    return tuple(sorted(os.path.join(root, "") for root in found))


@functools.cache
def is_user_file(path: str) -> bool:
    """Whether code in ``path`` is the user's own: not actorch's, the standard library's or an installed package's."""
    if path.startswith("<"):  # <frozen runpy>, <string>: Python's own
        return False
    absolute = os.path.abspath(path)
    if f"{os.sep}site-packages{os.sep}" in absolute or f"{os.sep}dist-packages{os.sep}" in absolute:
        return False
    return not absolute.startswith(_library_roots())


def describe_frame(frame: FrameType) -> dict[str, Any]:
    """One frame as plain data: file, line, function, the line's source text, and whether it is the user's."""
    code = frame.f_code
    line = frame.f_lineno
    return {
        "file": code.co_filename,
        "line": line,
        "function": code.co_name,
        "code": linecache.getline(code.co_filename, line).strip(),
        "user": is_user_file(code.co_filename),
    }


def _frames_of(frame: FrameType | None) -> list[FrameType]:
    """A thread's frames from its outermost to ``frame``."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    return frames


def thread_stacks(loop_thread: int | None = None) -> list[dict[str, Any]]:
    """Every thread of this process: its name, id, frames (outermost first), and whether it runs the loop.

    ``loop_thread`` is the id of the thread that runs the node's event loop,
    whose frames its handlers' and tasks' chains show already.
    """
    names = {thread.ident: thread for thread in threading.enumerate()}
    found = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        found.append(
            {
                "name": thread.name if thread is not None else f"thread {ident}",
                "id": ident,
                "daemon": thread.daemon if thread is not None else None,
                "loop": ident == loop_thread,
                "frames": [describe_frame(each) for each in _frames_of(frame)[-_MAX_DEPTH:]],
            }
        )
    found.sort(key=lambda thread: (thread["name"] != "MainThread", thread["name"]))
    return found


def _task_chain(task: asyncio.Task[Any], running: asyncio.Task[Any] | None, loop_frames: list[FrameType]) -> list[Any]:
    """A task's frames, outermost first, down to the line it is on; and what it waits for, if suspended."""
    coro: Any = task.get_coro()
    if task is running:  # it runs now: its frames are on the loop thread's stack
        top = getattr(coro, "cr_frame", None)
        for index, each in enumerate(loop_frames):
            if each is top:
                return [describe_frame(each) for each in loop_frames[index:][-_MAX_DEPTH:]]
    frames: list[FrameType] = []
    step = coro
    while step is not None and len(frames) < 4 * _MAX_DEPTH:
        frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None) or getattr(step, "ag_frame", None)
        if frame is None:
            break
        frames.append(frame)
        step = getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None) or getattr(step, "ag_await", None)
    chain: list[Any] = [describe_frame(frame) for frame in frames[-_MAX_DEPTH:]]
    waiting = getattr(task, "_fut_waiter", None)
    if waiting is not None:
        chain.append({"awaiting": repr(waiting)[:300]})
    return chain


def running_handler(cells: Iterable[Cell], loop: asyncio.AbstractEventLoop) -> dict[str, Any] | None:
    """The handler on the loop's thread now, if one is: its actor's ``label``, ``endpoint`` and ``seconds``.

    What blocks a loop that does not answer. Safe from any thread: it only
    reads. Of handlers that share the running task (a same-node call runs in
    its caller's), the one that began last is the one running.
    """
    running = _current_tasks.get(loop)
    if running is None:
        return None
    found = [
        (serving.started, cell.label, serving.endpoint)
        for cell in cells
        for serving in list(cell.active.values())
        if serving is not None and serving.task is running
    ]
    if not found:
        return None
    started, label, endpoint = max(found, key=lambda each: each[0])
    seconds = (perf_counter_ns() - started) / 1e9 if started else None
    return {"actor": label, "endpoint": endpoint, "seconds": seconds}


def loop_stacks(
    cells: Iterable[Cell], loop: asyncio.AbstractEventLoop, *, skip_ids: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each actor's running handlers with their chains, and the loop's other tasks; safe from any thread.

    Actors with ids up to ``skip_ids`` (the system's own) are left out, and
    their handlers count among the other tasks.
    """
    running = _current_tasks.get(loop)
    loop_thread = getattr(loop, "_thread_id", None)
    frame = sys._current_frames().get(loop_thread) if loop_thread is not None else None
    loop_frames = _frames_of(frame)
    now = perf_counter_ns()
    shown: set[asyncio.Task[Any]] = set()
    actors = []
    for cell in cells:
        if cell.actor_id <= skip_ids:
            continue
        handlers: list[dict[str, Any]] = []
        for serving in list(cell.active.values()):
            if serving is None:
                continue
            task = serving.task
            if task is not None:
                shown.add(task)
            handlers.append(
                {
                    "endpoint": serving.endpoint,
                    "seconds": (now - serving.started) / 1e9 if serving.started else None,
                    "running_now": task is not None and task is running,
                    "chain": [] if task is None else _task_chain(task, running, loop_frames),
                }
            )
        handlers.sort(key=lambda handler: -float(handler["seconds"] or 0.0))
        actors.append(
            {
                "id": cell.actor_id,
                "name": cell.name,
                "label": cell.label,
                "class": type(cell.instance).__qualname__,
                "queued": len(cell.queue),
                "handlers": handlers,
            }
        )
    others: list[dict[str, Any]] = []
    for task in asyncio.all_tasks(loop):
        if task in shown or len(others) >= MAX_TASKS:
            continue
        others.append(
            {"name": task.get_name(), "running_now": task is running, "chain": _task_chain(task, running, loop_frames)}
        )
    return actors, others
