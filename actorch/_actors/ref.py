"""``ActorRef``: the typed, sendable handle to an actor on any node.

A ref knows where its actor lives (rank and id) and sends through its node's
:class:`~actorch._engine.caller.Caller`. Refs are made by :func:`make_ref` (the
runtime) and rebuilt from messages by the codec, never by users.
"""

from __future__ import annotations

import contextlib
import functools
import pkgutil
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from actorch._actors.actor import Actor, endpoints_of
from actorch._actors.restart import ActorExit
from actorch._actors.system_endpoints import ServiceEndpoints, system_call
from actorch._base.codec import current_context, register_extension
from actorch._base.constructors import NoPublicConstructor
from actorch._base.deadline import current_deadline
from actorch._base.errors import ActorStoppedError, EndpointError, NodeLostError, SystemClosedError
from actorch._base.names import actor_label
from actorch._engine.batching import Batched
from actorch._engine.caller import Caller
from actorch._engine.endpoints import check_call, endpoint_name
from actorch._engine.message import current_call
from actorch._engine.streaming import Stream, StreamRequest
from actorch._engine.system_ids import SERVICE_ID

__all__ = ["ActorRef", "make_ref", "resolve_class"]

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@functools.lru_cache(maxsize=1024)
def resolve_class(path: str) -> type[Actor] | None:
    """The actor class at ``module:Qualname``, or None if it cannot be imported here."""
    try:
        found = pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) and issubclass(found, Actor) else None


class ActorRef(Generic[A], metaclass=NoPublicConstructor):
    """A handle to an actor: call it, tell it, stop it, send it inside messages.

    Refs are made only by the runtime (``spawn``, ``lookup``, ``Actor.ref``). They
    compare equal when they point at the same actor, and can be sent to actors
    on other nodes, where they work the same.
    """

    __slots__ = ("_actor_id", "_caller", "_class_path", "_label", "_name", "_rank")

    _caller: Caller
    _rank: int
    _actor_id: int
    _name: str | None
    _class_path: str
    _label: str

    _made_by = "the runtime: use spawn() or lookup()"

    def __init__(self, caller: Caller, rank: int, actor_id: int, name: str | None, class_path: str) -> None:
        self._caller = caller
        self._rank = rank
        self._actor_id = actor_id
        self._name = name
        self._class_path = class_path
        short = class_path.rpartition(":")[2] or class_path
        self._label = actor_label(name, short, actor_id, rank)

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
        return resolve_class(self._class_path)

    @overload
    def call(self, method: Batched[A, T, R], item: T, /) -> Coroutine[Any, Any, R]: ...

    @overload
    def call(
        self, method: Callable[Concatenate[A, P], Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]: ...

    @overload
    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]: ...

    def call(self, method: Any, /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """Call an endpoint and return its result (await what ``call`` returns).

        A call to an actor on another node is sent before ``call`` returns, as
        ``rpc_async`` would send it, and what it returns is both a future and a
        coroutine: ``asyncio.gather`` takes thousands of them without a task
        each, and ``create_task`` or a task group takes them too. Cancelling it
        cancels the handler. A call to an actor on the caller's own node, or one
        made off the node's event loop (another thread), runs when it is
        awaited there. Either way, errors are raised where it is awaited.

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
        endpoint = method if type(method) is str else endpoint_name(method)
        deadline = current_deadline()
        return self._caller.call(self._rank, self._actor_id, endpoint, args, kwargs, self._label, deadline)

    @overload
    def stream(
        self, method: Callable[Concatenate[A, P], AsyncIterator[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Stream[T]: ...

    @overload
    def stream(self, method: str, /, *args: Any, **kwargs: Any) -> Stream[Any]: ...

    def stream(self, method: Any, /, *args: Any, **kwargs: Any) -> Stream[Any]:
        """Consume a streaming endpoint (an ``async def`` that ``yield``s): ``async for item in ref.stream(...)``.

        The stream opens when its first item is asked for. The producer runs
        at most ``window`` items ahead (credits; see :meth:`Stream.with_window`),
        items arrive in order and once each, and a running stream is a message
        being handled under the actor's concurrency rules. Leaving the loop
        early (``break``, an error, a cancelled task, a deadline) closes the
        producer's generator on its node; ``async with ref.stream(...) as items``
        closes it at a known moment. The deadline is read here, like a call's,
        and bounds the whole stream.

        Args:
            method: The streaming endpoint, as ``ActorClass.method`` (type-checked) or its name.
            *args: Positional arguments for the endpoint.
            **kwargs: Keyword arguments for the endpoint.

        Raises (inside the ``async for``):
            EndpointError: Unknown endpoint, one that does not yield (use ``call``), or bad arguments.
            RemoteError: The generator raised (also an instance of the original class).
            ActorStoppedError: The actor stopped before or while streaming.
            NodeLostError: The actor's node was lost.
            SerializationError: An argument or an item cannot be sent (``MessageTooLargeError`` if too large).
            TimeoutError: The deadline passed; the producer is stopped.
        """
        endpoint = method if type(method) is str else endpoint_name(method)
        context = current_call.get()
        chain, device = (context.child_chain(), context.device) if context is not None else ((), None)
        request = StreamRequest(
            self._rank, self._actor_id, endpoint, args, kwargs, self._label, current_deadline(), chain, device
        )
        return self._caller.streams.stream(request)

    @overload
    def tell(self, method: Batched[A, T, Any], item: T, /) -> None: ...

    @overload
    def tell(
        self, method: Callable[Concatenate[A, P], Awaitable[Any]], /, *args: P.args, **kwargs: P.kwargs
    ) -> None: ...

    @overload
    def tell(self, method: str, /, *args: Any, **kwargs: Any) -> None: ...

    def tell(self, method: Any, /, *args: Any, **kwargs: Any) -> None:
        """Send a message without waiting for its result (fire and forget).

        The endpoint and arguments are checked here when the actor class can be
        imported; tensors are copied at once, so the sender may reuse its own.
        A failure after sending is logged with the actor and endpoint.

        Args:
            method: The endpoint, as ``ActorClass.method`` (type-checked) or its name.
            *args: Positional arguments for the endpoint (one item for a batched one).
            **kwargs: Keyword arguments for the endpoint.

        Raises:
            EndpointError: Unknown or private endpoint, or arguments that do not bind.
            SerializationError: An argument cannot be sent (``MessageTooLargeError`` if too large).
            MailboxFullError: ``mailbox_size`` messages from this node already wait at the
                actor; nothing was sent (a call would wait for room).
        """
        endpoint = method if type(method) is str else endpoint_name(method)
        cls = resolve_class(self._class_path)
        if cls is not None:
            check_call(endpoints_of(cls), endpoint, args, kwargs, self._label, cls)
        self._caller.tell(self._rank, self._actor_id, endpoint, args, kwargs, self._label)

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
            return await system_call(
                self._caller,
                self._rank,
                SERVICE_ID,
                self._label,
                current_deadline(),
                ServiceEndpoints.wait_stopped,
                self._actor_id,
            )
        except NodeLostError as exc:
            return ActorExit("node_lost", str(exc))
        except ActorStoppedError as exc:  # the node left the system: its actors stopped first
            return ActorExit("node_left", str(exc))

    async def stop(self) -> None:
        """Stop the actor once its queued messages are handled; its name disappears.

        Returns when ``on_stop`` has run and the name is gone from every node.
        An actor in a process of its own (``Where(process="own")``) takes its
        process with it: stopped from another node, this returns once that
        process has also left the system (its node is no longer in
        ``system.nodes``); the process exits just after, and the node that
        started it reaps it at once. Stopped from its own process (by itself),
        it returns as soon as it has stopped, and the process leaves next.
        Stopping an actor that is already stopped does nothing.
        """
        if self._actor_id == SERVICE_ID:
            raise EndpointError(f"{self._label} is a system service and cannot be stopped")
        with contextlib.suppress(ActorStoppedError):  # its node left the system, stopping it
            await system_call(
                self._caller,
                self._rank,
                SERVICE_ID,
                self._label,
                current_deadline(),
                ServiceEndpoints.stop_actor,
                self._actor_id,
                self._rank != self._caller.rank,
            )

    async def _keep_snapshot(self, state: Any) -> bool:
        """Keep ``state`` for a relocation (``Actor.save_snapshot``): only a relocatable actor's ref does."""
        return False


def make_ref(caller: Caller, rank: int, actor_id: int, name: str | None, class_path: str) -> ActorRef[Any]:
    """A ref to actor ``actor_id`` on ``rank``, sending through ``caller`` (its node's)."""
    return ActorRef._create(caller, rank, actor_id, name, class_path)


def _rebuild(rank: int, actor_id: int, name: str | None, class_path: str) -> ActorRef[Any]:
    caller = current_context()
    if caller is None:
        raise SystemClosedError("an ActorRef can only be unpickled by actorch while it decodes a message")
    return make_ref(caller, rank, actor_id, name, class_path)


def _encode_ref(ref: ActorRef[Any]) -> list[Any]:
    return [ref._rank, ref._actor_id, ref._name, ref._class_path]


def _decode_ref(data: list[Any], caller: Any) -> ActorRef[Any]:
    return make_ref(caller, data[0], data[1], data[2], data[3])


register_extension(ActorRef, None, _encode_ref, _decode_ref)
