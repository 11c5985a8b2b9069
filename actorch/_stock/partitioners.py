"""Partitioners and reducers for group calls, after TorchOpt's distributed API.

A partitioner (:func:`dim_partitioner`, :data:`batch_partitioner`) splits one
call's arguments into one call per member of an :class:`~actorch.ActorGroup`; a
reducer (:func:`mean_reducer`, :func:`sum_reducer`) folds the members' results
into one. They are plain functions on arguments and results, apart from the
group so that they can be written, tested and replaced without any actor.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar, overload

import torch

__all__ = ["Partitioner", "batch_partitioner", "dim_partitioner", "mean_reducer", "sum_reducer"]

T = TypeVar("T")

_Part = tuple[tuple[Any, ...], dict[str, Any]]
"""The ``(args, kwargs)`` of one member's call."""


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
