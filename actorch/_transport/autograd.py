"""Distributed autograd contexts across the event loop: which context a send belongs to, and binding one to a task.

torch keeps the current distributed autograd context per thread, and records a
send into it only when the send happens on a thread where it is current. All
of a node's coroutines share the loop's thread, so actorch binds a context to
the steps of one coroutine (:func:`bound`): the thread holds the context while
that coroutine runs and lets it go whenever the coroutine waits. A handler
serving a call made inside a context runs bound to it, so its own calls and
its raw torch RPC are recorded too; :func:`in_autograd_context` gives any
coroutine a context of its own, which is how two tasks of one node hold two at once.

The thread's current context is read and set through torch's own
``DistAutogradContainer`` (``currentContextId``/``forceCurrentContextId``),
which torch exports but does not bind to Python.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

import torch
import torch.distributed.autograd as dist_autograd

from actorch._base.errors import UnsupportedError
from actorch._base.steps import stepwise

__all__ = [
    "NO_CONTEXT",
    "bound",
    "current_context_id",
    "explain_context_clash",
    "force_context_id",
    "in_autograd_context",
    "supported",
]

T = TypeVar("T")
P = ParamSpec("P")

NO_CONTEXT = -1
"""torch's id for "no distributed autograd context"."""

_CONTAINER = "_ZN5torch11distributed8autograd21DistAutogradContainer"


def _load() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    try:
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        current = getattr(library, f"{_CONTAINER}16currentContextIdEv")
        force = getattr(library, f"{_CONTAINER}21forceCurrentContextIdEl")
    except (OSError, AttributeError):
        return None
    current.restype, current.argtypes = ctypes.c_int64, []
    force.restype, force.argtypes = None, [ctypes.c_int64]
    return current, force


_functions = _load()


def supported() -> bool:
    """Whether this build of torch lets actorch read and bind the thread's autograd context."""
    return _functions is not None


def current_context_id() -> int:
    """The distributed autograd context current on this thread, or ``NO_CONTEXT``."""
    if _functions is None:
        return NO_CONTEXT
    return _functions[0]()


def force_context_id(context_id: int) -> int:
    """Make ``context_id`` (or ``NO_CONTEXT``) current on this thread; return the one it replaces."""
    if _functions is None:
        return NO_CONTEXT
    previous = _functions[0]()
    if previous != context_id:
        _functions[1](context_id)
    return previous


CONTEXT_CLASH = "Already have an autograd context id for this thread"
"""What torch says when a thread that holds a distributed autograd context opens another."""

CONTEXT_CLASH_HINT = (
    "Two distributed autograd contexts were open at once on this node: torch keeps one per thread, a node's "
    "actors share the event loop's thread, and `with dist_autograd.context()` keeps its context current across "
    "awaits. Open each with `await actorch.in_autograd_context(step, ...)`, which makes the context current only "
    "while `step` runs, so tasks of one node can hold contexts of their own at once."
)


def explain_context_clash(exc: BaseException) -> None:
    """Add a note naming the cause and the fix to torch's error for a second context on the loop's thread."""
    if (
        isinstance(exc, RuntimeError)
        and CONTEXT_CLASH in str(exc)
        and CONTEXT_CLASH_HINT not in getattr(exc, "__notes__", ())
    ):
        exc.add_note(CONTEXT_CLASH_HINT)


def bound(awaitable: Awaitable[T], context_id: int) -> Awaitable[T]:
    """``awaitable``, run with distributed autograd context ``context_id`` current on the thread during its steps."""
    return stepwise(awaitable, functools.partial(force_context_id, context_id), force_context_id)


async def in_autograd_context(
    fn: Callable[Concatenate[int, P], Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """Run ``fn(context_id, *args, **kwargs)`` in a new distributed autograd context of its own, then release it.

    What torch's ``with dist_autograd.context() as context_id:`` does, for a
    coroutine: the context is current on the thread only while ``fn`` runs, not
    while it waits, so other tasks of the node (other actors' handlers) can hold
    contexts of their own at the same time. Calls ``fn`` makes to actors, and raw
    torch RPC it makes, are recorded in the context; pass ``context_id`` to
    ``dist_autograd.backward``, ``get_gradients`` and ``DistributedOptimizer.step``.

    Raises:
        UnsupportedError: The system does not run on torch RPC (distributed
            autograd needs it), or this build of torch cannot bind a context.
    """
    if not supported():
        raise UnsupportedError("this build of torch does not let actorch bind distributed autograd contexts")
    previous = force_context_id(NO_CONTEXT)  # the thread may hold another task's context right now
    try:
        context_id = int(dist_autograd._new_context()._context_id())  # type: ignore[attr-defined]
    except RuntimeError as exc:
        raise UnsupportedError(f"distributed autograd needs a system on torch RPC (world_size >= 2): {exc}") from None
    finally:
        force_context_id(previous)
    try:
        return await bound(fn(context_id, *args, **kwargs), context_id)
    finally:
        dist_autograd._release_context(context_id)  # type: ignore[attr-defined]
