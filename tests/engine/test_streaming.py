"""Streaming endpoints over a three-node in-process world, from an actor on the consumer's node or another.

mypy passes on this file (``MYPYPATH=tests/mp_scripts mypy --strict``): its
``type: ignore`` comments are checked by ``warn_unused_ignores``, so they prove
that mypy rejects a streaming endpoint called, a plain one streamed, and bad
stream arguments.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import torch
from actors import Drainer, Producer

import actorch
from actorch.testing import LocalWorld, local_world


async def consume(
    stream: actorch.Stream[int], received: list[int], then: Callable[[int], object] | None = None
) -> None:
    """Append every item of ``stream`` to ``received``, calling ``then(item)`` after each."""
    async for item in stream:
        received.append(item)
        if then is not None:
            then(item)


def raise_at(at: int) -> Callable[[int], None]:
    def check(item: int) -> None:
        if item == at:
            raise KeyError(item)

    return check


async def settled(producer: actorch.ActorRef[Producer], closed: int = 1) -> dict[str, Any]:
    """The producer's status once its generator has been closed ``closed`` times (within 5 s)."""
    with anyio.fail_after(5):
        while True:
            status = await producer.call(Producer.status)
            if status["closed"] >= closed:
                return status
            await asyncio.sleep(0.01)


class Relay(actorch.Actor):
    """Consumes a stream in a handler; the producer calls back into it for every item (A → B → A)."""

    def __init__(self) -> None:
        self.pings = 0

    async def consume(self, echo: actorch.ActorRef[Echo], n: int) -> list[int]:
        return [item async for item in echo.stream(Echo.back, self.ref, n)]

    async def ping(self) -> int:
        self.pings += 1
        return self.pings


class Echo(actorch.Actor):
    async def back(self, relay: actorch.ActorRef[Relay], n: int) -> AsyncIterator[int]:
        for _ in range(n):
            yield await relay.call(Relay.ping)


class Serial(actorch.Actor):
    """One message at a time (the default): a running stream holds it."""

    async def forever(self) -> AsyncIterator[int]:
        while True:
            await asyncio.sleep(0.01)
            yield 1

    async def quick(self) -> str:
        return "quick"

    async def identity(self, value: Any) -> Any:
        yield value

    async def lock(self) -> AsyncIterator[threading.Lock]:
        self.closed = False
        try:
            yield threading.Lock()
        finally:
            self.closed = True

    async def was_closed(self) -> bool:
        return self.closed


class Batching(actorch.Actor):
    @actorch.batched(max_batch=4)
    async def double(self, items: list[int]) -> list[int]:
        return [2 * item for item in items]


# ---------------------------------------------------------------------- delivery


async def test_items_arrive_in_order_and_once_each(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    items = [item async for item in producer.stream(Producer.count, 500).with_window(4)]
    assert items == list(range(500))
    status = await settled(producer)
    assert status["made"] == 500


async def test_a_string_names_the_endpoint_too(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    assert [item async for item in producer.stream("count", 3)] == [0, 1, 2]


async def test_an_empty_stream_ends_at_once(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    assert [item async for item in producer.stream(Producer.count, 0)] == []


@pytest.mark.parametrize("window", [1, 3, actorch.DEFAULT_STREAM_WINDOW])
async def test_the_producer_runs_at_most_a_window_ahead_of_a_slow_consumer(
    world: LocalWorld, on: int, window: int
) -> None:
    producer = await world[0].spawn(Producer, on=on)
    stream = producer.stream(Producer.count)
    if window != actorch.DEFAULT_STREAM_WINDOW:
        stream = stream.with_window(window)
    assert stream.window == window
    leads = []
    async with stream:
        async for item in stream:
            await asyncio.sleep(0.01)  # slow: the producer fills its window meanwhile
            leads.append((await producer.call(Producer.status))["made"] - (item + 1))
            if item == 3 * window:
                break
    assert max(leads) <= window, leads
    assert max(leads) >= window // 2, f"the producer was never let ahead: {leads}"


async def test_a_window_is_an_int_of_at_least_one(world: LocalWorld) -> None:
    producer = await world[0].spawn(Producer)
    stream = producer.stream(Producer.count, 3)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="window is an int >= 1"):
            stream.with_window(bad)  # type: ignore[arg-type]


async def test_a_larger_window_set_midway_lets_the_producer_further_ahead(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    async with producer.stream(Producer.count).with_window(2) as stream:
        assert await anext(stream) == 0
        stream.with_window(10)
        await asyncio.sleep(0.05)
        assert (await producer.call(Producer.status))["made"] == 1 + 10


async def test_a_stream_not_iterated_never_starts_its_producer(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    stream = producer.stream(Producer.count, 5)
    await asyncio.sleep(0.02)
    assert (await producer.call(Producer.status))["made"] == 0
    assert "not open" in repr(stream)
    assert (stream.endpoint, stream.window) == ("count", actorch.DEFAULT_STREAM_WINDOW)
    assert "Producer" in stream.label


async def test_same_node_items_are_the_objects_yielded_and_other_nodes_get_copies(world: LocalWorld) -> None:
    value = {"tensor": torch.ones(3)}
    here = await world[0].spawn(Serial)
    there = await world[0].spawn(Serial, on=1)
    [same] = [item async for item in here.stream(Serial.identity, value)]
    [copy] = [item async for item in there.stream(Serial.identity, value)]
    assert same is value
    assert copy is not value
    assert torch.equal(copy["tensor"], value["tensor"])


async def test_a_buffer_the_producer_overwrites_after_yielding_arrives_as_it_was_yielded(world: LocalWorld) -> None:
    producer = await world[0].spawn(Producer, on=1)
    items = [item async for item in producer.stream(Producer.tensors, 50).with_window(50)]
    assert [int(item[0]) for item in items] == list(range(50))


# ---------------------------------------------------------------------- ending early


async def test_break_closes_the_producer_and_its_finally_runs(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    async for item in producer.stream(Producer.count):
        if item == 5:
            break
    gc.collect()  # CPython drops the stream at once; this only makes it certain elsewhere
    status = await settled(producer)
    assert status["made"] <= 6 + actorch.DEFAULT_STREAM_WINDOW


async def test_aclose_and_leaving_async_with_close_the_producer(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    stream = producer.stream(Producer.count)
    assert await anext(stream) == 0
    await stream.aclose()
    await settled(producer, closed=1)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    async with producer.stream(Producer.count) as items:
        assert await anext(items) == 0
    await settled(producer, closed=2)


async def test_an_error_in_the_consumer_loop_closes_the_producer(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    with pytest.raises(KeyError):
        await consume(producer.stream(Producer.count), [], raise_at(2))
    await settled(producer)


async def test_cancelling_the_consuming_task_closes_the_producer(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    received: list[int] = []

    async def consume() -> None:
        async for item in producer.stream(Producer.count, delay=0.01):
            received.append(item)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert received
    await settled(producer)


async def test_a_deadline_around_the_loop_bounds_the_whole_stream(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    received: list[int] = []

    async def within_a_deadline() -> None:
        async with asyncio.timeout(0.2):
            await consume(producer.stream(Producer.count, delay=0.02), received)

    with pytest.raises(TimeoutError):
        await within_a_deadline()
    assert 2 < len(received) < 20
    status = await settled(producer)
    assert status["deadlines"][0] is not None, "the producer runs within the consumer's deadline"


async def test_a_deadline_around_one_item_bounds_that_item_and_ends_the_stream(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    stream = producer.stream(Producer.count, delay=0.5)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await anext(stream)
    await settled(producer)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_an_anyio_deadline_reaches_the_producer(world: LocalWorld) -> None:
    producer = await world[0].spawn(Producer, on=1)
    with pytest.raises(TimeoutError), anyio.fail_after(0.15):
        async for _ in producer.stream(Producer.count, delay=0.01):
            pass
    status = await settled(producer)
    assert status["deadlines"][0] is not None


# ---------------------------------------------------------------------- errors


async def test_a_producer_error_ends_the_stream_after_the_items_before_it(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    received: list[int] = []
    stream = producer.stream(Producer.count, 10, fail_at=3)
    with pytest.raises(actorch.RemoteError, match="failed at 3") as caught:
        await consume(stream, received)
    assert received == [0, 1, 2]
    assert isinstance(caught.value, ValueError)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)  # the error is raised once; then the stream is over


async def test_calling_a_streaming_endpoint_names_the_right_verb(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    with pytest.raises(actorch.EndpointError, match=r"streaming endpoint.*ref\.stream"):
        await producer.call(Producer.count, 3)  # type: ignore[call-overload]
    with pytest.raises(actorch.EndpointError, match=r"streaming endpoint.*ref\.stream"):
        producer.tell(Producer.count, 3)


async def test_streaming_a_plain_or_batched_endpoint_names_the_right_verb(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    with pytest.raises(actorch.EndpointError, match=r"not a streaming endpoint.*ref\.call"):
        async for _ in producer.stream(Producer.plain):  # type: ignore[call-overload]
            pass
    batching = await world[0].spawn(Batching, on=on)
    with pytest.raises(actorch.EndpointError, match=r"not a streaming endpoint"):
        async for _ in batching.stream("double"):
            pass


async def test_an_unknown_endpoint_or_bad_arguments_fail_the_stream(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    with pytest.raises(actorch.EndpointError, match="has no endpoint 'nothing'"):
        async for _ in producer.stream("nothing"):
            pass
    with pytest.raises(actorch.EndpointError, match="bad arguments"):
        async for _ in producer.stream(Producer.count, 1, 2, 3, 4):  # type: ignore[call-overload]
            pass


async def test_an_item_that_cannot_be_sent_ends_the_stream_and_closes_the_producer(world: LocalWorld) -> None:
    there = await world[0].spawn(Serial, on=1)
    with pytest.raises(actorch.SerializationError, match="item 0 of the stream"):
        async for _ in there.stream(Serial.lock):
            pass
    assert await there.call(Serial.was_closed)


async def test_arguments_or_an_item_over_max_message_size_end_the_stream() -> None:
    async with local_world(2, max_message_size=1024) as world:
        producer = await world[0].spawn(Producer, on=1)
        received = [item async for item in producer.stream(Producer.tensors, 2, size=16)]
        assert len(received) == 2
        with pytest.raises(actorch.MessageTooLargeError, match="item 0 of the stream"):
            async for _ in producer.stream(Producer.tensors, 2, size=1024):
                pass
        await settled(producer, closed=0)
        serial = await world[0].spawn(Serial, on=1)
        with pytest.raises(actorch.MessageTooLargeError, match="stream of 'identity'"):
            async for _ in serial.stream(Serial.identity, "x" * 4096):
                pass


async def test_streaming_a_stopped_actor_raises_actor_stopped(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    await producer.stop()
    with pytest.raises(actorch.ActorStoppedError):
        async for _ in producer.stream(Producer.count, 3):
            pass


async def test_the_producer_stopping_mid_stream_raises_actor_stopped(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)
    received: list[int] = []
    stopping: list[asyncio.Task[None]] = []

    def stop_at_2(item: int) -> None:
        if item == 2:
            stopping.append(asyncio.get_running_loop().create_task(producer.stop()))

    with pytest.raises(actorch.ActorStoppedError):
        await consume(producer.stream(Producer.count, delay=0.01), received, stop_at_2)
    await stopping[0]
    assert received[:3] == [0, 1, 2]


async def test_stopping_ends_open_streams_at_once_and_still_runs_the_queued_calls(on: int) -> None:
    async with local_world(3, stop_grace=30.0) as world:  # a stream would hold a drain for the whole grace
        serial = await world[0].spawn(Serial, on=on)
        stream = serial.stream(Serial.forever)
        await anext(stream)
        queued_call = asyncio.ensure_future(serial.call(Serial.quick))
        queued_stream = serial.stream(Serial.forever)
        opening = asyncio.ensure_future(anext(queued_stream))
        await asyncio.sleep(0.05)
        with anyio.fail_after(5):
            await serial.stop()
            assert await queued_call == "quick", "a call queued behind the stream still runs"
            with pytest.raises(actorch.ActorStoppedError, match="stopped while handling 'forever'"):
                async for _ in stream:
                    pass
            with pytest.raises(actorch.ActorStoppedError, match="stopping; stream 'forever' refused"):
                await opening


async def test_losing_the_producers_node_mid_stream_raises_node_lost(world: LocalWorld) -> None:
    producer = await world[0].spawn(Producer, on=1)
    received: list[int] = []

    def kill_at_2(item: int) -> None:
        if item == 2:
            world.kill(1)

    with pytest.raises(actorch.NodeLostError, match="node 1 was lost while streaming 'count'"):
        await consume(producer.stream(Producer.count, delay=0.01), received, kill_at_2)
    with pytest.raises(actorch.NodeLostError):
        async for _ in producer.stream(Producer.count):
            pass


async def test_losing_the_consumers_node_closes_the_producer(world: LocalWorld) -> None:
    producer = await world[0].spawn(Producer, on=2)
    drainer = await world[0].spawn(Drainer, on=1)
    drainer.tell(Drainer.drain, producer)
    with anyio.fail_after(5):
        while (await producer.call(Producer.status))["made"] == 0:  # noqa: ASYNC110 - another node's state
            await asyncio.sleep(0.01)
    world.kill(1)
    await settled(producer)


# ---------------------------------------------------------------------- concurrency


async def test_a_running_stream_holds_a_one_at_a_time_actor(world: LocalWorld, on: int) -> None:
    serial = await world[0].spawn(Serial, on=on)
    async with serial.stream(Serial.forever) as stream:
        await anext(stream)
        quick = asyncio.ensure_future(serial.call(Serial.quick))
        await asyncio.sleep(0.1)
        assert not quick.done(), "a call ran beside the stream on a one-at-a-time actor"
    assert await quick == "quick"


async def test_max_concurrency_lets_calls_run_beside_a_stream(world: LocalWorld, on: int) -> None:
    producer = await world[0].spawn(Producer, on=on)  # max_concurrency 4
    async with producer.stream(Producer.count) as stream:
        await anext(stream)
        with anyio.fail_after(2):
            assert (await producer.call(Producer.status))["made"] >= 1


@pytest.mark.parametrize(("rank_a", "rank_b"), [(0, 0), (0, 1), (1, 2)])
async def test_a_producer_calling_back_into_its_consumer_completes(world: LocalWorld, rank_a: int, rank_b: int) -> None:
    relay = await world[0].spawn(Relay, on=rank_a)
    echo = await world[0].spawn(Echo, on=rank_b)
    with anyio.fail_after(5):
        assert await relay.call(Relay.consume, echo, 5) == [1, 2, 3, 4, 5]


async def test_a_stream_is_consumed_on_its_nodes_loop_only(world: LocalWorld) -> None:
    producer = await world[0].spawn(Producer, on=1)
    stream = producer.stream(Producer.count, 3)
    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            asyncio.run(anext(stream))
        except BaseException as exc:  # the test looks at it
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert isinstance(errors[0], RuntimeError)
    assert "its node's event loop" in str(errors[0])
