"""The wire format of messages between nodes, and how errors travel in replies.

Wire messages are msgpack arrays; their first item is the kind::

    [CALL,   call_id, actor_id, endpoint, remaining_s | None, chain, body | None]
    [TELL,   0,       actor_id, endpoint, None,               (),    body | None]
    [REPLY,  call_id, True,  body | None]            the result
    [REPLY,  call_id, False, [origin, type, message, traceback]]
    [CANCEL, call_id]
    [CREDIT, [actor_id, count, ...]]              tells done with, per actor (see ``_flow``)

``body`` is ``[args, kwargs]`` (or the result) encoded by the codec, with tensors
beside it. An error's origin says whether the handler raised it (it becomes a
``RemoteError``) or the runtime did (it arrives as the same actorch error).
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable
from typing import Any

from actorch._base import errors as _errors
from actorch._base.errors import remote_error

__all__ = [
    "CALL",
    "CANCEL",
    "CREDIT",
    "GONE",
    "HANDLER",
    "REPLY",
    "RUNTIME",
    "TELL",
    "describe",
    "error_payload",
    "handler_error",
    "is_refusal",
    "log_tell_failure",
    "message_size",
    "rebuild_error",
    "settle",
]

CALL, TELL, REPLY, CANCEL, CREDIT = 0, 1, 2, 3, 4
RUNTIME, HANDLER = 0, 1
GONE = "no longer hosts actor"
"""How a node starts the error for a call to an actor it no longer hosts."""


def describe(exc: BaseException) -> str:
    """An exception in one line for logs and messages: ``Type: message``."""
    return f"{type(exc).__name__}: {exc}"


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


def is_refusal(exc: BaseException, origin: int) -> bool:
    """Whether the runtime refused a message as malformed (bad endpoint or arguments, unsendable)."""
    return origin == RUNTIME and isinstance(exc, (_errors.EndpointError, _errors.SerializationError))


def log_tell_failure(log: Any, label: str, envelope: Any, exc: BaseException, origin: int = RUNTIME) -> None:
    """Log a tell that failed: nobody waits for its result, so the log is where it shows."""
    log.error(
        "tell failed",
        actor=label,
        endpoint=envelope.endpoint,
        call=f"{envelope.key:#x}",
        error=describe(exc),
        traceback=error_payload(exc, origin)[3] or None,
    )


def message_size(body: bytes | None, tensors: list[Any] | None) -> int:
    """Bytes a message carries: its encoded body and the data of its tensors."""
    size = len(body) if body is not None else 0
    if tensors:
        size += sum(getattr(tensor, "nbytes", 0) for tensor in tensors)
    return size


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
