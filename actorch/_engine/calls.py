"""``RemoteCall``: a call on its way to another node, which is both a future and a coroutine.

``ref.call`` sends a call to another node at once and returns this object. As a
future, ``asyncio.gather`` and ``asyncio.wait`` take it as it is, without a task
of their own: thousands of calls in flight cost no task each. As a coroutine,
everything that wants one (``asyncio.create_task``, task groups, anyio's
``start_soon``) takes it too. Cancelling it, or the task awaiting it, cancels
the call at the callee. While instruments observe what the node sends, a call
is an :class:`ObservedCall`, their record of it, which tells them its outcome
the moment it has one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._engine.flow import Target
from actorch._engine.instruments import LOCAL, Outgoing, Verb

if TYPE_CHECKING:
    import torch

    from actorch._engine.instruments import Instruments

__all__ = ["ObservedCall", "RemoteCall"]

T = TypeVar("T")


class RemoteCall(asyncio.Future[T], Coroutine[Any, Any, T]):
    """The result of a call sent to another node, to be awaited (or gathered, or made a task)."""

    __slots__ = ("_abandon", "_steps", "call_id", "device", "endpoint", "label", "sent_at", "target", "waiting")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        target: Target,
        endpoint: str,
        label: str,
        abandon: Callable[[RemoteCall[Any]], None],
    ) -> None:
        super().__init__(loop=loop)
        self.target = target
        self.endpoint = endpoint
        self.label = label
        self.device: torch.device | None = None  # where staged tensors of the result go: the calling actor's device
        self.call_id = 0  # 0 until sent
        self.sent_at = 0.0  # time.monotonic() when sent: what Ctrl-C reports as waited for, and how long
        self.waiting: asyncio.Task[None] | None = None  # sends it once the mailbox has room
        self._abandon: Callable[[RemoteCall[Any]], None] | None = abandon
        self._steps: Generator[Any, None, T] | None = None

    def __repr__(self) -> str:
        state = "done" if self.done() else "waiting for room" if self.call_id == 0 else "sent"
        return f"<RemoteCall {self.endpoint!r} of {self.label} {state}>"

    def cancel(self, msg: Any | None = None) -> bool:
        """Cancel the call: it leaves the mailbox line, or is cancelled at the callee."""
        if not super().cancel(msg):
            return False
        abandon, self._abandon = self._abandon, None
        if abandon is not None:
            abandon(self)
        return True

    def settled(self) -> None:
        """The call has its outcome: nothing is left to cancel at the callee."""
        self._abandon = None

    # ------------------------------------------------------------------ as a coroutine

    def send(self, value: Any) -> Any:
        """Step the call as a coroutine would be stepped (by a task): yield until it is done."""
        steps = self._steps
        if steps is None:
            steps = self._steps = self.__await__()
        return steps.send(value)

    def throw(
        self,
        typ: type[BaseException] | BaseException,
        val: BaseException | object = None,
        tb: TracebackType | None = None,
    ) -> Any:
        """Raise ``typ`` in the awaiting code: the awaiter gave up, so the call is cancelled."""
        self.cancel()
        if isinstance(typ, BaseException):
            raise typ
        raise val if isinstance(val, BaseException) else typ()

    def close(self) -> None:
        """Give up the call, as closing an unfinished coroutine would."""
        self.cancel()


class ObservedCall(RemoteCall[T], Outgoing):
    """A remote call that instruments observe: its own record (``Outgoing``), its outcome reported as it is set.

    Being its own record spares each call in flight a second object while
    instruments observe. Its outcome is reported where it is set, not from a
    done callback, which would cost each call one more turn of the loop while
    a trace runs.

    Args:
        loop: As ``RemoteCall``'s.
        target: As ``RemoteCall``'s.
        endpoint: As ``RemoteCall``'s.
        label: As ``RemoteCall``'s.
        abandon: As ``RemoteCall``'s.
        instruments: The node's: the call is reported ``sending`` to them now, before it is sent.
    """

    __slots__ = ("_instruments", "actor_id", "carrier", "ident", "notes", "path", "rank")

    verb: Verb = "call"  # a class attribute: every one is a call

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        target: Target,
        endpoint: str,
        label: str,
        abandon: Callable[[RemoteCall[Any]], None],
        instruments: Instruments,
    ) -> None:
        super().__init__(loop, target, endpoint, label, abandon)
        self.rank, self.actor_id = target
        self.path = LOCAL if self.rank == instruments.rank else None
        self.ident = 0
        self.carrier = None
        self.notes = None
        self._instruments = instruments
        instruments.began(self)

    def set_result(self, result: T, /) -> None:
        """Settle the call with its result, and report it."""
        super().set_result(result)
        self._instruments.settle(self)

    def set_exception(self, exception: type | BaseException, /) -> None:
        """Settle the call with its error, and report it."""
        error = exception if isinstance(exception, BaseException) else exception()
        super().set_exception(error)
        self._instruments.settle(self, error)

    def cancel(self, msg: Any | None = None) -> bool:
        """Cancel the call (see ``RemoteCall.cancel``), and report it cancelled."""
        if not super().cancel(msg):
            return False
        self._instruments.settle(self, outcome="cancelled")
        return True
