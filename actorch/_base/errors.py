"""The exceptions actorch raises, all under one base class.

The tree::

    ActorchError
    ├── RemoteError             a handler raised; carries the remote type and traceback
    ├── EndpointError           unknown, private or ill-bound endpoint call (also TypeError)
    ├── ActorNotFoundError      no actor answers to that name or id (also LookupError)
    ├── NameTakenError          the name is already bound to a live actor
    ├── PlacementError          no node can give what spawn asked for (a Where, gpus=, device=), or it is leaving
    ├── InvalidNameError        the name breaks the naming rule (also ValueError)
    ├── SerializationError      a value cannot cross the wire (also TypeError)
    │   └── MessageTooLargeError    a message is over the system's max_message_size
    ├── MailboxFullError        a tell found no room in the actor's mailbox (a call waits instead)
    ├── ActorStoppedError       the actor stopped before or while handling the call
    ├── NodeLostError           the node hosting the actor died or became unreachable
    ├── SystemClosedError       the actor system is shut down or not running
    ├── UnsupportedError        the transport in use cannot do what was asked
    ├── JoinError               a process could not join a running (elastic) system
    ├── SnapshotError           a snapshot file is corrupt, truncated or foreign (also ValueError)
    ├── TraceRunningError       a timeline is recorded already: one at a time (also RuntimeError)
    └── GroupError              some calls of a group call failed (also ExceptionGroup)

A remote exception whose class can be imported on the caller is raised as an
instance of both ``RemoteError`` and that class, so ``except ValueError`` works
across nodes. That class prints as ``actorch.RemoteError(ValueError)``, and the
error carries a note (PEP 678) with the remote traceback, so that Python prints
the remote frames under the local ones.
"""

from __future__ import annotations

import builtins
import pkgutil
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "ActorNotFoundError",
    "ActorStoppedError",
    "ActorchError",
    "EndpointError",
    "GroupError",
    "InvalidNameError",
    "JoinError",
    "MailboxFullError",
    "MessageTooLargeError",
    "NameTakenError",
    "NodeLostError",
    "PlacementError",
    "RemoteError",
    "SerializationError",
    "SnapshotError",
    "SystemClosedError",
    "TraceRunningError",
    "UnsupportedError",
    "actor_stopped",
    "describe",
    "kind_of",
    "remote_error",
    "remote_error_of",
]


class ActorchError(Exception):
    """Base class of every error actorch raises."""


class RemoteError(ActorchError):
    """Raised when an actor's handler raised an exception on its node.

    Attributes:
        type_name: Qualified name of the remote exception class (``module.Qualname``).
        message: The remote exception's message, exactly as ``str(exc)`` gave it.
        remote_traceback: The formatted remote traceback, as text.
    """

    type_name: str
    message: str
    remote_traceback: str

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"RemoteError({self.type_name}: {self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # the state keeps the notes, where the remote traceback is shown
        return (remote_error, (self.type_name, self.message, self.remote_traceback), self.__dict__ or None)


class EndpointError(ActorchError, TypeError):
    """Raised when a call names an unknown or private endpoint, or its arguments do not bind."""


class ActorNotFoundError(ActorchError, LookupError):
    """Raised when no live actor answers to the name or id a caller asked for."""


class NameTakenError(ActorchError):
    """Raised when spawning under a name that a live actor already holds."""


class PlacementError(ActorchError):
    """Raised when a spawn cannot be placed: no node (or not node ``on``) has what it asked for, or it is leaving."""


class InvalidNameError(ActorchError, ValueError):
    """Raised when an actor name or pattern breaks the naming rule."""


class SerializationError(ActorchError, TypeError):
    """Raised when a value cannot be encoded for the wire (or strict mode refuses it)."""


class MessageTooLargeError(SerializationError):
    """Raised when a message (call, tell or result) is larger than the system's ``max_message_size``."""


class MailboxFullError(ActorchError):
    """Raised when a tell finds no room: a full mailbox, or a node that has not taken the send budget's bytes.

    The mailbox is full when ``mailbox_size`` messages from this node wait at
    the actor; the send budget is the bytes this node may have on their way to
    one node (``send_budget``, 256 MiB by default).

    A call in the same situation waits for room instead (within its deadline).
    """


class ActorStoppedError(ActorchError):
    """Raised when the target actor stopped before or while handling the call."""


class NodeLostError(ActorchError):
    """Raised when the node hosting the target actor died or can no longer be reached."""


class SystemClosedError(ActorchError):
    """Raised when the actor system has shut down, or is used outside its event loop."""


class UnsupportedError(ActorchError):
    """Raised when the transport in use cannot do what was asked (torch RRefs in-process)."""


class JoinError(ActorchError):
    """Raised when a process cannot join a running system: refused, not elastic, shutting down, or no answer."""


class SnapshotError(ActorchError, ValueError):
    """Raised when a snapshot file is corrupt, truncated or not an actorch snapshot."""


class TraceRunningError(ActorchError, RuntimeError):
    """Raised when a timeline is asked for (``system.trace``) on a node that records one already."""


class GroupError(ExceptionGroup[Exception], ActorchError):
    """Raised when some calls of a group call failed; the others' results are kept.

    Each member exception carries a note naming the member (its index, actor and
    node), so a traceback shows which calls failed.

    Attributes:
        results: One entry per member, in group order: its result, or the
            exception it raised.
        failed: The indices of the members whose call failed.
    """

    results: list[Any]
    failed: list[int]

    def __new__(cls, message: str, exceptions: Sequence[Exception], results: Sequence[Any] = ()) -> GroupError:
        self = super().__new__(cls, message, exceptions)
        self.results = list(results)
        self.failed = [index for index, value in enumerate(self.results) if any(value is e for e in exceptions)]
        return self

    def __init__(self, message: str, exceptions: Sequence[Exception], results: Sequence[Any] = ()) -> None:
        super().__init__(message, exceptions)

    def derive(self, excs: Sequence[Exception]) -> GroupError:  # type: ignore[override]
        """The same group call narrowed to ``excs`` (what ``except*`` and ``split`` build)."""
        return GroupError(self.message, excs, self.results)

    @classmethod
    def from_outcomes(
        cls, what: str, label: Callable[[int], str], outcomes: Sequence[Any], results: Sequence[Any] | None = None
    ) -> GroupError | None:
        """The one ``GroupError`` of a fan-out whose ``outcomes`` hold exceptions; None if none does.

        Every fan-out (group calls, broadcasts, shards, observers' streams) reports
        its failures this way, so they all read alike: ``2 of 4 calls to 'step'
        failed: member 1 (actor 'w/1' on node 1): ValueError: bad; ...``. Each
        failed member's exception gets a note naming it, for its traceback. A
        ``BaseException`` that is not an ``Exception`` (a cancellation) is no
        member's failure: it is raised as it is.

        Args:
            what: The fan-out, plural, as the message's subject: ``"calls to 'step'"``.
            label: The member at an index, as the message names it.
            outcomes: One entry per member: its result, or the exception it raised.
            results: The error's ``results`` when they are not ``outcomes`` itself.
        """
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome
        failed = [(index, outcome) for index, outcome in enumerate(outcomes) if isinstance(outcome, Exception)]
        if not failed:
            return None
        named: list[str] = []
        for index, error in failed:
            member = label(index)
            error.add_note(f"in {member}, one of the {what}")
            named.append(f"{member}: {describe(error)}")
        return cls(
            f"{len(failed)} of {len(outcomes)} {what} failed: {'; '.join(named)}",
            [error for _, error in failed],
            outcomes if results is None else results,
        )


def actor_stopped(what: str, label: str) -> ActorStoppedError:
    """The error a message gets whose actor has stopped: ``cannot call 'step' of actor 'w': the actor has stopped``."""
    return ActorStoppedError(f"cannot {what} of {label}: the actor has stopped")


_mixed_classes: dict[type[BaseException], type[RemoteError]] = {}


def describe(exc: BaseException) -> str:
    """An exception in one line for logs and messages: ``Type: message``."""
    return f"{kind_of(exc)}: {exc}"


def kind_of(exc: BaseException) -> str:
    """The class name that says what went wrong: a remote error's original class (``ValueError``)."""
    return exc.type_name.rpartition(".")[2] if isinstance(exc, RemoteError) else type(exc).__name__


def _import_exception_class(type_name: str) -> type[BaseException] | None:
    if "." not in type_name:
        found = getattr(builtins, type_name, None)
    elif type_name.startswith("actorch.") and type_name.rpartition(".")[2] in __all__:
        # actorch's own errors, also under the module paths older versions sent
        found = globals()[type_name.rpartition(".")[2]]
    else:
        try:
            found = pkgutil.resolve_name(type_name)
        except (ImportError, AttributeError, ValueError):
            return None
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def remote_error_of(exc: BaseException) -> RemoteError | None:
    """``exc`` as the ``RemoteError`` it is, typed so; None if no handler raised it on a node.

    A remote ``ValueError`` is caught by ``except ValueError as exc``, where a
    type checker sees a ``ValueError`` only: ``exc.remote_traceback`` type-checks
    as ``remote_error_of(exc).remote_traceback`` once None is ruled out (an
    error raised by local code is not remote).

    Args:
        exc: Any exception, as an ``except`` clause caught it.

    Returns:
        ``exc`` itself, if it is a ``RemoteError`` (its remote ``type_name``,
        ``message`` and ``remote_traceback`` then type-check); else None.
    """
    return exc if isinstance(exc, RemoteError) else None


def _mixed_class(original: type[BaseException]) -> type[RemoteError] | None:
    """``RemoteError`` mixed with ``original``, printed as ``actorch.RemoteError(ValueError)``; None if it cannot be."""
    mixed = _mixed_classes.get(original)
    if mixed is None:
        shown = (
            original.__qualname__
            if original.__module__ == "builtins"
            else f"{original.__module__}.{original.__qualname__}"
        )
        name = f"RemoteError({shown})"
        try:
            mixed = type(name, (RemoteError, original), {"__module__": "actorch", "__qualname__": name})
        except TypeError:  # layout conflict, e.g. two builtin bases
            return None
        _mixed_classes[original] = mixed
    return mixed


def remote_error(type_name: str, message: str, remote_traceback: str = "", raised_in: str = "") -> RemoteError:
    """Build the ``RemoteError`` for a remote exception, mixed with its class when importable.

    The mixed instance is created without calling the original ``__init__`` (its
    signature is unknown), so ``args`` is ``(message,)`` and ``str()`` is the message.
    With ``raised_in`` (where the handler ran: actor, endpoint, node, process),
    the error gets a note that shows the remote traceback under that line, which
    Python prints after the error's own traceback.
    """
    error = _remote_error(type_name, message, remote_traceback)
    if raised_in and remote_traceback:
        error.add_note(f"{raised_in}:\n{textwrap.indent(remote_traceback.rstrip(), '  ')}")
    return error


def _remote_error(type_name: str, message: str, remote_traceback: str) -> RemoteError:
    original = _import_exception_class(type_name)
    if original is None or issubclass(original, RemoteError):
        return RemoteError(type_name, message, remote_traceback)
    mixed = _mixed_class(original)
    if mixed is None:
        return RemoteError(type_name, message, remote_traceback)
    try:
        error = mixed.__new__(mixed)
        RemoteError.__init__(error, type_name, message, remote_traceback)
    except Exception:  # noqa: BLE001 - any class's __new__ may refuse (exception groups need theirs)
        return RemoteError(type_name, message, remote_traceback)
    return error


for _name in __all__:
    _public = globals()[_name]
    if isinstance(_public, type):
        _public.__module__ = "actorch"  # they print, and travel, as actorch.NodeLostError
