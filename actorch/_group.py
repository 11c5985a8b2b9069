"""Group calls: the same call to many actors at once, optionally split and reduced.

An :class:`ActorGroup` sends one call to every member concurrently and returns
the results in member order. A partitioner splits the call's arguments into one
call per member (:func:`dim_partitioner`, :data:`batch_partitioner`) and a
reducer folds the results into one (:func:`mean_reducer`, :func:`sum_reducer`),
as ``remote_async_call`` does in TorchOpt's distributed API.

Written against the public API only, as a user would write it.
"""

from __future__ import annotations

import asyncio
import numbers
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, Concatenate, Generic, NamedTuple, ParamSpec, Protocol, TypeVar, overload

import torch

from actorch._actor import Actor
from actorch._errors import EndpointError, GroupError
from actorch._ref import ActorRef

__all__ = ["ActorGroup", "Partitioner", "batch_partitioner", "dim_partitioner", "mean_reducer", "sum_reducer"]

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_Part = tuple[tuple[Any, ...], dict[str, Any]]
"""The ``(args, kwargs)`` of one member's call."""

_REPR_MEMBERS = 4


class _MemberCall(NamedTuple):
    """One call of a group call: to the group's member ``member``, with its share of the arguments."""

    member: int
    ref: ActorRef[Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Partitioner(Protocol):
    """Splits one call's arguments into one call per member of a group.

    Called with the call's positional and keyword arguments and the group's size,
    a partitioner returns exactly ``size`` entries, in member order: the
    ``(args, kwargs)`` that member is called with, or ``None`` to skip it.
    """

    def __call__(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], size: int, /
    ) -> Sequence[tuple[tuple[Any, ...], dict[str, Any]] | None]:
        """Return one ``(args, kwargs)`` or ``None`` per member."""
        ...


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
        endpoint = _endpoint_name(method)
        plan = self._plan(args, kwargs)
        # The member calls are created here, in the caller's task, and only then run
        # side by side: each one is awaited inside the caller's deadline scope.
        calls = [member.ref.call(method, *member.args, **member.kwargs) for member in plan]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancellation or interpreter exit from inside a member call: not a call failure
        _raise_failures(endpoint, plan, outcomes)
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
        endpoint = _endpoint_name(method)
        plan = self._plan(args, kwargs)
        outcomes: list[Any] = []
        for member in plan:
            try:
                member.ref.tell(method, *member.args, **member.kwargs)
            except Exception as exc:  # noqa: BLE001 - kept and raised in the GroupError below
                outcomes.append(exc)
            else:
                outcomes.append(None)
        _raise_failures(endpoint, plan, outcomes)

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


def _endpoint_name(method: Any) -> str:
    if type(method) is str:
        return method
    name = getattr(method, "__name__", None)
    if not isinstance(name, str):
        raise EndpointError(f"an endpoint is an actor method or its name, not {method!r}")
    return name


def _raise_failures(endpoint: str, plan: list[_MemberCall], outcomes: list[Any]) -> None:
    """Raise a GroupError naming the members whose outcome is an exception, if any."""
    failures: list[Exception] = []
    named: list[str] = []
    for call, outcome in zip(plan, outcomes, strict=True):
        if isinstance(outcome, Exception):
            member = f"member {call.member} ({_describe(call.ref)})"
            outcome.add_note(f"in {member} of the group call to {endpoint!r}")
            failures.append(outcome)
            named.append(f"{member}: {type(outcome).__name__}")
    if failures:
        raise GroupError(
            f"{len(failures)} of {len(plan)} calls to {endpoint!r} failed: {'; '.join(named)}", failures, outcomes
        )


# --------------------------------------------------------------------------- partitioners


class _DimPartitioner:
    """Splits every tensor of a call along one dimension; other values go whole to every member."""

    __slots__ = ("dim", "exclusive", "keepdim")

    def __init__(self, dim: int, exclusive: bool, keepdim: bool) -> None:
        self.dim = dim
        self.exclusive = exclusive
        self.keepdim = keepdim

    def __repr__(self) -> str:
        if (self.dim, self.exclusive, self.keepdim) == (0, False, True):
            return "batch_partitioner"
        return f"dim_partitioner({self.dim}, exclusive={self.exclusive}, keepdim={self.keepdim})"

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any], size: int, /) -> list[_Part | None]:
        if size < 1:
            raise ValueError(f"{self!r} cannot split a call among {size} members")
        found = [*_find_tensors(args, "args"), *_find_tensors(kwargs, "kwargs")]
        if not found:
            raise ValueError(f"{self!r} found no tensor to split in the call's arguments")
        length, first = self._common_length(found)
        if length == 0:
            raise ValueError(f"{self!r} cannot split {first}: it has length 0 along dim {self.dim}")
        if self.exclusive and length > size:
            raise ValueError(
                f"{self!r} gives each of the {length} items along dim {self.dim} its own member, "
                f"but the group has only {size}"
            )
        count = min(length, size)
        chunks: dict[int, Sequence[torch.Tensor]] = {}
        for _, tensor in found:
            # Exclusive splits have count == length: tensor_split gives the length-1 slices.
            split = tensor.tensor_split(count, dim=self.dim) if self.keepdim else tensor.unbind(dim=self.dim)
            chunks[id(tensor)] = split
        parts: list[_Part | None] = []
        for member in range(size):
            if member >= count:
                parts.append(None)
                continue

            def pick(tensor: torch.Tensor, member: int = member) -> torch.Tensor:
                return chunks[id(tensor)][member]

            parts.append((_map_tensors(args, pick), _map_tensors(kwargs, pick)))
        return parts

    def _common_length(self, found: list[tuple[str, torch.Tensor]]) -> tuple[int, str]:
        """The length of every tensor along ``dim`` (they must agree), and the first tensor's path."""
        first_path, first = found[0]
        for path, tensor in found:
            if not -tensor.dim() <= self.dim < tensor.dim():
                raise IndexError(
                    f"{self!r} cannot split {path} of shape {tuple(tensor.shape)}: "
                    f"dim {self.dim} is out of range for {tensor.dim()} dimension(s)"
                )
            if tensor.shape[self.dim] != first.shape[self.dim]:
                raise ValueError(
                    f"{self!r}: {path} has length {tensor.shape[self.dim]} along dim {self.dim}, "
                    f"but {first_path} has {first.shape[self.dim]}; every tensor must have the same length"
                )
        return first.shape[self.dim], first_path


def dim_partitioner(dim: int = 0, *, exclusive: bool = False, keepdim: bool = True) -> Partitioner:
    """Return a partitioner that splits every tensor of a call along ``dim``.

    Tensors among the positional and keyword arguments, also inside (named)
    tuples, lists and plain dicts, are split; every other value, a module or an
    ``OrderedDict`` state dict included, goes whole to every member. All tensors
    must have the same length along ``dim``.

    Args:
        dim: The dimension to split along (negative counts from the end).
        exclusive: If False, split into near-equal chunks (``tensor_split``), one
            per member; members beyond the length get nothing and are skipped. If
            True, give each item along ``dim`` its own member; a group smaller
            than the length is an error.
        keepdim: Keep ``dim`` in each member's share (a slice of length 1 when
            ``exclusive``); if False, each member gets ``tensor.select(dim, i)``.
            False is only allowed with ``exclusive=True``.

    Raises:
        ValueError: ``keepdim=False`` without ``exclusive=True``.

    The partitioner itself raises ``IndexError`` when ``dim`` is out of range for
    a tensor, and ``ValueError`` when the tensors' lengths disagree, are 0, or
    there is no tensor to split.
    """
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, not {dim!r}")
    if not keepdim and not exclusive:
        raise ValueError(
            "keepdim=False drops the split dimension, which only one item per member allows: pass exclusive=True too"
        )
    return _DimPartitioner(dim, exclusive, keepdim)


batch_partitioner: Partitioner = dim_partitioner(0)
"""Splits every tensor along its first (batch) dimension into near-equal chunks, one per member.

The same as ``dim_partitioner(0)``.
"""


def _find_tensors(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in ``value`` with their paths, walking exactly what :func:`_map_tensors` rebuilds."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif type(value) is dict:
        for key, item in value.items():
            yield from _find_tensors(item, f"{path}[{key!r}]")
    elif type(value) in (tuple, list) or _is_namedtuple(value):
        for index, item in enumerate(value):
            yield from _find_tensors(item, f"{path}[{index}]")


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) is dict:
        return {key: _map_tensors(item, fn) for key, item in value.items()}
    if type(value) is tuple:
        return tuple(_map_tensors(item, fn) for item in value)
    if type(value) is list:
        return [_map_tensors(item, fn) for item in value]
    if _is_namedtuple(value):
        return type(value)(*(_map_tensors(item, fn) for item in value))
    return value


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


# --------------------------------------------------------------------------- reducers


@overload
def mean_reducer(results: Sequence[int]) -> float: ...


@overload
def mean_reducer(results: Sequence[T]) -> T: ...


def mean_reducer(results: Sequence[Any]) -> Any:
    """Average a list of results: tensors, numbers, or tuples, lists and dicts of them, elementwise.

    Tensors must have equal shapes; integer tensors and numbers average to floats.

    Raises:
        ValueError: The list is empty, or the results' shapes, lengths or keys differ.
        TypeError: A result holds something else, or results disagree on a value's kind.
    """
    return _reduce(results, "mean_reducer", _mean_tensors, _mean_numbers)


@overload
def sum_reducer(results: Sequence[bool]) -> int: ...


@overload
def sum_reducer(results: Sequence[T]) -> T: ...


def sum_reducer(results: Sequence[Any]) -> Any:
    """Sum a list of results: tensors, numbers, or tuples, lists and dicts of them, elementwise.

    Raises:
        ValueError: The list is empty, or the results' shapes, lengths or keys differ.
        TypeError: A result holds something else, or results disagree on a value's kind.
    """
    return _reduce(results, "sum_reducer", lambda stacked: stacked.sum(dim=0), sum)


def _mean_tensors(stacked: torch.Tensor) -> torch.Tensor:
    if stacked.is_floating_point() or stacked.is_complex():
        return stacked.mean(dim=0)
    return stacked.sum(dim=0) / stacked.shape[0]


def _mean_numbers(values: list[Any]) -> Any:
    return sum(values) / len(values)


def _reduce(
    results: Sequence[Any],
    reducer: str,
    on_tensors: Callable[[torch.Tensor], torch.Tensor],
    on_numbers: Callable[[list[Any]], Any],
) -> Any:
    values = list(results)
    if not values:
        raise ValueError(f"{reducer} cannot reduce an empty list of results")
    return _Reduction(reducer, on_tensors, on_numbers).combine(values, "")


class _Reduction:
    """One reducer applied position by position through nested results (``path`` names the position)."""

    def __init__(
        self,
        reducer: str,
        on_tensors: Callable[[torch.Tensor], torch.Tensor],
        on_numbers: Callable[[list[Any]], Any],
    ) -> None:
        self.reducer = reducer
        self.on_tensors = on_tensors
        self.on_numbers = on_numbers

    def __repr__(self) -> str:
        return f"<_Reduction {self.reducer}>"

    def combine(self, values: list[Any], path: str) -> Any:
        first = values[0]
        for index, value in enumerate(values):
            if _kind(value) != _kind(first):
                raise TypeError(
                    f"{self.reducer}: results[{index}]{path} is {_kind(value)}, but results[0]{path} is {_kind(first)}"
                )
        if isinstance(first, torch.Tensor):
            for index, value in enumerate(values):
                if value.shape != first.shape:
                    raise ValueError(
                        f"{self.reducer}: results[{index}]{path} has shape {tuple(value.shape)}, "
                        f"but results[0]{path} has shape {tuple(first.shape)}"
                    )
            return self.on_tensors(torch.stack(values))
        if isinstance(first, numbers.Number):
            return self.on_numbers(values)
        if isinstance(first, tuple | list):
            return self._sequence(values, path)
        if isinstance(first, dict):
            return self._mapping(values, path)
        raise TypeError(
            f"{self.reducer} cannot reduce results[0]{path} of type {type(first).__name__}: "
            "results must be tensors, numbers, or tuples, lists and dicts of them"
        )

    def _sequence(self, values: list[Any], path: str) -> Any:
        first = values[0]
        for index, value in enumerate(values):
            if len(value) != len(first):
                raise ValueError(
                    f"{self.reducer}: results[{index}]{path} has {len(value)} items, "
                    f"but results[0]{path} has {len(first)}"
                )
        items = [self.combine([value[item] for value in values], f"{path}[{item}]") for item in range(len(first))]
        if _is_namedtuple(first):
            return type(first)(*items)
        return tuple(items) if isinstance(first, tuple) else items

    def _mapping(self, values: list[Any], path: str) -> Any:
        first = values[0]
        for index, value in enumerate(values):
            if value.keys() != first.keys():
                missing = sorted(map(repr, first.keys() - value.keys()))
                extra = sorted(map(repr, value.keys() - first.keys()))
                raise ValueError(
                    f"{self.reducer}: results[{index}]{path} has different keys from results[0]{path} "
                    f"(missing {', '.join(missing) or 'none'}; extra {', '.join(extra) or 'none'})"
                )
        reduced = {key: self.combine([value[key] for value in values], f"{path}[{key!r}]") for key in first}
        return OrderedDict(reduced) if isinstance(first, OrderedDict) else reduced


def _kind(value: Any) -> str:
    """What a reducer sees in ``value``; results must agree on it position by position."""
    if isinstance(value, torch.Tensor):
        return "a tensor"
    if isinstance(value, numbers.Number):
        return "a number"
    return f"of type {type(value).__name__}"
