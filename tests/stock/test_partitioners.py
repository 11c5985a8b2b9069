"""Partitioners split a group call's arguments among members; reducers fold the members' results.

Plain functions, tested without any actor: the group calls that use them are in
``test_group.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

import pytest
import torch

from actorch.group import batch_partitioner, dim_partitioner, mean_reducer, sum_reducer


class Point(NamedTuple):
    x: Any
    y: Any


def same(a: Any, b: Any) -> bool:
    """Structural equality where tensors compare by value (``==`` on tensors gives tensors)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and bool(torch.allclose(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


# --------------------------------------------------------------------------- partitioners


def test_batch_partitioner_splits_into_near_equal_chunks() -> None:
    batch = torch.arange(7)
    parts = batch_partitioner((batch,), {}, 3)
    assert [part[0][0].tolist() for part in parts if part is not None] == [[0, 1, 2], [3, 4], [5, 6]]


def test_dim_partitioner_splits_along_the_given_dimension() -> None:
    batch = torch.arange(24).reshape(2, 3, 4)
    for dim in (1, -2):
        parts = dim_partitioner(dim)((batch,), {}, 2)
        assert [part[0][0].shape for part in parts if part is not None] == [(2, 2, 4), (2, 1, 4)]
    last = dim_partitioner(-1)((batch,), {}, 4)
    assert [part[0][0].shape for part in last if part is not None] == [(2, 3, 1)] * 4


def test_dim_partitioner_skips_members_beyond_the_length() -> None:
    parts = batch_partitioner((torch.arange(2),), {}, 4)
    assert [None if part is None else part[0][0].tolist() for part in parts] == [[0], [1], None, None]


def test_dim_partitioner_splits_keyword_and_nested_tensors_and_passes_others_whole() -> None:
    rows = torch.arange(4)
    state = OrderedDict(weight=torch.ones(2, 2))
    module = torch.nn.Linear(2, 2)
    args = (rows, "text", {"obs": rows * 10, "meta": 5}, [rows, (rows,)], Point(rows, 1.0), state, module)
    parts = dim_partitioner(0)(args, {"mask": rows > 1, "lr": 0.1}, 2)
    first = parts[0]
    assert first is not None
    (a, text, nested, listed, point, whole_state, whole_module), kwargs = first
    assert a.tolist() == [0, 1]
    assert text == "text"
    assert nested["obs"].tolist() == [0, 10]
    assert nested["meta"] == 5
    assert type(listed) is list
    assert listed[0].tolist() == [0, 1]
    assert type(listed[1]) is tuple
    assert listed[1][0].tolist() == [0, 1]
    assert type(point) is Point
    assert point.x.tolist() == [0, 1]
    assert point.y == 1.0
    assert whole_state is state, "an OrderedDict (a state dict) is passed whole"
    assert whole_module is module
    assert kwargs["mask"].tolist() == [False, False]
    assert kwargs["lr"] == 0.1


def test_dim_partitioner_exclusive_gives_each_item_its_own_member() -> None:
    batch = torch.arange(6).reshape(2, 3)
    dropped = dim_partitioner(0, exclusive=True, keepdim=False)((batch,), {}, 3)
    assert [None if part is None else part[0][0].tolist() for part in dropped] == [[0, 1, 2], [3, 4, 5], None]
    kept = dim_partitioner(1, exclusive=True)((batch,), {}, 3)
    assert [part[0][0].tolist() for part in kept if part is not None] == [[[0], [3]], [[1], [4]], [[2], [5]]]


def test_dim_partitioner_exclusive_needs_a_member_per_item() -> None:
    with pytest.raises(ValueError, match="each of the 4 items along dim 0 its own member, but the group has only 3"):
        dim_partitioner(0, exclusive=True)((torch.zeros(4),), {}, 3)


def test_dim_partitioner_refuses_tensors_of_different_lengths() -> None:
    with pytest.raises(
        ValueError, match=r"kwargs\['b'\]\[1\] has length 3 along dim 0, but args\[0\] has 4; every tensor must"
    ):
        batch_partitioner((torch.zeros(4),), {"b": [torch.zeros(4), torch.zeros(3)]}, 2)


def test_dim_partitioner_refuses_a_dim_out_of_range() -> None:
    with pytest.raises(IndexError, match=r"cannot split args\[1\] of shape \(4,\): dim 1 is out of range for 1 dim"):
        dim_partitioner(1)((torch.zeros(4, 2), torch.zeros(4)), {}, 2)
    with pytest.raises(IndexError, match=r"args\[0\] of shape \(\): dim 0 is out of range for 0 dim"):
        batch_partitioner((torch.tensor(1.0),), {}, 2)


@pytest.mark.parametrize(
    ("args", "size", "message"),
    [
        ((1, "x"), 2, "found no tensor to split"),
        ((torch.zeros(0, 3),), 2, r"cannot split args\[0\]: it has length 0 along dim 0"),
        ((torch.zeros(3),), 0, "cannot split a call among 0 members"),
    ],
    ids=["no tensor", "empty tensor", "empty group"],
)
def test_dim_partitioner_refuses_calls_it_cannot_split(args: tuple[Any, ...], size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        batch_partitioner(args, {}, size)


def test_dim_partitioner_refuses_bad_options() -> None:
    with pytest.raises(ValueError, match="pass exclusive=True too"):
        dim_partitioner(0, keepdim=False)
    with pytest.raises(TypeError, match="dim must be an int"):
        dim_partitioner(True)
    with pytest.raises(TypeError, match="dim must be an int"):
        dim_partitioner(0.5)  # type: ignore[arg-type]


def test_partitioners_have_a_repr() -> None:
    assert repr(batch_partitioner) == "batch_partitioner"
    assert repr(dim_partitioner(0)) == "batch_partitioner", "the same partitioner"
    assert repr(dim_partitioner(1, exclusive=True, keepdim=False)) == (
        "dim_partitioner(1, exclusive=True, keepdim=False)"
    )


# --------------------------------------------------------------------------- reducers


def test_mean_reducer_averages_tensors_elementwise() -> None:
    mean = mean_reducer([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])])
    assert torch.equal(mean, torch.tensor([2.0, 4.0]))
    integers = mean_reducer([torch.tensor([1, 2]), torch.tensor([2, 2])])
    assert integers.dtype == torch.float32
    assert torch.equal(integers, torch.tensor([1.5, 2.0]))


def test_sum_reducer_sums_tensors_elementwise() -> None:
    total = sum_reducer([torch.ones(2, 2), torch.ones(2, 2), torch.ones(2, 2)])
    assert torch.equal(total, torch.full((2, 2), 3.0))


def test_reducers_keep_the_autograd_graph() -> None:
    weight = torch.ones(3, requires_grad=True)
    (grad,) = torch.autograd.grad(mean_reducer([weight * 2, weight * 4]).sum(), [weight])
    assert grad.tolist() == [3.0, 3.0, 3.0]


def test_reducers_reduce_numbers() -> None:
    half: float = mean_reducer([1, 2])
    assert half == 1.5
    assert mean_reducer([0.5, 1.5, 2.5]) == 1.5
    assert sum_reducer([1, 2, 3]) == 6
    assert sum_reducer([True, True]) == 2
    assert sum_reducer([1j, 2.0]) == 2 + 1j


def test_reducers_reduce_nested_structures_keeping_their_types() -> None:
    results = [
        {"loss": torch.tensor(1.0), "parts": (1, [2.0, torch.ones(2)]), "point": Point(1, 2)},
        {"loss": torch.tensor(3.0), "parts": (3, [4.0, torch.zeros(2)]), "point": Point(3, 4)},
    ]
    mean = mean_reducer(results)
    assert same(mean, {"loss": torch.tensor(2.0), "parts": (2.0, [3.0, torch.full((2,), 0.5)]), "point": Point(2, 3)})
    assert type(mean["point"]) is Point
    sizes = mean_reducer([torch.Size([2, 4]), torch.Size([3, 4])])  # a tuple subclass: a plain tuple back
    assert sizes == (2.5, 4.0)
    assert type(sizes) is tuple
    state = sum_reducer([OrderedDict(w=torch.ones(1), b=1), OrderedDict(w=torch.ones(1), b=2)])
    assert type(state) is OrderedDict
    assert list(state) == ["w", "b"]
    assert same(state, OrderedDict(w=torch.tensor([2.0]), b=3))


def test_reducers_refuse_an_empty_list() -> None:
    with pytest.raises(ValueError, match="mean_reducer cannot reduce an empty list of results"):
        mean_reducer([])
    with pytest.raises(ValueError, match="sum_reducer cannot reduce an empty list of results"):
        sum_reducer([])


@pytest.mark.parametrize(
    ("results", "error", "message"),
    [
        (
            [torch.ones(2), torch.ones(3)],
            ValueError,
            r"results\[1\] has shape \(3,\), but results\[0\] has shape \(2,\)",
        ),
        ([(1, 2), (1, 2, 3)], ValueError, r"results\[1\] has 3 items, but results\[0\] has 2"),
        ([{"a": 1, "b": 2}, {"a": 1, "c": 3}], ValueError, r"results\[1\] has different keys .*missing 'b'; extra 'c'"),
        ([{"x": torch.ones(1)}, {"x": 1.0}], TypeError, r"results\[1\]\['x'\] is a number, but results\[0\]\['x'\] is"),
        ([(1,), [1]], TypeError, r"results\[1\] is of type list, but results\[0\] is of type tuple"),
        ([[None], [None]], TypeError, r"cannot reduce results\[0\]\[0\] of type NoneType"),
        (["a", "b"], TypeError, r"cannot reduce results\[0\] of type str"),
    ],
    ids=["shapes", "lengths", "keys", "kinds", "containers", "none", "strings"],
)
def test_reducers_refuse_mismatched_or_unsupported_results(
    results: list[Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        mean_reducer(results)
    with pytest.raises(error, match=message):
        sum_reducer(results)
