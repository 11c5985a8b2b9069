"""``broadcast`` and ``broadcast_tell``: the same call or tell to many actors, sent once per node.

The arguments are encoded once for each node that hosts some of the actors and
travel there as one message, which that node hands to each of its actors (see
``_engine/multicast.py``): a 40 MB tensor sent to 64 actors on 8 nodes crosses
the network 8 times, not 64. Each actor still has its own outcome.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from actorch._actors.actor import Actor, endpoints_of
from actorch._actors.ref import ActorRef, resolve_class
from actorch._base.deadline import current_deadline
from actorch._base.errors import GroupError
from actorch._engine.batching import Batched
from actorch._engine.caller import Caller
from actorch._engine.endpoints import check_call, endpoint_name
from actorch._engine.multicast import CastTarget, call_many, tell_many

__all__ = ["broadcast", "broadcast_tell"]

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@overload
def broadcast(refs: Iterable[ActorRef[A]], method: Batched[A, T, R], item: T, /) -> list[Coroutine[Any, Any, R]]: ...


@overload
def broadcast(
    refs: Iterable[ActorRef[A]], method: Callable[Concatenate[A, P], Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> list[Coroutine[Any, Any, R]]: ...


@overload
def broadcast(
    refs: Iterable[ActorRef[Any]], method: str, /, *args: Any, **kwargs: Any
) -> list[Coroutine[Any, Any, Any]]: ...


def broadcast(
    refs: Iterable[ActorRef[Any]], method: Any, /, *args: Any, **kwargs: Any
) -> list[Coroutine[Any, Any, Any]]:
    """Call the same endpoint of every actor with the same arguments; return one call per actor, in order.

    Each of the returned calls is what ``ref.call`` returns for its actor (await
    it, gather it, cancel it): its own result, its own error, its own deadline
    (the caller's, read here) and cancellation. What differs is the cost: the
    arguments are encoded once per node hosting some of the actors and sent
    there as one message, so each tensor crosses to a node once. Messages from
    this caller to each actor keep their order. The actors of one node share the
    arguments decoded there, so they must not change them (same-node calls pass
    them by reference already); actors on the caller's own node get them by
    reference.

    Args:
        refs: The actors, all of one system (one actor may appear more than once).
        method: The endpoint, as ``ActorClass.method`` (type-checked) or its name.
        *args: Positional arguments for the endpoint, the same for every actor.
        **kwargs: Keyword arguments for the endpoint, the same for every actor.

    Raises:
        EndpointError: ``method`` is neither an actor method nor a name.
        TypeError: An item of ``refs`` is not an ``ActorRef``.
        ValueError: The refs belong to different actor systems.
    """
    endpoint = endpoint_name(method)
    members, caller = _members(refs)
    if caller is None:
        return []
    return call_many(caller, [_target(ref) for ref in members], endpoint, args, kwargs, current_deadline())


@overload
def broadcast_tell(refs: Iterable[ActorRef[A]], method: Batched[A, T, Any], item: T, /) -> None: ...


@overload
def broadcast_tell(
    refs: Iterable[ActorRef[A]],
    method: Callable[Concatenate[A, P], Awaitable[Any]],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> None: ...


@overload
def broadcast_tell(refs: Iterable[ActorRef[Any]], method: str, /, *args: Any, **kwargs: Any) -> None: ...


def broadcast_tell(refs: Iterable[ActorRef[Any]], method: Any, /, *args: Any, **kwargs: Any) -> None:
    """Send every actor the same message without waiting (fire and forget), once per node.

    As ``ref.tell`` does, the endpoint and arguments are checked here for each
    actor whose class can be imported, and tensors are copied at once (once per
    node), so the sender may reuse its own. Every actor is tried even when
    others refuse the message.

    Args:
        refs: The actors to tell, as for :func:`broadcast`.
        method: The endpoint to tell, as for :func:`broadcast`.
        *args: The same positional arguments for each actor.
        **kwargs: The same keyword arguments for each actor.

    Raises:
        GroupError: Some actors were not sent the message (bad endpoint or
            arguments for their class, a value that cannot be sent, a full
            mailbox: ``MailboxFullError``); the others were. ``results`` holds
            None for each actor sent it and the error for each one not, in order.
        EndpointError: ``method`` is not an endpoint at all.
        TypeError: ``refs`` holds something other than an ``ActorRef``.
        ValueError: Not all of ``refs`` belong to one actor system.
    """
    endpoint = endpoint_name(method)
    members, caller = _members(refs)
    if caller is None:
        return
    outcomes: list[Exception | None] = [None] * len(members)
    checked: set[str] = set()  # classes these arguments bind for
    sent: list[int] = []
    for index, ref in enumerate(members):
        cls = None if ref._class_path in checked else resolve_class(ref._class_path)
        if cls is not None:
            try:
                check_call(endpoints_of(cls), endpoint, args, kwargs, ref._label, cls)
            except Exception as exc:  # noqa: BLE001 - this actor's refusal, raised with the others' below
                outcomes[index] = exc
                continue
            checked.add(ref._class_path)
        sent.append(index)
    told = tell_many(caller, [_target(members[index]) for index in sent], endpoint, args, kwargs)
    for index, outcome in zip(sent, told, strict=True):
        outcomes[index] = outcome
    failed = GroupError.from_outcomes(f"tells of {endpoint!r}", lambda index: members[index]._label, outcomes)
    if failed is not None:
        raise failed


def _target(ref: ActorRef[Any]) -> CastTarget:
    return ref._rank, ref._actor_id, ref._label


def _members(refs: Iterable[ActorRef[Any]]) -> tuple[tuple[ActorRef[Any], ...], Caller | None]:
    """The refs as a tuple, and the caller they all send through (their system's on this node; None if no refs)."""
    members = tuple(refs)
    for index, ref in enumerate(members):
        if not isinstance(ref, ActorRef):
            raise TypeError(f"a broadcast goes to actor refs, but item {index} is {ref!r}")
    if not members:
        return members, None
    caller = members[0]._caller
    for ref in members:
        if ref._caller is not caller:
            raise ValueError(
                f"a broadcast goes to actors of one system, but {ref!r} belongs to another than {members[0]!r}"
            )
    return members, caller
