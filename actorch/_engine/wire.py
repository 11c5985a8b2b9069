"""The wire format of messages between nodes (the envelope), and how errors travel in replies.

Wire messages are msgpack arrays, the envelope of a message; their first item is the kind::

    [CALL,   call_id, actor_id, endpoint, remaining_s | None, chain, body | None]
    [TELL,   0,       actor_id, endpoint, None,               (),    body | None]
    [REPLY,  call_id, True,  body | None]            the result
    [REPLY,  call_id, False, [origin, type, message, traceback, pid, host]]
    [CANCEL, call_id]
    [CREDIT, [actor_id, count, ...]]              tells done with, per actor (see ``flow``)
    [STREAM, stream_id, actor_id, endpoint, remaining_s | None, chain, body | None, window]
    [ITEM,   stream_id, body]                     one item of a stream, in order (see ``streaming``)
    [END,    stream_id, True, None]               the producer's generator finished
    [END,    stream_id, False, [origin, type, message, traceback, pid, host]]
    [MORE,   stream_id, count]                    the consumer took ``count`` more items: credits
    [CLOSE,  stream_id]                           the consumer left the stream: stop the producer
    [CAST,   [call_id, ...] | None, [actor_id, ...], endpoint, remaining_s | None, chain, body | None]
                                                  one call (its ids, one per actor) or tell (None) to
                                                  several actors of a node, one body (see ``multicast``)

``body`` is ``[args, kwargs]`` (or the result) encoded by the codec, with tensors
beside it. A ``CALL``, ``TELL`` or ``STREAM`` may end with one more element,
what its sender's instruments carry for the receiving node's (a dict: the
OpenTelemetry propagator's headers, a timeline's arrow id), and a ``CAST``
with a list of them, one per actor (see ``instruments``); otherwise, and
whenever no instrument carries anything, envelopes are as above.

An error's :class:`~actorch._engine.message.Origin` says what the caller raises:
a ``RemoteError`` for the handler's error, the same actorch error for the
runtime's, ``ActorStoppedError`` for an actor its node no longer hosts.
A handler's error carries its traceback as text, without the runtime's frames
that ran the handler, and the process it was raised in; the caller shows both
in a note under the actor and endpoint it called.
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import TYPE_CHECKING, Any

from actorch._base import errors
from actorch._base.errors import MessageTooLargeError, RemoteError, SerializationError, remote_error
from actorch._engine.message import Origin
from actorch._transport.autograd import explain_context_clash

if TYPE_CHECKING:
    from actorch._base.codec import Codec

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
    "encode_message",
    "error_payload",
    "handler_error",
    "handler_traceback",
    "is_refusal",
    "message_size",
    "rebuild_error",
]

CALL, TELL, REPLY, CANCEL, CREDIT = 0, 1, 2, 3, 4
STREAM, ITEM, END, MORE, CLOSE = 5, 6, 7, 8, 9
CAST = 10


_RUNTIME_FILES = os.path.dirname(os.path.dirname(__file__)) + os.sep
_STOCK_FILES = os.path.join(_RUNTIME_FILES, "_stock") + os.sep


def error_payload(exc: BaseException, origin: Origin) -> list[Any]:
    """``[origin, type name, message, traceback text, pid, host]`` of an error, for a reply.

    A ``RemoteError`` passed on (a handler that did not catch its own call's
    error) travels under its original type name, so the next caller can still
    catch it as that class. torch's error for a second distributed autograd
    context on the loop's thread gets a note that names the fix.
    """
    if isinstance(exc, RemoteError):
        name = exc.type_name
    else:
        kind = type(exc)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = ""
    if origin == Origin.HANDLER:
        explain_context_clash(exc)
        text = handler_traceback(exc)
    return [int(origin), name, str(exc), text, os.getpid(), socket.gethostname()]


def handler_traceback(exc: BaseException) -> str:
    """The traceback of a handler's error as text, from the first frame that is not the runtime's own.

    The frames of the runtime that ran the handler (the mailbox worker, the
    deadline and device wrappers) say nothing about the error; the stock
    actors' frames are user-level code and stay. Remote tracebacks and the
    logs of failures nobody hears (a tell's, an actor's) show this text.
    """
    summary = traceback.TracebackException.from_exception(exc)
    frames = summary.stack
    start = next((index for index, frame in enumerate(frames) if not _is_runtime(frame.filename)), 0)
    if start:
        summary.stack = traceback.StackSummary.from_list(frames[start:])
    return "".join(summary.format())


def _is_runtime(filename: str) -> bool:
    return filename.startswith(_RUNTIME_FILES) and not filename.startswith(_STOCK_FILES)


def rebuild_error(payload: list[Any], label: str, endpoint: str) -> BaseException:
    """The exception a caller of ``endpoint`` of ``label`` raises for an error reply's payload.

    (``GONE`` is the caller's to word.)
    """
    origin, type_name, message, text, pid, host = payload
    if origin == Origin.HANDLER:
        return remote_error(type_name, message, text, _raised_in(label, endpoint, pid, host))
    if type_name == "TimeoutError":
        return TimeoutError(message)
    cls = getattr(errors, type_name.rpartition(".")[2], None)
    if isinstance(cls, type) and issubclass(cls, errors.ActorchError):
        try:
            return cls(message)
        except TypeError:  # a class that needs more than a message (GroupError)
            pass
    return errors.ActorchError(f"{type_name}: {message}")


def _raised_in(label: str, endpoint: str, pid: int, host: str) -> str:
    """The line above a remote traceback: the endpoint, the actor and its node, the process."""
    return f"Raised in {endpoint!r} of {label}, pid {pid} on host {host}; the remote traceback"


def handler_error(exc: BaseException, label: str, endpoint: str) -> RemoteError:
    """What a caller on this node raises for a handler's exception: what a remote caller would get.

    ``exc`` itself stays reachable as the error's ``__context__`` (for a
    debugger), but is not printed: the note shows its traceback, as for a
    remote caller.
    """
    _, type_name, message, text, pid, host = error_payload(exc, Origin.HANDLER)
    error = remote_error(type_name, message, text, _raised_in(label, endpoint, pid, host))
    error.__context__ = exc
    error.__suppress_context__ = True
    return error


def is_refusal(exc: BaseException, origin: Origin) -> bool:
    """Whether the runtime refused a message as malformed (bad endpoint or arguments, unsendable)."""
    return origin == Origin.RUNTIME and isinstance(exc, (errors.EndpointError, errors.SerializationError))


def message_size(body: bytes | None, tensors: list[Any] | None) -> int:
    """Bytes of host memory a message carries by value: its encoded body and the data of its host tensors.

    Tensors that go device to device (a device map) are left out: they never
    pass through host memory. So are those sent by reference (shared memory,
    CUDA IPC), which are not on the side list at all.
    """
    size = len(body) if body is not None else 0
    if tensors:
        size += sum(tensor.nbytes for tensor in tensors if getattr(tensor, "is_cpu", False))
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


def encode_message(
    codec: Codec, value: Any, limit: int | None, what: str, *parts: object, **options: Any
) -> tuple[bytes, list[Any]]:
    """``value`` encoded as a message's body, at most ``limit`` bytes (None: any size, for this node's actors).

    ``what.format(*parts)`` names the message (``call to 'add' of actor 'c'
    (Counter) on node 1``) and begins any refusal, so that a value the codec
    cannot carry says which message it was in, after the codec has said where
    in the value it sits; it is only formatted for the error. ``options`` are
    ``Codec.encode``'s.

    Raises:
        SerializationError: A part of ``value`` cannot be encoded
            (``MessageTooLargeError``: the message is over ``limit``).
    """
    try:
        body, tensors = codec.encode(value, **options)
    except SerializationError as exc:
        raise SerializationError(f"{what.format(*parts)}: {exc}") from exc.__cause__
    if limit is not None:
        try:
            check_size(body, tensors, limit, what, *parts)
        except MessageTooLargeError:
            codec.drop(body)  # it will never be sent: what its tensors lend goes back
            raise
    return body, tensors
