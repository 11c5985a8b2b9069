"""Running a coroutine with some thread state held during its steps only.

Thread state (torch's current distributed autograd context, the current CUDA
device) belongs to whichever coroutine the loop's thread runs at the moment.
:func:`stepwise` sets it before each step of one coroutine, and restores what
it replaced when the step ends, so other coroutines of the thread see theirs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

__all__ = ["stepwise"]

T = TypeVar("T")
S = TypeVar("S")


class _Stepwise(Generic[S]):
    __slots__ = ("_awaitable", "_enter", "_leave")

    def __init__(self, awaitable: Awaitable[Any], enter: Callable[[], S], leave: Callable[[S], object] | None) -> None:
        self._awaitable = awaitable
        self._enter = enter
        self._leave = leave

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine: Any = self._awaitable.__await__()
        enter, leave = self._enter, self._leave
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            replaced = enter()
            try:
                if thrown is None:
                    waiting = coroutine.send(sent)
                else:
                    waiting, thrown = coroutine.throw(thrown), None
            except StopIteration as done:
                return done.value
            finally:
                if leave is not None:
                    leave(replaced)
            try:
                sent = yield waiting
            except BaseException as exc:  # noqa: BLE001 - cancellation and the rest go into the coroutine
                thrown, sent = exc, None


def stepwise(
    awaitable: Awaitable[T], enter: Callable[[], S], leave: Callable[[S], object] | None = None
) -> Awaitable[T]:
    """``awaitable``, with ``enter()`` called before each of its steps and ``leave(what enter returned)`` after it.

    Without ``leave`` the state set by ``enter`` stays after the step (nothing
    to restore: the next coroutine to run sets its own).
    """
    return _Stepwise(awaitable, enter, leave)
