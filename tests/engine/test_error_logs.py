"""How loud a failure is logged on the node that hosts the actor: as loud as nobody else hears it.

A failure its caller hears (a call's or a stream's) is logged at debug level; a
failed or refused tell, and a result that could not be sent, stay warnings or errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog

import actorch
from actorch.testing import LocalWorld, local_world

LOUD = ("warning", "error", "critical")


class Brittle(actorch.Actor):
    async def fail(self) -> None:
        raise ValueError("brittle")

    async def echo(self, value: object) -> object:
        return value

    async def make_set(self) -> set[int]:
        return {1, 2}

    async def numbers(self) -> AsyncIterator[int]:
        yield 1
        raise KeyError("no more numbers")

    @actorch.batched(max_batch=4, max_wait=0.01)
    async def square(self, values: list[int]) -> list[int]:
        raise ArithmeticError("no squares today")


def loud(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["log_level"] in LOUD]


async def test_failures_a_caller_hears_are_logged_at_debug_level(world: LocalWorld, on: int) -> None:
    brittle = await world[0].spawn(Brittle, name="logs/brittle", on=on)
    with structlog.testing.capture_logs() as logs:
        async with asyncio.timeout(5):
            with pytest.raises(ValueError, match="brittle"):
                await brittle.call(Brittle.fail)
            with pytest.raises(actorch.EndpointError):
                await brittle.call("missing")
            with pytest.raises(actorch.EndpointError):
                await brittle.call(Brittle.echo, 1, 2)
            with pytest.raises(KeyError):
                async for _ in brittle.stream(Brittle.numbers):
                    pass
            with pytest.raises(ArithmeticError):
                await brittle.call(Brittle.square, 3)
    assert loud(logs) == []
    failed = [entry for entry in logs if entry["event"] == "handler failed"]
    assert [entry["endpoint"] for entry in failed] == ["fail", "numbers", "square"]
    assert all(entry["log_level"] == "debug" and entry["node"] == on for entry in failed)
    assert failed[0]["actor"] == f"actor 'logs/brittle' (Brittle) on node {on}"
    assert failed[0]["error"] == "ValueError: brittle"
    refused = [entry for entry in logs if entry["event"] == "message refused"]
    assert [(entry["endpoint"], entry["log_level"]) for entry in refused] == [("missing", "debug"), ("echo", "debug")]


async def test_a_failed_tell_is_logged_as_an_error(world: LocalWorld, on: int) -> None:
    brittle = await world[0].spawn(Brittle, name="logs/told", on=on)
    with structlog.testing.capture_logs() as logs:
        brittle.tell(Brittle.fail)
        async with asyncio.timeout(5):
            assert await brittle.call(Brittle.echo, 1) == 1  # the tell was handled before
    [entry] = loud(logs)
    assert (entry["event"], entry["log_level"], entry["endpoint"]) == ("tell failed", "error", "fail")
    assert "raise ValueError" in entry["exception"]
    assert "cell.py" not in entry["exception"], "the runtime's frames that ran the handler are left out"


async def test_a_refused_tell_is_logged_as_a_warning() -> None:
    async with local_world(2, stop_grace=0.5) as world:
        brittle = await world[0].spawn(Brittle, on=1)
        world._hosts[1].node.callee.max_message_size = 100  # the receiver refuses what the sender let through
        with structlog.testing.capture_logs() as logs:
            brittle.tell(Brittle.echo, b"x" * 500)
            async with asyncio.timeout(5):
                assert await brittle.call(Brittle.echo, 1) == 1
    [entry] = loud(logs)
    assert (entry["event"], entry["log_level"], entry["endpoint"]) == ("message refused", "warning", "echo")
    assert "MessageTooLargeError" in entry["error"]


async def test_a_result_that_cannot_be_sent_is_logged_as_a_warning() -> None:
    async with local_world(2, strict=True, stop_grace=0.5) as world:
        brittle = await world[0].spawn(Brittle, on=1)
        with structlog.testing.capture_logs() as logs, pytest.raises(actorch.SerializationError):
            async with asyncio.timeout(5):
                await brittle.call(Brittle.make_set)
    assert [(entry["event"], entry["log_level"]) for entry in loud(logs)] == [("result refused", "warning")]


async def test_a_lost_node_is_logged_as_a_warning_once_by_the_lowest_live_rank() -> None:
    async with local_world(4, stop_grace=0.5) as world:
        with structlog.testing.capture_logs() as logs:
            world.kill(3)
            world.kill(0)  # the rank that told the first loss
    told = [(entry["node"], entry["peer"], entry["log_level"]) for entry in logs if entry["event"] == "node lost"]
    assert sorted(told) == [(0, 3, "warning"), (1, 0, "warning"), (1, 3, "debug"), (2, 0, "debug"), (2, 3, "debug")]
