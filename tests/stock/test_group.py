"""Group calls over the in-process world: fan-out, failures, deadlines, partitioned and reduced calls.

The group's members live one per node (0, 1, 2), so every group call mixes local
and remote members. mypy runs on this file too: the ``type: ignore`` comments
below are checked by ``warn_unused_ignores``, so they prove that mypy rejects
those calls.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from actors import Rendezvous, Sleeper, Stranger, Worker, wait_until_counts
from test_partitioners import same

import actorch
from actorch.group import ActorGroup, batch_partitioner, mean_reducer, sum_reducer
from actorch.testing import LocalWorld, local_world


async def spawn_workers(
    world: LocalWorld, tags: tuple[int, ...] = (0, 1, 2), cls: type[Worker] = Worker
) -> ActorGroup[Worker]:
    refs = [await world[0].spawn(cls, args=(tag,), name=f"g/{i}", on=i % len(world)) for i, tag in enumerate(tags)]
    return ActorGroup(refs)


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
        "2 of 4 calls to 'fail_if' failed: member 1 (actor 'g/1' on node 1): ValueError: worker 1 refuses; "
        "member 2 (actor 'g/2' on node 2): ActorStoppedError: cannot call 'fail_if' of "
    )
    assert refused.__notes__[0].startswith("Raised in 'fail_if' of actor 'g/1' (Worker) on node 1, pid ")
    assert refused.__notes__[1:] == ["in member 1 (actor 'g/1' on node 1), one of the calls to 'fail_if'"]
    assert stopped.__notes__ == ["in member 2 (actor 'g/2' on node 2), one of the calls to 'fail_if'"]


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
    other = await world[0].spawn(Stranger, name="g/other", on=1)
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


async def test_group_call_cancelled_cancels_every_member(world: LocalWorld) -> None:
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
