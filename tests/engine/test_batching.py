"""Batched endpoints: concurrent calls run once as a list, and each caller gets its own answer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch

import actorch
from actorch.testing import LocalWorld


class Doubler(actorch.Actor):
    """Doubles numbers in batches and records each batch it ran."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[list[Any]] = []
        self.events: list[str] = []
        self.cancelled = 0

    @actorch.batched(max_batch=4, max_wait=0.05)
    async def double(self, items: list[int]) -> list[int | Exception]:
        """Twice each item; a negative item fails its own call only."""
        self.batches.append(list(items))
        self.events.append(f"batch {len(items)}")
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return [ValueError(f"negative: {i}") if i < 0 else 2 * i for i in items]

    @actorch.batched(max_batch=1000, max_wait=0.2)
    async def slow_window(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        return items

    @actorch.batched(max_batch=8, max_wait=0.01)
    async def broken(self, items: list[str]) -> list[int]:
        if "raise" in items:
            raise RuntimeError("the whole batch failed")
        return [1]  # one result, whatever the number of calls

    @actorch.batched(max_batch=8, max_wait=0.01)
    async def rows(self, items: list[float]) -> torch.Tensor:
        return torch.tensor(items) * 10

    async def plain(self, tag: str) -> str:
        self.events.append(tag)
        await asyncio.sleep(self.delay)
        return tag

    async def recorded(self) -> list[list[Any]]:
        return self.batches

    async def log(self) -> list[str]:
        return self.events

    async def cancellations(self) -> int:
        return self.cancelled


async def test_batched_concurrent_calls_run_once_and_each_caller_gets_its_result(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    results = await asyncio.gather(*(ref.call(Doubler.double, i) for i in range(4)))
    assert results == [0, 2, 4, 6]
    assert await ref.call(Doubler.recorded) == [[0, 1, 2, 3]]


async def test_batched_splits_calls_into_batches_of_max_batch(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    results = await asyncio.gather(*(ref.call(Doubler.double, i) for i in range(10)))
    assert results == [2 * i for i in range(10)]
    assert await ref.call(Doubler.recorded) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


async def test_batched_partial_batch_runs_after_max_wait(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    started = time.monotonic()
    results = await asyncio.gather(*(ref.call(Doubler.slow_window, i) for i in range(3)))
    waited = time.monotonic() - started
    assert results == [0, 1, 2]
    assert await ref.call(Doubler.recorded) == [[0, 1, 2]]
    assert 0.18 <= waited < 1.0


async def test_batched_exception_in_results_fails_only_its_caller(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    outcomes = await asyncio.gather(*(ref.call(Doubler.double, i) for i in (1, -2, 3, -4)), return_exceptions=True)
    assert outcomes[0] == 2
    assert outcomes[2] == 6
    for failed, item in ((outcomes[1], -2), (outcomes[3], -4)):
        assert isinstance(failed, actorch.RemoteError)
        assert isinstance(failed, ValueError)
        assert f"negative: {item}" in str(failed)
    assert await ref.call(Doubler.double, 5) == 10  # the actor goes on serving


async def test_batched_method_error_reaches_every_caller(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    outcomes = await asyncio.gather(*(ref.call(Doubler.broken, s) for s in ("a", "raise")), return_exceptions=True)
    for failed in outcomes:
        assert isinstance(failed, actorch.RemoteError)
        assert isinstance(failed, RuntimeError)
        assert "the whole batch failed" in str(failed)


async def test_batched_wrong_number_of_results_fails_every_caller(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    outcomes = await asyncio.gather(*(ref.call(Doubler.broken, s) for s in "abc"), return_exceptions=True)
    for failed in outcomes:
        assert isinstance(failed, actorch.RemoteError)
        assert isinstance(failed, TypeError)
        assert "one result per call: got 1 results for 3 calls" in str(failed)


async def test_batched_tensor_result_gives_each_caller_its_row(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    results = await asyncio.gather(*(ref.call(Doubler.rows, x) for x in (1.0, 2.0, 3.0)))
    assert [float(r) for r in results] == [10.0, 20.0, 30.0]


async def test_batched_call_with_wrong_arguments_fails_alone(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    bad = ref.call("double", 1, 2)
    bad_keyword = ref.call("double", item=1)
    outcomes = await asyncio.gather(bad, bad_keyword, ref.call(Doubler.double, 3), return_exceptions=True)
    assert isinstance(outcomes[0], actorch.EndpointError)
    assert "2 positional" in str(outcomes[0])
    assert isinstance(outcomes[1], actorch.EndpointError)
    assert "1 keyword" in str(outcomes[1])
    assert outcomes[2] == 6


async def test_batched_tell_is_checked_and_applied(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    with pytest.raises(actorch.EndpointError, match="one item per call"):
        ref.tell(Doubler.double, 1, 2)
    ref.tell(Doubler.double, 7)
    ref.tell(Doubler.double, 8)
    await asyncio.sleep(0.2)
    assert await ref.call(Doubler.recorded) == [[7, 8]]


async def test_batched_collects_calls_while_a_single_message_actor_is_busy(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, args=(0.1,), on=on)
    busy = asyncio.ensure_future(ref.call(Doubler.plain, "busy"))
    await asyncio.sleep(0.02)
    doubled = [ref.call(Doubler.double, i) for i in range(3)]
    after = ref.call(Doubler.plain, "after")  # sent after the batch opened: runs after it
    results = await asyncio.gather(busy, *doubled, after)
    assert results == ["busy", 0, 2, 4, "after"]
    assert await ref.call(Doubler.log) == ["busy", "batch 3", "after"]


async def test_batched_caller_deadline_fails_that_caller_only(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, args=(0.5,), on=on)

    async def hurried() -> int:
        async with asyncio.timeout(0.15):
            return await ref.call(Doubler.double, 1)

    started = time.monotonic()
    outcomes = await asyncio.gather(hurried(), ref.call(Doubler.double, 2), return_exceptions=True)
    assert isinstance(outcomes[0], TimeoutError)
    assert outcomes[1] == 4  # the batch went on for the caller without a deadline
    assert time.monotonic() - started >= 0.5


async def test_batched_near_deadline_closes_the_window_early(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, on=on)
    started = time.monotonic()
    async with asyncio.timeout(0.1):  # the window (0.2 s) would outlast it
        assert await ref.call(Doubler.slow_window, 5) == 5
    assert time.monotonic() - started < 0.1


async def test_batched_call_past_its_deadline_is_not_run(world: LocalWorld) -> None:
    ref = await world[0].spawn(Doubler, args=(0.3,))
    busy = asyncio.ensure_future(ref.call(Doubler.plain, "busy"))
    await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await ref.call(Doubler.double, 1)
    await busy
    await asyncio.sleep(0.1)
    assert await ref.call(Doubler.recorded) == []


async def test_batched_cancelled_caller_leaves_the_others_answered(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, args=(0.2,), on=on)
    first = asyncio.ensure_future(ref.call(Doubler.double, 1))
    second = asyncio.ensure_future(ref.call(Doubler.double, 2))
    await asyncio.sleep(0.1)
    first.cancel()
    assert await second == 4
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await ref.call(Doubler.cancellations) == 0


async def test_batched_run_is_cancelled_when_every_caller_gives_up(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, args=(5.0,), on=on)
    calls = [asyncio.ensure_future(ref.call(Doubler.double, i)) for i in range(2)]
    await asyncio.sleep(0.15)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await asyncio.sleep(0.1)
    assert await ref.call(Doubler.cancellations) == 1  # and the actor is free again: this call did not wait 5 s


async def test_batched_calls_fail_with_actor_stopped_when_the_actor_stops(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Doubler, args=(5.0,), on=on)
    running = [asyncio.ensure_future(ref.call(Doubler.double, i)) for i in range(4)]
    await asyncio.sleep(0.05)
    waiting = [asyncio.ensure_future(ref.call(Doubler.double, i)) for i in range(2)]
    await asyncio.sleep(0.05)
    await world[0].spawn(Doubler)  # a round trip to the nodes, so both calls have arrived
    await ref.stop()
    outcomes = await asyncio.gather(*running, *waiting, return_exceptions=True)
    assert all(isinstance(outcome, actorch.ActorStoppedError) for outcome in outcomes), outcomes


class Table(actorch.Actor):
    """An actor whose batch size is the number of players it has seated."""

    def __init__(self) -> None:
        self.players: list[actorch.ActorRef[Player]] = []
        self.sizes: list[int] = []

    @actorch.batched(max_batch=lambda self: len(self.players), max_wait=5.0)
    async def move(self, items: list[int]) -> list[int]:
        self.sizes.append(len(items))
        return [i + 100 for i in items]

    async def round(self, players: list[actorch.ActorRef[Player]]) -> list[int]:
        self.players = players
        return await asyncio.gather(*(p.call(Player.play, self.ref, i) for i, p in enumerate(players)))

    async def batch_sizes(self) -> list[int]:
        return self.sizes


class Player(actorch.Actor):
    async def play(self, table: actorch.ActorRef[Table], seat: int) -> int:
        return await table.call(Table.move, seat)


async def test_batched_calls_back_into_a_busy_actor_form_one_batch(world: LocalWorld) -> None:
    table = await world[0].spawn(Table)
    players = [await world[0].spawn(Player, on=rank % 3) for rank in range(5)]
    started = time.monotonic()
    assert await table.call(Table.round, players) == [100, 101, 102, 103, 104]
    assert time.monotonic() - started < 2.0  # full at 5 calls: the 5 s window was not waited out
    assert await table.call(Table.batch_sizes) == [5]


async def test_batched_counts_its_calls_in_statistics(world: LocalWorld) -> None:
    ref = await world[0].spawn(Doubler)
    await asyncio.gather(*(ref.call(Doubler.double, i) for i in range(6)))
    cell = world._hosts[0].node.cell(ref._actor_id)
    assert cell is not None
    # on_start and 2 batches were handled; the second batch waited behind the first
    expected = {"handled": 3, "running": 0, "queued": 0, "queued_peak": 1, "restarts": 0, "batched_calls": 6}
    assert cell.statistics() == expected


def test_batched_method_called_on_the_instance_takes_and_returns_lists() -> None:
    class Plain(actorch.Actor):
        @actorch.batched(max_batch=2)
        async def square(self, items: list[int]) -> list[int]:
            return [i * i for i in items]

    instance = object.__new__(Plain)
    assert asyncio.run(instance.square([2, 3])) == [4, 9]
    assert "square" in actorch.Actor.__subclasses__()[-1]._actorch_endpoints


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_batch": 0}, "max_batch must be an int >= 1"),
        ({"max_batch": True}, "max_batch must be an int >= 1"),
        ({"max_batch": 2.5}, "max_batch must be an int >= 1"),
        ({"max_wait": -1}, "max_wait must be a finite number"),
        ({"max_wait": float("inf")}, "max_wait must be a finite number"),
        ({"max_wait": "1"}, "max_wait must be a finite number"),
    ],
)
def test_batched_refuses_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        actorch.batched(**options)


def test_batched_refuses_a_plain_function_and_a_second_decoration() -> None:
    def sync(self: object, items: list[int]) -> list[int]:
        return items

    with pytest.raises(TypeError, match="needs an async def"):
        actorch.batched()(sync)  # type: ignore[arg-type]

    async def once(self: object, items: list[int]) -> list[int]:
        return items

    with pytest.raises(TypeError, match="already batched"):
        actorch.batched()(actorch.batched()(once))  # type: ignore[arg-type]


def test_batched_private_method_is_refused_at_class_definition() -> None:
    with pytest.raises(TypeError, match="is batched, so an endpoint"):

        class Hidden(actorch.Actor):
            @actorch.batched()
            async def _act(self, items: list[int]) -> list[int]:
                return items


async def test_batched_endpoint_through_a_group_answers_every_member(world: LocalWorld) -> None:
    refs = [await world[0].spawn(Doubler, on=rank) for rank in range(3)]
    assert await actorch.group.ActorGroup(refs).call(Doubler.double, 4) == [8, 8, 8]
    actorch.group.ActorGroup(refs).tell(Doubler.double, 5)
    await asyncio.sleep(0.2)
    assert [await ref.call(Doubler.recorded) for ref in refs] == [[[4], [5]]] * 3
