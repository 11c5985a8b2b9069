"""The wire format of messages between nodes (the envelope), and how errors travel in replies.

Wire messages are msgpack arrays, the envelope of a message; their first item is the kind::

    [CALL,   call_id, actor_id, endpoint, remaining_s | None, chain, body | None]
    [TELL,   0,       actor_id, endpoint, None,               (),    body | None]
    [REPLY,  call_id, True,  body | None]            the result
    [REPLY,  call_id, False, [origin, type, message, traceback]]
    [CANCEL, call_id]
    [CREDIT, [actor_id, count, ...]]              tells done with, per actor (see ``flow``)
    [STREAM, stream_id, actor_id, endpoint, remaining_s | None, chain, body | None, window]
    [ITEM,   stream_id, body]                     one item of a stream, in order (see ``streaming``)
    [END,    stream_id, True, None]               the producer's generator finished
    [END,    stream_id, False, [origin, type, message, traceback]]
    [MORE,   stream_id, count]                    the consumer took ``count`` more items: credits
    [CLOSE,  stream_id]                           the consumer left the stream: stop the producer
    [CAST,   [call_id, ...] | None, [actor_id, ...], endpoint, remaining_s | None, chain, body | None]
                                                  one call (its ids, one per actor) or tell (None) to
                                                  several actors of a node, one body (see ``multicast``)

``body`` is ``[args, kwargs]`` (or the result) encoded by the codec, with tensors
beside it. An error's :class:`~actorch._engine.message.Origin` says what the
caller raises: a ``RemoteError`` for the handler's error, the same actorch error
for the runtime's, ``ActorStoppedError`` for an actor its node no longer hosts.
"""

from __future__ import annotations

import traceback
from typing import Any

from actorch._base import errors
from actorch._base.errors import MessageTooLargeError, RemoteError, remote_error
from actorch._engine.message import Origin

__all__ = [
    "CALL",
    "CANCEL",
    "CAST",
    "CLOSE",
    "CREDIT",
    "END",
    "ITEM",
    "MORE",
    "REPLY",
    "STREAM",
    "TELL",
    "check_size",
    "error_payload",
    "handler_error",
    "is_refusal",
    "message_size",
    "rebuild_error",
]

CALL, TELL, REPLY, CANCEL, CREDIT = 0, 1, 2, 3, 4
STREAM, ITEM, END, MORE, CLOSE = 5, 6, 7, 8, 9
CAST = 10


def error_payload(exc: BaseException, origin: Origin) -> list[Any]:
    """``[origin, type name, message, traceback text]`` of an error, for a reply."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(exc)) if origin == Origin.HANDLER else ""
    return [int(origin), name, str(exc), text]


def rebuild_error(payload: list[Any]) -> BaseException:
    """The exception a caller raises for an error reply's payload (``GONE`` is the caller's to word)."""
    origin, type_name, message, text = payload
    if origin == Origin.HANDLER:
        return remote_error(type_name, message, text)
    if type_name == "TimeoutError":
        return TimeoutError(message)
    cls = getattr(errors, type_name.rpartition(".")[2], None)
    if isinstance(cls, type) and issubclass(cls, errors.ActorchError):
        try:
            return cls(message)
        except TypeError:  # a class that needs more than a message (GroupError)
            pass
    return errors.ActorchError(f"{type_name}: {message}")


def handler_error(exc: BaseException) -> RemoteError:
    """What a local caller raises for a handler's exception: what a remote caller would get."""
    _, type_name, message, text = error_payload(exc, Origin.HANDLER)
    error = remote_error(type_name, message, text)
    error.__cause__ = exc
    return error


def is_refusal(exc: BaseException, origin: Origin) -> bool:
    """Whether the runtime refused a message as malformed (bad endpoint or arguments, unsendable)."""
    return origin == Origin.RUNTIME and isinstance(exc, (errors.EndpointError, errors.SerializationError))


def message_size(body: bytes | None, tensors: list[Any] | None) -> int:
    """Bytes a message carries: its encoded body and the data of its tensors."""
    size = len(body) if body is not None else 0
    if tensors:
        size += sum(getattr(tensor, "nbytes", 0) for tensor in tensors)
    return size


def check_size(body: bytes | None, tensors: list[Any] | None, limit: int, what: str, *parts: object) -> None:
    """Raise ``MessageTooLargeError`` if the message is over ``limit`` bytes.

    ``what.format(*parts)`` names the message; it is only formatted for the error.
    """
    size = message_size(body, tensors)
    if size > limit:
        raise MessageTooLargeError(
            f"{what.format(*parts)} takes {size:,} bytes, over the system's max_message_size of {limit:,}"
        )
