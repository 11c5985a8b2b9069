"""Where the outcome of a message goes when its sender is on this node, or did not wait (a tell).

A remote caller's reply is the callee's (:class:`~actorch._engine.callee.CallReply`).
How loud a failure is logged depends on who hears it: one its caller hears is
logged at debug level; a tell's, which nobody hears, as an error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from actorch._base.codec import Shared
from actorch._base.errors import describe
from actorch._engine.flow import FlowControl
from actorch._engine.message import Message, Origin, Reply
from actorch._engine.wire import handler_error, handler_traceback, is_refusal

__all__ = ["LocalReply", "TellDone", "log_heard_failure", "log_tell_failure"]


class LocalReply(Reply):
    """Settles a caller's future on this node as a remote reply would."""

    __slots__ = ("future", "label")

    def __init__(self, future: asyncio.Future[Any], label: str) -> None:
        self.future = future
        self.label = label  # the actor called, as the caller's ref names it

    def result(self, message: Message, value: Any) -> None:
        """Hand the caller the handler's result (the value of a :class:`~actorch.Shared` one)."""
        if not self.future.done():
            self.future.set_result(value.value if type(value) is Shared else value)

    def error(self, message: Message, exc: BaseException, origin: Origin) -> None:
        """Raise ``exc`` at the caller, as a ``RemoteError`` if the handler raised it."""
        if not self.future.done():
            if origin == Origin.HANDLER:
                exc = handler_error(exc, self.label, message.endpoint)
            self.future.set_exception(exc)


class TellDone(Reply):
    """Tells from one node to one actor are done with: each one's mailbox slot goes back, a failure is logged.

    ``src`` is the rank the tells came from, or None for tells from this node.
    One is shared by all such tells: it holds nothing of a single message.
    """

    __slots__ = ("actor_id", "flow", "label", "log", "src", "target")

    def __init__(self, flow: FlowControl, log: Any, src: int | None, actor_id: int, label: str) -> None:
        self.flow = flow
        self.log = log
        self.src = src
        self.actor_id = actor_id
        self.label = label
        self.target = (flow.rank, actor_id)  # the window a tell from this node holds a slot of

    def _done(self) -> None:
        if self.src is None:
            self.flow.release(self.target)
        else:
            self.flow.owe(self.src, self.actor_id)

    def result(self, message: Message, value: Any) -> None:
        """The handler returned: nobody waits for the value."""
        self._done()

    def error(self, message: Message, exc: BaseException, origin: Origin) -> None:
        """The tell failed: log it, unless the runtime refused it (it logged that already)."""
        self._done()
        if not is_refusal(exc, origin):
            log_tell_failure(self.log, self.label, message, exc, origin)


def log_tell_failure(log: Any, label: str, message: Message, exc: BaseException, origin: Origin) -> None:
    """Log a tell that failed: nobody waits for its result, so the log is where it shows.

    A handler's traceback goes under structlog's ``exception`` key, where
    renderers show it as a traceback (multi-line on a console), trimmed as a
    remote caller would see it.
    """
    text = handler_traceback(exc) if origin == Origin.HANDLER else None
    log.error(
        "tell failed",
        actor=label,
        endpoint=message.endpoint,
        call=f"{message.key:#x}",
        error=describe(exc),
        **({"exception": text} if text else {}),
    )


def log_heard_failure(log: Any, label: str, endpoint: str, exc: BaseException, origin: Origin) -> None:
    """Log, at debug level, a call that failed on this node: its caller hears the error, so it is no news here."""
    event = "handler failed" if origin == Origin.HANDLER else "message refused"
    log.debug(event, actor=label, endpoint=endpoint, error=describe(exc))
