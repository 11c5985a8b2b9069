"""Calls and tells over a three-node in-process world, to an actor on the caller's node or another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import torch
from actors import Counter, Recorder, Store, wait_until_counts

import actorch
from actorch._base.deadline import current_deadline
from actorch.testing import LocalWorld, local_world, new_event_loop


class Gate(actorch.Actor):
    """Records the order handlers start in; they may interleave."""

    max_concurrency = 100

    def __init__(self) -> None:
        self.started: list[int] = []

    async def enter(self, index: int) -> None:
        self.started.append(index)
        await asyncio.sleep(0.001)

    async def order(self) -> list[int]:
        return self.started


class Serial(actorch.Actor):
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def work(self, tag: str) -> None:
        self.events.append(("enter", tag))
        await asyncio.sleep(0.02)
        self.events.append(("exit", tag))

    async def history(self) -> list[tuple[str, str]]:
        return self.events


class Interleaving(Serial):
    max_concurrency = 2


class Slow(actorch.Actor):
    max_concurrency = 4  # so status calls run beside a sleeping handler

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0

    async def sleep(self, seconds: float) -> str:
        self.started += 1
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "slept"

    async def counts(self) -> dict[str, int]:
        return {"started": self.started, "cancelled": self.cancelled}

    async def time_left(self) -> float | None:
        deadline = current_deadline()
        return None if deadline is None else deadline - asyncio.get_running_loop().time()


class Ping(actorch.Actor):
    """One side of a re-entrant chain: A.via(B) → B.bounce(A) → A.pong()."""

    def __init__(self) -> None:
        self.pongs = 0

    async def via(self, other: actorch.ActorRef[Ping], times: int = 1) -> list[int]:
        calls = [other.call(Ping.bounce, self.ref) for _ in range(times)]
        return list(await asyncio.gather(*calls))

    async def bounce(self, back: actorch.ActorRef[Ping]) -> int:
        return await back.call(Ping.pong)

    async def pong(self) -> int:
        self.pongs += 1
        return self.pongs


class Forwarder(actorch.Actor):
    async def add_via(self, counter: actorch.ActorRef[Counter], k: int) -> int:
        return await counter.call(Counter.add, k)

    async def add_via_all(self, counters: dict[str, list[actorch.ActorRef[Counter]]]) -> list[int]:
        return [await ref.call(Counter.add, 1) for ref in counters["refs"]]

    async def echo(self, value: Any) -> Any:
        return value

    async def time_left_via(self, slow: actorch.ActorRef[Slow]) -> float | None:
        return await slow.call(Slow.time_left)


@pytest.mark.smoke
async def test_typed_call_returns_the_handler_result(world: LocalWorld, on: int) -> None:
    counter = await world[0].spawn(Counter, args=(10,), on=on)
    async with asyncio.timeout(5):
        assert await counter.call(Counter.add, 5) == 15
        assert await counter.call(Counter.add, k=2) == 17
        assert await counter.call(Counter.add) == 18


async def test_string_call_reaches_the_same_endpoint(world: LocalWorld, on: int) -> None:
    counter = await world[0].spawn(Counter, kwargs={"start": 10}, on=on)
    async with asyncio.timeout(5):
        assert await counter.call("add", 5) == 15
        assert await counter.call("add", k=1) == 16


@pytest.mark.smoke
async def test_call_between_two_nodes_that_are_not_the_spawner_works(world: LocalWorld) -> None:
    await world[0].spawn(Counter, name="third/counter", on=1)
    async with asyncio.timeout(5):
        counter = await world[2].lookup("third/counter")
        assert await counter.call(Counter.add, 3) == 3


@pytest.mark.smoke
async def test_tells_are_applied_in_order(world: LocalWorld, on: int) -> None:
    recorder = await world[0].spawn(Recorder, on=on)
    for i in range(100):
        recorder.tell(Recorder.append, "main", i)
    recorder.tell("append", "by name", 100)
    async with asyncio.timeout(5):
        assert await recorder.call(Recorder.entries) == [*(["main", i] for i in range(100)), ["by name", 100]]


async def test_calls_from_one_caller_start_in_the_order_they_were_sent(world: LocalWorld, on: int) -> None:
    gate = await world[0].spawn(Gate, on=on)
    async with asyncio.timeout(5):
        await asyncio.gather(*(gate.call(Gate.enter, i) for i in range(50)))
        assert await gate.call(Gate.order) == list(range(50))


async def test_actor_handles_one_message_at_a_time_by_default(world: LocalWorld, on: int) -> None:
    serial = await world[0].spawn(Serial, on=on)
    async with asyncio.timeout(5):
        await asyncio.gather(serial.call(Serial.work, "a"), serial.call(Serial.work, "b"))
        history = await serial.call(Serial.history)
    assert history == [("enter", "a"), ("exit", "a"), ("enter", "b"), ("exit", "b")]


async def test_actor_with_max_concurrency_interleaves_at_awaits(world: LocalWorld, on: int) -> None:
    interleaving = await world[0].spawn(Interleaving, on=on)
    async with asyncio.timeout(5):
        await asyncio.gather(interleaving.call(Serial.work, "a"), interleaving.call(Serial.work, "b"))
        history = await interleaving.call(Serial.history)
    assert history == [("enter", "a"), ("enter", "b"), ("exit", "a"), ("exit", "b")]


@pytest.mark.parametrize(("rank_a", "rank_b"), [(0, 0), (1, 2), (0, 1)], ids=["one node", "two other nodes", "mixed"])
async def test_reentrant_chain_back_to_the_first_actor_completes(world: LocalWorld, rank_a: int, rank_b: int) -> None:
    a = await world[0].spawn(Ping, on=rank_a)
    b = await world[0].spawn(Ping, on=rank_b)
    async with asyncio.timeout(5):
        assert await a.call(Ping.via, b) == [1]
        assert await a.call(Ping.via, b) == [2]


@pytest.mark.parametrize(("rank_a", "rank_b"), [(0, 0), (1, 2), (0, 1)], ids=["one node", "two other nodes", "mixed"])
async def test_concurrent_reentrant_chains_complete(world: LocalWorld, rank_a: int, rank_b: int) -> None:
    a = await world[0].spawn(Ping, on=rank_a)
    b = await world[0].spawn(Ping, on=rank_b)
    async with asyncio.timeout(5):
        results = await asyncio.gather(a.call(Ping.via, b, 3), a.call(Ping.via, b, 3))
    assert sorted(results[0] + results[1]) == list(range(1, 7))


@pytest.mark.smoke
async def test_asyncio_timeout_around_a_call_raises_timeout_error_and_cancels_the_handler(
    world: LocalWorld, on: int
) -> None:
    slow = await world[0].spawn(Slow, on=on)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await slow.call(Slow.sleep, 10)
    await wait_until_counts(slow, started=1, cancelled=1)


async def test_anyio_fail_after_around_a_call_raises_timeout_error_and_cancels_the_handler(
    world: LocalWorld, on: int
) -> None:
    slow = await world[0].spawn(Slow, on=on)
    with pytest.raises(TimeoutError), anyio.fail_after(0.05):
        await slow.call(Slow.sleep, 10)
    await wait_until_counts(slow, started=1, cancelled=1)


async def test_call_finishing_before_its_deadline_returns_normally(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=on)
    async with asyncio.timeout(2):
        assert await slow.call(Slow.sleep, 0.01) == "slept"
    await wait_until_counts(slow, started=1, cancelled=0)


async def test_cancelling_the_awaiting_task_cancels_the_handler(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=on)
    task = asyncio.ensure_future(slow.call(Slow.sleep, 10))
    await wait_until_counts(slow, started=1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until_counts(slow, started=1, cancelled=1)


async def test_handler_sees_the_remaining_deadline_of_an_asyncio_timeout(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=on)
    async with asyncio.timeout(1.0):
        left = await slow.call(Slow.time_left)
    assert left is not None
    assert 0.5 < left <= 1.0


async def _deadline_seen_across_nodes_with_timers_armed() -> tuple[float | None, int]:
    """A call in a scope, from a local_world in this loop, with 200 other scopes armed; what the handler saw."""
    loop = asyncio.get_running_loop()

    async def waiting() -> None:
        async with asyncio.timeout(60):
            await asyncio.sleep(60)

    others = [asyncio.create_task(waiting()) for _ in range(200)]
    await asyncio.sleep(0)
    async with local_world(2, stop_grace=0.5) as running:
        slow = await running[0].spawn(Slow, on=1)
        async with asyncio.timeout(1.0):
            left = await slow.call(Slow.time_left)
    filed = len(getattr(loop, "timeouts_by_task", {}))
    for other in others:
        other.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    return left, filed


@pytest.mark.parametrize("factory", [new_event_loop, asyncio.new_event_loop], ids=["actorch", "plain"])
def test_a_local_world_in_a_loop_of_your_own_carries_deadlines_on_either_kind_of_loop(
    factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    with asyncio.Runner(loop_factory=factory) as runner:
        left, filed = runner.run(_deadline_seen_across_nodes_with_timers_armed())
    assert left is not None
    assert 0.5 < left <= 1.0
    if factory is new_event_loop:  # it files each scope under its task (the 200 waiting ones at least)
        assert filed >= 200
    else:
        assert filed == 0


async def test_handler_sees_the_remaining_deadline_of_anyio_fail_after(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=on)
    with anyio.fail_after(1.0):
        left = await slow.call(Slow.time_left)
    assert left is not None
    assert 0.5 < left <= 1.0


async def test_handler_sees_no_deadline_when_the_caller_has_none(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=on)
    assert await slow.call(Slow.time_left) is None


async def test_deadline_travels_down_a_chain_of_calls(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=2)
    forwarder = await world[0].spawn(Forwarder, on=on)
    async with asyncio.timeout(1.0):
        left = await forwarder.call(Forwarder.time_left_via, slow)
    assert left is not None
    assert 0.5 < left <= 1.0


async def test_ref_sent_in_a_message_works_on_the_other_node(world: LocalWorld, on: int) -> None:
    counter = await world[0].spawn(Counter, on=2)
    forwarder = await world[0].spawn(Forwarder, on=on)
    async with asyncio.timeout(5):
        assert await forwarder.call(Forwarder.add_via, counter, 3) == 3
        assert await counter.call(Counter.add, 1) == 4


async def test_refs_nested_in_containers_work_on_the_other_node(world: LocalWorld, on: int) -> None:
    counters = [await world[0].spawn(Counter, args=(i * 10,), on=i) for i in range(3)]
    forwarder = await world[0].spawn(Forwarder, on=on)
    async with asyncio.timeout(5):
        assert await forwarder.call(Forwarder.add_via_all, {"refs": counters}) == [1, 11, 21]


async def test_ref_returned_from_a_call_equals_the_original_and_works(world: LocalWorld, on: int) -> None:
    counter = await world[0].spawn(Counter, on=2)
    forwarder = await world[0].spawn(Forwarder, on=on)
    async with asyncio.timeout(5):
        echoed = await forwarder.call(Forwarder.echo, (counter, [counter]))
        assert echoed == (counter, [counter])
        assert echoed[0].name == counter.name
        assert await echoed[1][0].call(Counter.add, 2) == 2


async def test_tensors_round_trip_through_a_call(world: LocalWorld, on: int) -> None:
    store = await world[0].spawn(Store, on=on)
    batch = {"x": torch.arange(6.0).reshape(2, 3), "y": torch.ones(4, dtype=torch.int64)}
    async with asyncio.timeout(5):
        doubled = await store.call(Store.double, batch)
    assert set(doubled) == {"x", "y"}
    assert torch.equal(doubled["x"], batch["x"] * 2)
    assert torch.equal(doubled["y"], batch["y"] * 2)
    assert doubled["y"].dtype == torch.int64


async def test_tell_with_a_tensor_sends_its_values_at_the_time_of_the_tell(world: LocalWorld, on: int) -> None:
    store = await world[0].spawn(Store, on=on)
    tensor = torch.zeros(8)
    store.tell(Store.keep, tensor)
    tensor.add_(1)
    async with asyncio.timeout(5):
        kept = await store.call(Store.first_kept)
    assert torch.equal(kept, torch.zeros(8))


class StartOrder(actorch.Actor):
    """Records the order messages start in; lets four run at once."""

    max_concurrency = 4

    def __init__(self) -> None:
        self.started: list[int] = []

    async def note(self, i: int) -> None:
        self.started.append(i)

    async def pause(self, i: int, seconds: float) -> None:
        self.started.append(i)
        await asyncio.sleep(seconds)

    async def seen(self) -> list[int]:
        return list(self.started)


async def test_messages_start_in_sending_order_with_max_concurrency_above_one(world: LocalWorld, on: int) -> None:
    recorder = await world[0].spawn(StartOrder, on=on)
    for i in range(10):
        recorder.tell(StartOrder.note, i)
    assert await recorder.call(StartOrder.seen) == list(range(10))


async def test_concurrent_actor_still_runs_messages_side_by_side(world: LocalWorld, on: int) -> None:
    recorder = await world[0].spawn(StartOrder, on=on)
    async with asyncio.timeout(2):
        started = time.monotonic()
        await asyncio.gather(*(recorder.call(StartOrder.pause, i, 0.2) for i in range(4)))
        assert time.monotonic() - started < 0.6
    assert await recorder.call(StartOrder.seen) == [0, 1, 2, 3]


async def test_deadline_travels_with_calls_awaited_in_other_tasks(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=on)
    async with asyncio.timeout(5):
        gathered = await asyncio.gather(slow.call(Slow.time_left), slow.call(Slow.time_left))
        async with asyncio.TaskGroup() as group:
            task = group.create_task(slow.call(Slow.time_left))
    for left in [*gathered, task.result()]:
        assert left is not None
        assert 4.0 < left <= 5.0


async def test_deadline_of_a_call_is_read_where_it_is_made(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=on)
    async with asyncio.timeout(5):  # noqa: ASYNC100 - the call is made, not awaited, in the scope
        pending = slow.call(Slow.time_left)
    assert (await pending) is not None
    assert await slow.call(Slow.time_left) is None


class Grinder(actorch.Actor):
    """Handlers that compute without awaiting, and note what ran between them."""

    def __init__(self) -> None:
        self.log: list[str] = []

    async def grind(self, tag: str, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - computing without awaiting is the point
        self.log.append(tag)
        if tag == "first":
            asyncio.get_running_loop().call_soon(self.log.append, "loop ran")

    async def history(self) -> list[str]:
        return self.log


async def test_worker_lets_the_loop_run_between_long_queued_messages(world: LocalWorld) -> None:
    ref = await world[0].spawn(Grinder)
    for tag in ("first", "second", "third"):
        ref.tell(Grinder.grind, tag, 0.01)  # each longer than a work slice
    await asyncio.sleep(0.2)
    assert await ref.call(Grinder.history) == ["first", "loop ran", "second", "third"]


# ---------------------------------------------------------------------- a call to another node is a future


async def test_a_call_to_another_node_leaves_before_it_is_awaited(world: LocalWorld) -> None:
    slow = await world[0].spawn(Slow, on=1)
    pending = slow.call(Slow.sleep, 0)
    await wait_until_counts(slow, started=1)
    assert await pending == "slept"


async def test_a_call_to_another_node_runs_as_a_task_in_a_task_group_and_under_anyio(world: LocalWorld) -> None:
    slow = await world[0].spawn(Slow, on=1)
    assert await asyncio.create_task(slow.call(Slow.sleep, 0)) == "slept"
    async with asyncio.TaskGroup() as group:
        task = group.create_task(slow.call(Slow.sleep, 0))
    assert task.result() == "slept"
    results: list[str] = []

    async def keep(call: Any) -> None:
        results.append(await call)

    async with anyio.create_task_group() as anyio_group:
        anyio_group.start_soon(slow.call, Slow.sleep, 0)
        anyio_group.start_soon(keep, slow.call(Slow.sleep, 0))
    assert results == ["slept"]
    await wait_until_counts(slow, started=4)


async def test_errors_of_a_call_to_another_node_are_raised_where_it_is_awaited(world: LocalWorld) -> None:
    counter = await world[0].spawn(Counter, on=2)
    world.kill(2)
    pending = counter.call(Counter.add, 1)  # no error here
    with pytest.raises(actorch.NodeLostError, match="node 2"):
        await pending
    assert world._hosts[0].node.caller.pending == {}


async def test_cancelling_a_call_to_another_node_cancels_its_handler_and_frees_its_slot(world: LocalWorld) -> None:
    slow = await world[0].spawn(Slow, on=1)
    pending = slow.call(Slow.sleep, 10)
    await wait_until_counts(slow, started=1)
    assert pending.cancel()  # type: ignore[attr-defined]
    with pytest.raises(asyncio.CancelledError):
        await pending
    await wait_until_counts(slow, started=1, cancelled=1)
    assert world._hosts[0].node.caller.pending == {}
    assert world._hosts[0].node.flow.outstanding == {}


async def test_a_task_cancelled_before_it_awaits_its_call_cancels_the_call(world: LocalWorld) -> None:
    slow = await world[0].spawn(Slow, on=1)
    task = asyncio.create_task(slow.call(Slow.sleep, 10))
    task.cancel()  # before the task's first step: the cancellation is thrown into the call
    with pytest.raises(asyncio.CancelledError):
        await task
    assert world._hosts[0].node.caller.pending == {}
    counts = await slow.call(Slow.counts)
    assert counts["started"] == counts["cancelled"]  # it never ran, or it was cancelled


async def test_closing_an_unawaited_call_to_another_node_cancels_it(world: LocalWorld) -> None:
    slow = await world[0].spawn(Slow, on=1)
    pending = slow.call(Slow.sleep, 10)
    await wait_until_counts(slow, started=1)
    pending.close()
    await wait_until_counts(slow, started=1, cancelled=1)
    assert pending.cancelled()  # type: ignore[attr-defined]
    assert world._hosts[0].node.caller.pending == {}


async def test_a_call_made_in_another_thread_runs_on_the_nodes_loop(world: LocalWorld, on: int) -> None:
    slow = await world[0].spawn(Slow, on=on)
    loop = asyncio.get_running_loop()

    def from_a_thread() -> tuple[bool, str]:
        made = slow.call(Slow.sleep, 0)  # nothing of the loop's is touched from this thread
        return isinstance(made, asyncio.Future), asyncio.run_coroutine_threadsafe(made, loop).result(5)

    assert await asyncio.to_thread(from_a_thread) == (False, "slept")
    assert world._hosts[0].node.caller.pending == {}


class Publisher(actorch.Actor):
    """Sends the same weights, wrapped in actorch.shared, to whoever asks."""

    def __init__(self) -> None:
        self.weights = actorch.shared({"w": torch.arange(4.0)})

    async def weights_now(self) -> Any:
        return self.weights

    async def stream_weights(self, count: int) -> Any:
        for _ in range(count):
            yield self.weights


async def test_a_shared_result_reaches_its_caller_as_its_value_here_and_on_another_node(
    world: LocalWorld, on: int
) -> None:
    publisher = await world[0].spawn(Publisher, on=on)
    got = await publisher.call(Publisher.weights_now)
    assert type(got) is dict
    assert got["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    items = [item async for item in publisher.stream(Publisher.stream_weights, 2)]
    assert [type(item) for item in items] == [dict, dict]
