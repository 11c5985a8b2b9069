"""Group calls over the in-process world: fan-out, failures, deadlines, partitioners and reducers.

The group's members live one per node (0, 1, 2), so every group call mixes local
and remote members. mypy runs on this file too: the ``type: ignore`` comments
below are checked by ``warn_unused_ignores``, so they prove that mypy rejects
those calls.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, NamedTuple

import pytest
import torch

import actorch
from actorch import ActorGroup, batch_partitioner, dim_partitioner, mean_reducer, sum_reducer
from actorch.testing import LocalWorld, local_world


class Rendezvous(actorch.Actor):
    """Lets callers through only once ``parties`` of them are waiting at once."""

    max_concurrency = 100

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.everyone = asyncio.Event()

    async def arrive(self) -> int:
        self.arrived += 1
        if self.arrived == self.parties:
            self.everyone.set()
        await self.everyone.wait()
        return self.arrived


class Worker(actorch.Actor):
    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.received: list[Any] = []
        self.started = 0
        self.cancelled = 0

    async def ident(self) -> int:
        return self.tag

    async def add(self, x: int, *, y: int = 0) -> int:
        return self.tag + x + y

    async def keywords(self, /, **kwargs: Any) -> dict[str, Any]:  # self positional-only: mypy's Concatenate wants it
        return kwargs

    async def echo(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [list(args), kwargs]

    async def fail_if(self, tag: int) -> int:
        if tag == self.tag:
            raise ValueError(f"worker {self.tag} refuses")
        return self.tag

    async def give_up(self) -> None:
        raise asyncio.CancelledError

    async def meet(self, rendezvous: actorch.ActorRef[Rendezvous]) -> int:
        await rendezvous.call(Rendezvous.arrive)
        return self.tag

    async def sleep(self, seconds: float) -> int:
        self.started += 1
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return self.tag

    async def counts(self) -> dict[str, int]:
        return {"started": self.started, "cancelled": self.cancelled}

    async def record(self, value: Any) -> None:
        self.received.append(value)

    async def recorded(self) -> list[Any]:
        return self.received

    async def loss(self, batch: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        loss: torch.Tensor = model(batch).square().mean()
        return loss

    async def stats(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {"sum": batch["x"].sum(), "rows": batch["x"].shape[0], "pair": (batch["y"].sum(), 1.0)}


class Sleeper(Worker):
    max_concurrency = 4  # so status calls run beside a sleeping handler


class Other(actorch.Actor):
    async def other(self) -> str:
        return "other"


class Point(NamedTuple):
    x: Any
    y: Any


async def spawn_workers(
    world: LocalWorld, tags: tuple[int, ...] = (0, 1, 2), cls: type[Worker] = Worker
) -> ActorGroup[Worker]:
    refs = [await world[0].spawn(cls, args=(tag,), name=f"g/{i}", on=i % len(world)) for i, tag in enumerate(tags)]
    return ActorGroup(refs)


async def wait_until_counts(ref: actorch.ActorRef[Worker], **expected: int) -> None:
    async with asyncio.timeout(2):
        while True:
            counts = await ref.call(Worker.counts)
            if all(counts[key] == value for key, value in expected.items()):
                return
            await asyncio.sleep(0.005)


def same(a: Any, b: Any) -> bool:
    """Structural equality where tensors compare by value (``==`` on tensors gives tensors)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and bool(torch.allclose(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def every_other(args: tuple[Any, ...], kwargs: dict[str, Any], size: int, /) -> list[Any]:
    """A partitioner that calls the odd members only, with the call's arguments unchanged."""
    return [(args, kwargs) if member % 2 else None for member in range(size)]


# --------------------------------------------------------------------------- the group as a collection


async def test_group_is_an_ordered_collection_of_refs(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    refs = [await world[0].lookup(f"g/{i}") for i in range(3)]
    assert len(group) == 3
    assert list(group) == refs
    assert group.refs == tuple(refs)
    assert group[1] == refs[1]
    assert group[-1] == refs[2]
    assert refs[0] in group
    tail = group[1:]
    assert isinstance(tail, ActorGroup)
    assert tail.refs == tuple(refs[1:])


async def test_group_built_from_lookup_all_follows_name_order(world: LocalWorld) -> None:
    await spawn_workers(world, tags=(5, 6, 7))
    group: ActorGroup[Worker] = ActorGroup(await world[1].lookup_all("g/*"))
    async with asyncio.timeout(5):
        assert await group.call(Worker.ident) == [5, 6, 7]


async def test_group_refuses_items_that_are_not_refs(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    with pytest.raises(TypeError, match="item 1 is 'g/1'"):
        ActorGroup([group[0], "g/1"])  # type: ignore[arg-type]


async def test_group_repr_names_members_nodes_and_partitioner(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    assert repr(group) == "<ActorGroup of 3: actor 'g/0' on node 0, actor 'g/1' on node 1, actor 'g/2' on node 2>"
    unnamed = await world[0].spawn(Worker, args=(9,), on=2)
    assert repr(ActorGroup([unnamed])) == "<ActorGroup of 1: unnamed Worker on node 2>"
    assert repr(ActorGroup([])) == "<ActorGroup of 0: >"
    big = ActorGroup([*group, *group])
    assert repr(big).endswith("actor 'g/0' on node 0, ... (+2 more)>")
    split = group.partitioned(batch_partitioner)
    assert repr(split).startswith("<ActorGroup of 3 partitioned by batch_partitioner: actor 'g/0'")


async def test_group_partitioned_returns_a_new_group_with_the_partitioner(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    split = group.partitioned(batch_partitioner)
    assert group.partitioner is None
    assert split.partitioner is batch_partitioner
    assert split.refs == group.refs
    assert split[:2].partitioner is batch_partitioner, "a slice keeps the partitioner"
    assert split.partitioned(None).partitioner is None
    assert ActorGroup(group, partitioner=every_other).partitioner is every_other


# --------------------------------------------------------------------------- call and tell


async def test_group_call_returns_results_in_member_order(world: LocalWorld) -> None:
    group = await spawn_workers(world, tags=(20, 0, 10))
    async with asyncio.timeout(5):
        tags: list[int] = await group.call(Worker.ident)
        assert tags == [20, 0, 10]
        assert await group.call("ident") == [20, 0, 10]
        assert await group.call(Worker.add, 1, y=2) == [23, 3, 13]


async def test_group_call_runs_members_concurrently(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    rendezvous = await world[0].spawn(Rendezvous, args=(3,), on=1)
    # Each member waits until all three have arrived: one at a time would never finish.
    async with asyncio.timeout(2):
        assert await group.call(Worker.meet, rendezvous) == [0, 1, 2]


async def test_group_call_passes_every_keyword_to_the_endpoint(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    keywords = {"method": 1, "reducer": 2, "partitioner": 3, "args": 4, "kwargs": 5}
    async with asyncio.timeout(5):
        assert await group.call(Worker.keywords, method=1, reducer=2, partitioner=3, args=4, kwargs=5) == [keywords] * 3
        assert await group.reduce(lambda results: results, "keywords", **keywords) == [keywords] * 3


async def test_group_call_of_an_empty_group_returns_an_empty_list() -> None:
    empty: ActorGroup[Worker] = ActorGroup([])
    assert await empty.call(Worker.ident) == []
    empty.tell(Worker.record, 1)


async def test_group_tell_reaches_every_member(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    group.tell(Worker.record, "a")
    group.tell("record", value="b")
    async with asyncio.timeout(5):
        assert await group.call(Worker.recorded) == [["a", "b"]] * 3


async def test_group_call_and_tell_refuse_a_method_that_is_no_endpoint(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    with pytest.raises(actorch.EndpointError, match="not 42"):
        await group.call(42)  # type: ignore[call-overload]
    with pytest.raises(actorch.EndpointError, match="not 42"):
        group.tell(42)  # type: ignore[call-overload]


async def test_group_call_with_arguments_of_the_wrong_type_is_a_type_error(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    async with asyncio.timeout(5):
        with pytest.raises(actorch.GroupError) as caught:
            await group.call(Worker.add, "one")  # type: ignore[call-overload]
    assert caught.value.failed == [0, 1, 2]
    assert all(isinstance(error, TypeError) for error in caught.value.exceptions)


# --------------------------------------------------------------------------- failures


async def test_group_call_failure_raises_group_error_with_every_outcome(world: LocalWorld) -> None:
    group = await spawn_workers(world, tags=(0, 1, 2, 3))
    await group[2].stop()
    async with asyncio.timeout(5):
        with pytest.raises(actorch.GroupError) as caught:
            await group.call(Worker.fail_if, 1)
    error = caught.value
    assert isinstance(error, ExceptionGroup)
    assert isinstance(error, actorch.ActorchError)
    assert error.failed == [1, 2]
    assert error.results[0] == 0
    assert error.results[3] == 3
    refused, stopped = error.results[1], error.results[2]
    assert isinstance(refused, ValueError)
    assert isinstance(refused, actorch.RemoteError)
    assert str(refused) == "worker 1 refuses"
    assert isinstance(stopped, actorch.ActorStoppedError)
    assert list(error.exceptions) == [refused, stopped]
    assert str(error).startswith(
        "2 of 4 calls to 'fail_if' failed: member 1 (actor 'g/1' on node 1): ValueError; "
        "member 2 (actor 'g/2' on node 2): ActorStoppedError"
    )
    assert refused.__notes__ == ["in member 1 (actor 'g/1' on node 1) of the group call to 'fail_if'"]
    assert stopped.__notes__ == ["in member 2 (actor 'g/2' on node 2) of the group call to 'fail_if'"]


async def test_group_error_can_be_caught_by_member_exception_type(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    caught: list[BaseException] = []
    async with asyncio.timeout(5):
        try:
            await group.call(Worker.fail_if, 2)
        except* ValueError as values:
            caught.extend(values.exceptions)
    assert [str(error) for error in caught] == ["worker 2 refuses"]


async def test_group_call_waits_for_every_member_before_raising(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    await group[0].stop()
    async with asyncio.timeout(5):
        with pytest.raises(actorch.GroupError) as caught:
            await group.call(Worker.sleep, 0.1)  # member 0 fails at once, the others sleep
    assert caught.value.failed == [0]
    assert caught.value.results[1:] == [1, 2]


async def test_group_call_to_an_unknown_endpoint_fails_for_every_member(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    async with asyncio.timeout(5):
        with pytest.raises(actorch.GroupError, match="3 of 3 calls to 'nope' failed") as caught:
            await group.call("nope")
    assert all(isinstance(error, actorch.EndpointError) for error in caught.value.exceptions)


async def test_group_tell_still_sends_to_the_rest_when_a_member_refuses(world: LocalWorld) -> None:
    group = await spawn_workers(world)
    other = await world[0].spawn(Other, name="g/other", on=1)
    mixed: ActorGroup[Any] = ActorGroup([group[0], other, group[2]])
    with pytest.raises(actorch.GroupError, match="1 of 3 calls to 'record' failed: member 1") as caught:
        mixed.tell(Worker.record, "told")
    assert caught.value.failed == [1]
    assert caught.value.results == [None, caught.value.exceptions[0], None]
    assert isinstance(caught.value.exceptions[0], actorch.EndpointError)
    async with asyncio.timeout(5):
        assert await group.call(Worker.recorded) == [["told"], [], ["told"]]


# --------------------------------------------------------------------------- deadlines and cancellation


async def test_group_call_lets_a_cancellation_raised_inside_a_member_call_through(world: LocalWorld) -> None:
    local = await world[0].spawn(Worker, args=(0,), on=0)  # a local call runs the handler in the member's task
    with pytest.raises(asyncio.CancelledError):
        await ActorGroup([local]).call(Worker.give_up)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0, "the caller itself was not cancelled"


async def test_group_call_deadline_cancels_every_member(world: LocalWorld) -> None:
    group = await spawn_workers(world, cls=Sleeper)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await group.call(Worker.sleep, 30)
    assert loop.time() - started < 2
    for ref in group:
        await wait_until_counts(ref, started=1, cancelled=1)


async def test_cancelling_a_group_call_cancels_every_member(world: LocalWorld) -> None:
    group = await spawn_workers(world, cls=Sleeper)
    task = asyncio.ensure_future(group.call(Worker.sleep, 30))
    for ref in group:
        await wait_until_counts(ref, started=1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for ref in group:
        await wait_until_counts(ref, cancelled=1)


# --------------------------------------------------------------------------- partitioned calls


async def test_partitioned_call_sends_each_member_its_share(world: LocalWorld) -> None:
    group = (await spawn_workers(world)).partitioned(batch_partitioner)
    batch = torch.arange(14).reshape(7, 2)
    async with asyncio.timeout(5):
        shares = await group.call(Worker.echo, batch, "whole", scale=torch.arange(7), name="n")
    assert [args[0].shape[0] for args, _ in shares] == [3, 2, 2]
    assert torch.equal(torch.cat([args[0] for args, _ in shares]), batch)
    assert torch.equal(torch.cat([kwargs["scale"] for _, kwargs in shares]), torch.arange(7))
    assert [(args[1], kwargs["name"]) for args, kwargs in shares] == [("whole", "n")] * 3


async def test_partitioned_call_skips_members_left_without_data(world: LocalWorld) -> None:
    group = (await spawn_workers(world)).partitioned(batch_partitioner)
    async with asyncio.timeout(5):
        shares = await group.call(Worker.echo, torch.tensor([[1.0], [2.0]]))
        assert [args[0].tolist() for args, _ in shares] == [[[1.0]], [[2.0]]]
        group.tell(Worker.record, torch.tensor([5]))
        told = await group.partitioned(None).call(Worker.recorded)
        assert [[tensor.tolist() for tensor in received] for received in told] == [[[5]], [], []]


async def test_partitioned_call_with_mean_reducer_matches_the_whole_batch(world: LocalWorld) -> None:
    group = (await spawn_workers(world)).partitioned(batch_partitioner)
    batch, model = torch.randn(9, 4), torch.nn.Linear(4, 2)  # the batch is split, the module goes whole
    async with asyncio.timeout(5):
        loss: torch.Tensor = await group.reduce(mean_reducer, Worker.loss, batch, model)
    with torch.no_grad():
        assert torch.allclose(loss, model(batch).square().mean())  # equal shares: the mean of means


async def test_partitioned_call_splits_tensors_inside_dicts_and_reduces_nested_results(world: LocalWorld) -> None:
    group = (await spawn_workers(world)).partitioned(batch_partitioner)
    batch = {"x": torch.ones(6, 3), "y": torch.arange(6.0)}
    async with asyncio.timeout(5):
        total = await group.reduce(sum_reducer, Worker.stats, batch)
    assert same(total, {"sum": torch.tensor(18.0), "rows": 6, "pair": (torch.tensor(15.0), 3.0)})


async def test_partitioned_call_results_and_errors_cover_the_members_called(world: LocalWorld) -> None:
    group = (await spawn_workers(world, tags=(0, 1, 2, 3))).partitioned(every_other)
    async with asyncio.timeout(5):
        assert await group.call(Worker.ident) == [1, 3]
        with pytest.raises(actorch.GroupError, match=r"1 of 2 calls to 'fail_if' failed: member 3 \(actor 'g/3'"):
            await group.call(Worker.fail_if, 3)


async def test_group_refuses_a_partitioner_with_the_wrong_number_of_entries(world: LocalWorld) -> None:
    def one_short(args: tuple[Any, ...], kwargs: dict[str, Any], size: int, /) -> list[Any]:
        return [(args, kwargs)] * (size - 1)

    group = (await spawn_workers(world)).partitioned(one_short)
    with pytest.raises(ValueError, match="returned 2 entries for a group of 3"):
        group.tell(Worker.record, 1)
    async with asyncio.timeout(5):
        assert await group.partitioned(None).call(Worker.recorded) == [[], [], []], "nothing was sent"


async def test_group_refuses_a_partitioner_entry_that_is_not_args_and_kwargs(world: LocalWorld) -> None:
    def bad(args: tuple[Any, ...], kwargs: dict[str, Any], size: int, /) -> list[Any]:
        return [(args, kwargs), args, None][:size]

    group = (await spawn_workers(world)).partitioned(bad)
    with pytest.raises(TypeError, match=r"gave member 1 \(1,\): expected an \(args tuple, kwargs dict\) pair"):
        await group.call(Worker.record, 1)


# --------------------------------------------------------------------------- dim_partitioner


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


def test_reducers_on_numbers() -> None:
    half: float = mean_reducer([1, 2])
    assert half == 1.5
    assert mean_reducer([0.5, 1.5, 2.5]) == 1.5
    assert sum_reducer([1, 2, 3]) == 6
    assert sum_reducer([True, True]) == 2
    assert sum_reducer([1j, 2.0]) == 2 + 1j


def test_reducers_on_nested_structures() -> None:
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


# --------------------------------------------------------------------------- strict mode


async def test_group_calls_work_in_a_strict_world() -> None:
    async with local_world(3, strict=True, stop_grace=0.5) as world:
        group = (await spawn_workers(world)).partitioned(batch_partitioner)
        batch = {"x": torch.ones(5, 2), "y": torch.arange(5.0)}
        async with asyncio.timeout(5):
            assert await group.partitioned(None).call(Worker.ident) == [0, 1, 2]
            stats = await group.call(Worker.stats, batch)
            assert [share["rows"] for share in stats] == [2, 2, 1]
            mean = await group.reduce(mean_reducer, Worker.stats, batch)
            assert same(mean, {"sum": torch.tensor(10 / 3), "rows": 5 / 3, "pair": (torch.tensor(10 / 3), 1.0)})
            with pytest.raises(actorch.GroupError) as caught:
                await group.partitioned(None).call(Worker.echo, {1, 2})  # a set needs pickle
    assert caught.value.failed == [1, 2], "the member on the caller's node gets the set without encoding"
    assert all(isinstance(error, actorch.SerializationError) for error in caught.value.exceptions)
