"""``ActorRef``: the typed, sendable handle to an actor on any node."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from actorch._actors.actor import Actor, endpoints_of
from actorch._actors.restart import ActorExit
from actorch._base.codec import current_context, register_extension
from actorch._base.deadline import current_deadline
from actorch._base.errors import EndpointError, NodeLostError, SystemClosedError
from actorch._engine.batching import Batched

if TYPE_CHECKING:
    from actorch._engine.node import Node

__all__ = ["SERVICE_ID", "ActorRef"]

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

SERVICE_ID = 1
"""Actor id of every node's own service actor (spawn, stop, shutdown)."""

_REF_CODE = 16


@functools.lru_cache(maxsize=1024)
def _resolve_class(path: str) -> type[Actor] | None:
    module_name, _, qualname = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) and issubclass(found, Actor) else None


class ActorRef(Generic[A]):
    """A handle to an actor: call it, tell it, stop it, send it inside messages.

    Refs are made only by the runtime (``spawn``, ``lookup``, ``Actor.ref``). They
    compare equal when they point at the same actor, and can be sent to actors
    on other nodes, where they work the same.
    """

    __slots__ = ("_actor_id", "_class_path", "_label", "_name", "_node", "_rank")

    _node: Node
    _rank: int
    _actor_id: int
    _name: str | None
    _class_path: str
    _label: str

    def __init__(self) -> None:
        raise TypeError("ActorRef objects are made by the runtime: use spawn() or lookup()")

    @classmethod
    def _create(cls, node: Node, rank: int, actor_id: int, name: str | None, class_path: str) -> ActorRef[Any]:
        ref: ActorRef[Any] = object.__new__(cls)
        ref._node = node
        ref._rank = rank
        ref._actor_id = actor_id
        ref._name = name
        ref._class_path = class_path
        short = class_path.rpartition(":")[2] or class_path
        ref._label = f"actor {name!r} ({short}) on node {rank}" if name else f"actor {short}#{actor_id} on node {rank}"
        return ref

    def __repr__(self) -> str:
        return f"<ActorRef {self._label}>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ActorRef):
            return NotImplemented
        return (self._rank, self._actor_id) == (other._rank, other._actor_id)

    def __hash__(self) -> int:
        return hash((self._rank, self._actor_id))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._rank, self._actor_id, self._name, self._class_path))

    @property
    def name(self) -> str | None:
        """The name the actor was spawned under, or None."""
        return self._name

    @property
    def rank(self) -> int:
        """The rank of the node hosting the actor."""
        return self._rank

    @property
    def actor_class(self) -> type[Actor] | None:
        """The actor's class, if it can be imported here."""
        return _resolve_class(self._class_path)

    @overload
    def call(self, method: Batched[A, T, R], item: T, /) -> Coroutine[Any, Any, R]: ...

    @overload
    def call(
        self, method: Callable[Concatenate[A, P], Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]: ...

    @overload
    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]: ...

    def call(self, method: Any, /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """Call an endpoint and return its result (await the returned coroutine).

        The deadline is read where ``call`` is called, so calls made inside a
        deadline scope and awaited elsewhere (``asyncio.gather``, a task group)
        carry it too.

        Args:
            method: The endpoint, as ``ActorClass.method`` (type-checked) or its name.
            *args: Positional arguments for the endpoint (one item for a batched one).
            **kwargs: Keyword arguments for the endpoint.

        Raises:
            EndpointError: Unknown or private endpoint, or arguments that do not bind.
            RemoteError: The handler raised (also an instance of the original class).
            ActorStoppedError: The actor stopped before or while handling the call.
            NodeLostError: The actor's node was lost.
            MessageTooLargeError: The arguments or the result are over ``max_message_size``.
            TimeoutError: The caller's deadline passed (also while waiting for room in a
                full mailbox); the handler is cancelled.
        """
        endpoint = method if type(method) is str else _endpoint_name(method)
        deadline = current_deadline()
        return self._node.call(self._rank, self._actor_id, endpoint, args, kwargs, self._label, deadline)

    def tell(self, method: Any, /, *args: Any, **kwargs: Any) -> None:
        """Send a message without waiting for its result (fire and forget).

        The endpoint and arguments are checked here when the actor class can be
        imported; tensors are copied at once, so the sender may reuse its own.
        A failure after sending is logged with the actor and endpoint.

        Raises:
            EndpointError: Unknown or private endpoint, or arguments that do not bind.
            SerializationError: An argument cannot be sent (``MessageTooLargeError`` if too large).
            MailboxFullError: ``mailbox_size`` messages from this node already wait at the
                actor; nothing was sent (a call would wait for room).
        """
        endpoint = method if type(method) is str else _endpoint_name(method)
        cls = _resolve_class(self._class_path)
        if cls is not None:
            _check_call(cls, endpoint, args, kwargs, self._label)
        self._node.tell(self._rank, self._actor_id, endpoint, args, kwargs, self._label)

    async def wait_stopped(self) -> ActorExit:
        """Wait until the actor has stopped for good, and say how it ended.

        A restart is not a stop: this waits through restarts. Waits within the
        caller's deadline, like a call.

        Returns:
            How it ended: stopped, failed (no restart left), its node lost, or
            the system shut down.
        """
        if self._actor_id == SERVICE_ID:
            raise EndpointError(f"{self._label} is a system service: it stops with its node")
        try:
            exit_: ActorExit = await self._node.call(
                self._rank, SERVICE_ID, "wait_stopped", (self._actor_id,), {}, self._label, current_deadline()
            )
        except NodeLostError as exc:
            return ActorExit("node_lost", str(exc))
        return exit_

    async def stop(self) -> None:
        """Stop the actor once its queued messages are handled; its name disappears.

        Returns when ``on_stop`` has run and the name is gone from every node.
        Stopping an actor that is already stopped does nothing.
        """
        if self._actor_id == SERVICE_ID:
            raise EndpointError(f"{self._label} is a system service and cannot be stopped")
        await self._node.call(
            self._rank, SERVICE_ID, "stop_actor", (self._actor_id,), {}, self._label, current_deadline()
        )


def _endpoint_name(method: Any) -> str:
    name = getattr(method, "__name__", None)
    if not isinstance(name, str):
        raise EndpointError(f"an endpoint is an actor method or its name, not {method!r}")
    return name


def _check_call(cls: type[Actor], endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], label: str) -> None:
    handler = endpoints_of(cls).get(endpoint)
    if isinstance(handler, Batched):
        error = handler.check(args, kwargs, label)
        if error is not None:
            raise error
        return
    if handler is None:
        if endpoint.startswith("_"):
            raise EndpointError(f"{endpoint!r} of {label} is private: endpoints are public async methods")
        known = ", ".join(sorted(endpoints_of(cls))) or "none"
        raise EndpointError(f"{label} has no endpoint {endpoint!r} (endpoints: {known})")
    try:
        _signature(handler).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise EndpointError(f"bad arguments for {endpoint!r} of {label}: {exc}") from None


@functools.lru_cache(maxsize=1024)
def _signature(handler: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(handler)


def _rebuild(rank: int, actor_id: int, name: str | None, class_path: str) -> ActorRef[Any]:
    node = current_context()
    if node is None:
        raise SystemClosedError("an ActorRef can only be unpickled by actorch while it decodes a message")
    return ActorRef._create(node, rank, actor_id, name, class_path)


def _encode_ref(ref: ActorRef[Any]) -> list[Any]:
    return [ref._rank, ref._actor_id, ref._name, ref._class_path]


def _decode_ref(data: list[Any], node: Any) -> ActorRef[Any]:
    return ActorRef._create(node, data[0], data[1], data[2], data[3])


register_extension(ActorRef, _REF_CODE, _encode_ref, _decode_ref)
