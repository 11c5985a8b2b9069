"""A call that fails at once still lets the event loop run, so a retry loop with no pause cannot starve a node."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from _mp import run_script

import actorch
from actorch.testing import LocalWorld, local_world

TRIES = 20


class Flaky(actorch.Actor):
    async def fail_at_once(self) -> None:
        raise ValueError("at once")

    async def echo(self, value: object) -> object:
        return value

    async def numbers(self) -> Any:
        yield 1


async def loop_runs_during(attempt: Callable[[], Awaitable[Any]], expected: type[BaseException]) -> int:
    """How many times another task ran while ``TRIES`` failing attempts were retried with no pause."""
    ran = 0

    async def beside() -> None:
        nonlocal ran
        while True:
            ran += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(beside())
    await asyncio.sleep(0)
    ran = 0
    try:
        for _ in range(TRIES):
            with pytest.raises(expected):
                await attempt()
    finally:
        task.cancel()
    return ran


async def test_a_retry_loop_on_a_stopped_actor_lets_the_loop_run(world: LocalWorld, on: int) -> None:
    flaky = await world[0].spawn(Flaky, on=on)
    await flaky.stop()
    assert await loop_runs_during(lambda: flaky.call(Flaky.echo, 1), actorch.ActorStoppedError) >= TRIES


async def test_a_retry_loop_on_a_handler_that_raises_at_once_lets_the_loop_run(world: LocalWorld, on: int) -> None:
    flaky = await world[0].spawn(Flaky, on=on)
    assert await loop_runs_during(lambda: flaky.call(Flaky.fail_at_once), ValueError) >= TRIES
    assert await loop_runs_during(lambda: flaky.call("missing"), actorch.EndpointError) >= TRIES


async def test_a_retry_loop_on_a_lost_node_lets_the_loop_run() -> None:
    async with local_world(3, stop_grace=0.5) as world:
        flaky = await world[0].spawn(Flaky, on=2)
        world._hosts[0].node._on_peer_lost(2, "lost in the test")
        assert await loop_runs_during(lambda: flaky.call(Flaky.echo, 1), actorch.NodeLostError) >= TRIES


async def test_a_retry_loop_on_an_unsendable_argument_lets_the_loop_run() -> None:
    async with local_world(2, strict=True, stop_grace=0.5) as world:
        flaky = await world[0].spawn(Flaky, on=1)
        assert await loop_runs_during(lambda: flaky.call(Flaky.echo, {1}), actorch.SerializationError) >= TRIES


async def test_a_retry_loop_on_a_stream_of_a_stopped_actor_lets_the_loop_run(world: LocalWorld) -> None:
    flaky = await world[0].spawn(Flaky, on=0)
    await flaky.stop()

    async def consume() -> None:
        async for _ in flaky.stream(Flaky.numbers):
            pass

    assert await loop_runs_during(consume, actorch.ActorStoppedError) >= TRIES


async def test_a_call_that_failed_at_once_and_was_cancelled_stays_cancelled(world: LocalWorld) -> None:
    flaky = await world[0].spawn(Flaky, on=2)
    world._hosts[0].node._on_peer_lost(2, "lost in the test")
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        call = flaky.call(Flaky.echo, 1)
        assert isinstance(call, asyncio.Future)
        assert not call.done(), "its failure is settled once the loop has run"
        call.cancel()
        await asyncio.sleep(0)  # the failure it had would settle it now: it is cancelled already
    finally:
        loop.set_exception_handler(None)
    assert call.cancelled()
    assert unhandled == []


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_retry_loop_on_rank_0_does_not_lose_a_heartbeat_driven_peer() -> None:
    run = run_script("retry_loop.py", timeout=60)
    run.assert_clean_exit(0)
    result = run.result("retry_loop")
    assert result["retries"] > 100, result  # it did retry, with no pause
    assert result["watch"]["missed"] == 0, f"rank 0 missed heartbeats: {result}"
    assert result["watch"]["answered"] > 10, result
    assert result["lost"] == {}, result
