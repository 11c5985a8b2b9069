"""``ActorGroup``: the same call to many actors at once, optionally split and reduced.

An :class:`ActorGroup` sends one call to every member concurrently and returns
the results in member order, or raises one ``GroupError`` naming the members
that failed. A partitioner (``partitioners.py``) splits the call's arguments
into one call per member and a reducer folds the results into one, as
``remote_async_call`` does in TorchOpt's distributed API. Without a
partitioner every member gets the same arguments, so the group sends them
with ``broadcast``: once per node, not once per member.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, Concatenate, Generic, NamedTuple, ParamSpec, TypeVar, overload

from actorch._actors.actor import Actor
from actorch._actors.broadcast import broadcast, broadcast_tell
from actorch._actors.ref import ActorRef
from actorch._base.errors import GroupError
from actorch._engine.batching import Batched
from actorch._stock.partitioners import Partitioner

__all__ = ["ActorGroup"]

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
Item = TypeVar("Item")  # what a batched endpoint takes per call

_REPR_MEMBERS = 4


class _MemberCall(NamedTuple):
    """One call of a group call: to the group's member ``member``, with its share of the arguments."""

    member: int
    ref: ActorRef[Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class ActorGroup(Generic[A]):
    """An ordered group of actor refs that are called together.

    ``await group.call(Worker.step, x)`` calls every member at once and returns
    their results in member order; ``group.tell(...)`` sends to every member. A
    group may carry a :class:`Partitioner` (see :meth:`partitioned`) that gives
    each member its own share of the arguments.

    Example:
        >>> workers: ActorGroup[Worker] = ActorGroup(await system.lookup_all("workers/*"))
        >>> losses = await workers.call(Worker.loss, params)            # list[float]
        >>> loss = await workers.partitioned(batch_partitioner).reduce(mean_reducer, Worker.loss, batch)
    """

    __slots__ = ("_partitioner", "_refs")

    def __init__(self, refs: Iterable[ActorRef[A]], *, partitioner: Partitioner | None = None) -> None:
        self._refs = tuple(refs)
        for index, ref in enumerate(self._refs):
            if not isinstance(ref, ActorRef):
                raise TypeError(f"an ActorGroup holds actor refs, but item {index} is {ref!r}")
        self._partitioner = partitioner

    def __repr__(self) -> str:
        shown = [_describe(ref) for ref in self._refs[:_REPR_MEMBERS]]
        if len(self._refs) > _REPR_MEMBERS:
            shown.append(f"... (+{len(self._refs) - _REPR_MEMBERS} more)")
        split = f" partitioned by {self._partitioner!r}" if self._partitioner is not None else ""
        return f"<ActorGroup of {len(self._refs)}{split}: {', '.join(shown)}>"

    def __len__(self) -> int:
        return len(self._refs)

    def __iter__(self) -> Iterator[ActorRef[A]]:
        return iter(self._refs)

    @overload
    def __getitem__(self, index: int) -> ActorRef[A]: ...

    @overload
    def __getitem__(self, index: slice) -> ActorGroup[A]: ...

    def __getitem__(self, index: int | slice) -> ActorRef[A] | ActorGroup[A]:
        if isinstance(index, slice):
            return ActorGroup(self._refs[index], partitioner=self._partitioner)
        return self._refs[index]

    @property
    def refs(self) -> tuple[ActorRef[A], ...]:
        """The members' refs, in group order."""
        return self._refs

    @property
    def partitioner(self) -> Partitioner | None:
        """The partitioner that splits each call's arguments among the members, or None."""
        return self._partitioner

    def partitioned(self, partitioner: Partitioner | None) -> ActorGroup[A]:
        """Return the same members with ``partitioner`` splitting every call (None: no splitting).

        The partitioner is an option of the group rather than of ``call``, so that
        every keyword argument of ``call`` reaches the endpoint.
        """
        return ActorGroup(self._refs, partitioner=partitioner)

    @overload
    async def call(self, method: Batched[A, Item, R], item: Item, /) -> list[R]: ...

    @overload
    async def call(
        self, method: Callable[Concatenate[A, P], Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> list[R]: ...

    @overload
    async def call(self, method: str, /, *args: Any, **kwargs: Any) -> list[Any]: ...

    async def call(self, method: Any, /, *args: Any, **kwargs: Any) -> list[Any]:
        """Call an endpoint of every member concurrently; return the results in member order.

        With a partitioner, each member gets its own share of the arguments and
        members it skips are not called: the list then holds the results of the
        members that were called, still in member order. The caller's deadline
        bounds the whole group call; cancelling it cancels every member call.

        Args:
            method: The endpoint, as ``ActorClass.method`` (type-checked) or its name.
            *args: Positional arguments for the endpoint.
            **kwargs: Keyword arguments for the endpoint.

        Raises:
            GroupError: Some member calls failed. It is raised once every call has
                ended; ``results`` holds each call's result or exception, and each
                exception carries a note naming its member.
            EndpointError: ``method`` is neither an actor method nor a name.
            TimeoutError: The caller's deadline passed; every member call is cancelled.
        """
        plan = self._plan(args, kwargs)
        # The member calls are created here, in the caller's task, and only then run
        # side by side: each one is awaited inside the caller's deadline scope. Both
        # raise EndpointError at once if ``method`` is no endpoint at all.
        if self._partitioner is None:
            calls = broadcast(self._refs, method, *args, **kwargs)  # the same arguments: sent once per node
        else:
            calls = [member.ref.call(method, *member.args, **member.kwargs) for member in plan]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancellation or interpreter exit from inside a member call: not a call failure
        _raise_failures(method, plan, outcomes)
        return outcomes

    @overload
    async def reduce(
        self,
        reducer: Callable[[list[R]], T],
        method: Callable[Concatenate[A, P], Awaitable[R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    @overload
    async def reduce(self, reducer: Callable[[list[Any]], T], method: str, /, *args: Any, **kwargs: Any) -> T: ...

    async def reduce(self, reducer: Callable[[list[Any]], Any], method: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Call every member like :meth:`call` and fold the list of results with ``reducer``.

        ``await group.reduce(mean_reducer, Worker.loss, batch)`` is
        ``mean_reducer(await group.call(Worker.loss, batch))``; the reducer comes
        first, positional-only, so that mypy checks it against the endpoint's
        result type and every keyword argument reaches the endpoint.

        Args:
            reducer: Takes the list of results (in member order) and returns one value.
            method: The endpoint, as ``ActorClass.method`` (type-checked) or its name.
            *args: Positional arguments for the endpoint.
            **kwargs: Keyword arguments for the endpoint.

        Raises:
            GroupError: Some member calls failed; the reducer is not called.
        """
        return reducer(await self.call(method, *args, **kwargs))

    @overload
    def tell(self, method: Batched[A, Item, Any], item: Item, /) -> None: ...

    @overload
    def tell(
        self, method: Callable[Concatenate[A, P], Awaitable[Any]], /, *args: P.args, **kwargs: P.kwargs
    ) -> None: ...

    @overload
    def tell(self, method: str, /, *args: Any, **kwargs: Any) -> None: ...

    def tell(self, method: Any, /, *args: Any, **kwargs: Any) -> None:
        """Send a message to every member without waiting (fire and forget).

        With a partitioner, each member is sent its own share and skipped members
        nothing. Every member is tried even when an earlier one refuses the message.

        Raises:
            GroupError: The message could not be sent to some members (bad endpoint
                or arguments, a value that cannot be sent); the others were sent it.
            EndpointError: ``method`` is neither an actor method nor a name.
        """
        plan = self._plan(args, kwargs)
        outcomes: list[Any] = [None] * len(plan)
        if self._partitioner is None:
            try:
                broadcast_tell(self._refs, method, *args, **kwargs)  # the same message: sent once per node
            except GroupError as exc:
                outcomes = exc.results
        else:
            for index, member in enumerate(plan):
                try:
                    member.ref.tell(method, *member.args, **member.kwargs)
                except Exception as exc:  # noqa: BLE001 - kept and raised in the GroupError below
                    outcomes[index] = exc
        _raise_failures(method, plan, outcomes)

    def _plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[_MemberCall]:
        """The member calls to make, in member order."""
        if self._partitioner is None:
            return [_MemberCall(index, ref, args, kwargs) for index, ref in enumerate(self._refs)]
        parts = self._partitioner(args, dict(kwargs), len(self._refs))
        if len(parts) != len(self._refs):
            raise ValueError(
                f"partitioner {self._partitioner!r} returned {len(parts)} entries for a group of {len(self._refs)}: "
                "it must return one (args, kwargs) or None per member"
            )
        plan: list[_MemberCall] = []
        for index, (ref, part) in enumerate(zip(self._refs, parts, strict=True)):
            if part is None:
                continue
            if not (
                isinstance(part, tuple)
                and len(part) == 2
                and isinstance(part[0], tuple | list)
                and isinstance(part[1], dict)
            ):
                raise TypeError(
                    f"partitioner {self._partitioner!r} gave member {index} {part!r}: "
                    "expected an (args tuple, kwargs dict) pair or None"
                )
            plan.append(_MemberCall(index, ref, tuple(part[0]), part[1]))
        return plan


def _describe(ref: ActorRef[Any]) -> str:
    if ref.name is not None:
        return f"actor {ref.name!r} on node {ref.rank}"
    cls = ref.actor_class
    return f"unnamed {cls.__name__ if cls is not None else 'actor'} on node {ref.rank}"


def _raise_failures(method: Any, plan: list[_MemberCall], outcomes: list[Any]) -> None:
    """Raise a GroupError naming the members whose outcome is an exception, if any.

    If ``method`` has no name, it is no endpoint at all: every member's ref refused
    it with the same ``EndpointError``, and that error is raised alone.
    """
    endpoint = method if type(method) is str else getattr(method, "__name__", None)
    if not isinstance(endpoint, str):
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return
    failed = GroupError.from_outcomes(
        f"calls to {endpoint!r}", lambda index: f"member {plan[index].member} ({_describe(plan[index].ref)})", outcomes
    )
    if failed is not None:
        raise failed
