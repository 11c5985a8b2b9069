"""The wire format of messages between nodes, and how errors travel in replies.

Wire messages are msgpack arrays; their first item is the kind::

    [CALL,   call_id, actor_id, endpoint, remaining_s | None, chain, body | None]
    [TELL,   0,       actor_id, endpoint, None,               (),    body | None]
    [REPLY,  call_id, True,  body | None]            the result
    [REPLY,  call_id, False, [origin, type, message, traceback]]
    [CANCEL, call_id]

``body`` is ``[args, kwargs]`` (or the result) encoded by the codec, with tensors
beside it. An error's origin says whether the handler raised it (it becomes a
``RemoteError``) or the runtime did (it arrives as the same actorch error).
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable
from typing import Any

from actorch import _errors
from actorch._errors import remote_error

__all__ = [
    "CALL",
    "CANCEL",
    "GONE",
    "HANDLER",
    "REPLY",
    "RUNTIME",
    "TELL",
    "error_payload",
    "handler_error",
    "rebuild_error",
    "settle",
]

CALL, TELL, REPLY, CANCEL = 0, 1, 2, 3
RUNTIME, HANDLER = 0, 1
GONE = "no longer hosts actor"
"""How a node starts the error for a call to an actor it no longer hosts."""


def error_payload(exc: BaseException, origin: int) -> list[Any]:
    """``[origin, type name, message, traceback text]`` of an error, for a reply."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(exc)) if origin == HANDLER else ""
    return [origin, name, str(exc), text]


def rebuild_error(payload: list[Any]) -> BaseException:
    """The exception a caller raises for an error reply's payload."""
    origin, type_name, message, text = payload
    if origin == HANDLER:
        return remote_error(type_name, message, text)
    if type_name == "TimeoutError":
        return TimeoutError(message)
    cls = getattr(_errors, type_name.rpartition(".")[2], None)
    if isinstance(cls, type) and issubclass(cls, _errors.ActorchError):
        try:
            return cls(message)
        except TypeError:  # a class that needs more than a message (GroupError)
            pass
    return _errors.ActorchError(f"{type_name}: {message}")


def handler_error(exc: BaseException) -> _errors.RemoteError:
    """What a local caller raises for a handler's exception: what a remote caller would get."""
    _, type_name, message, text = error_payload(exc, HANDLER)
    error = remote_error(type_name, message, text)
    error.__cause__ = exc
    return error


def settle(future: asyncio.Future[Any]) -> Callable[[bool, Any], None]:
    """A responder that settles a local caller's future as a remote reply would."""

    def respond(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            exc, origin = value
            future.set_exception(handler_error(exc) if origin == HANDLER else exc)

    return respond
