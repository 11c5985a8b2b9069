"""A handler's own log lines name the node, actor, endpoint and call they were written in."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

import actorch
from actorch._engine.message import CallContext, current_call
from actorch._launch.services.logs import configure_logging
from actorch.testing import LocalWorld

user_log = structlog.get_logger("user")


class Chatty(actorch.Actor):
    async def say(self, word: str) -> None:
        user_log.warning("said", word=word)

    async def say_given(self) -> None:
        user_log.warning("given", actor="mine", call="own")

    async def relay(self, other: actorch.ActorRef[Chatty]) -> None:
        user_log.warning("relaying")
        await other.call(Chatty.say, "relayed")

    @actorch.batched(max_batch=4, max_wait=0.01)
    async def say_batch(self, words: list[str]) -> list[None]:
        user_log.warning("batch", words=sorted(words))
        return [None] * len(words)

    async def on_start(self) -> None:
        user_log.warning("starting")


@pytest.fixture
def lines() -> Iterator[list[dict[str, Any]]]:
    """What structlog writes, through ``add_call_context`` (the configuration is restored after)."""
    capture = structlog.testing.LogCapture()
    before = structlog.get_config()
    structlog.configure(processors=[actorch.add_call_context, capture])
    try:
        yield capture.entries
    finally:
        structlog.configure(**before)


def by_event(lines: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == event]


def test_outside_a_handler_the_event_is_left_as_it_is() -> None:
    assert actorch.add_call_context(None, "warning", {"event": "x"}) == {"event": "x"}


def test_the_call_running_now_is_added_and_keys_given_win() -> None:
    token = current_call.set(CallContext("rl/learner", 0x2A, (), "step", None, 3))
    try:
        added = actorch.add_call_context(None, "warning", {"event": "x"})
        given = actorch.add_call_context(None, "warning", {"event": "y", "node": 7, "call": "mine"})
    finally:
        current_call.reset(token)
    assert added == {"event": "x", "node": 3, "actor": "rl/learner", "endpoint": "step", "call": "0x2a"}
    assert given == {"event": "y", "node": 7, "actor": "rl/learner", "endpoint": "step", "call": "mine"}


async def test_a_handlers_lines_name_its_node_actor_endpoint_and_call(
    world: LocalWorld, on: int, lines: list[dict[str, Any]]
) -> None:
    async with asyncio.timeout(10):
        chatty = await world[0].spawn(Chatty, name="logs/chatty", on=on)
        await chatty.call(Chatty.say, "called")
        chatty.tell(Chatty.say, "told")
        await asyncio.gather(*(chatty.call(Chatty.say_batch, word) for word in ("a", "b")))
        await chatty.call(Chatty.say_given)
        user_log.warning("outside")  # the tell ran before the call after it: one mailbox, in order
    [starting] = by_event(lines, "starting")
    assert starting["node"] == on
    assert starting["actor"] == f"actor 'logs/chatty' (Chatty) on node {on}", "as the runtime's own lines name it"
    assert starting["endpoint"] == "on_start"
    said = by_event(lines, "said")
    assert {line["word"] for line in said} == {"called", "told"}
    for line in said:
        assert line["node"] == on
        assert line["actor"] == starting["actor"]
        assert line["endpoint"] == "say"
        assert line["call"].startswith("0x")
    assert said[0]["call"] != said[1]["call"], "each call has its own key"
    batch = by_event(lines, "batch")
    assert batch
    assert all(line["endpoint"] == "say_batch" and line["node"] == on for line in batch)
    [given] = by_event(lines, "given")
    assert given["actor"] == "mine"
    assert given["call"] == "own"
    assert given["endpoint"] == "say_given"
    [outside] = by_event(lines, "outside")
    assert not {"node", "actor", "endpoint", "call"} & set(outside)


async def test_a_call_made_from_a_handler_is_named_by_the_callee(
    world: LocalWorld, lines: list[dict[str, Any]]
) -> None:
    async with asyncio.timeout(10):
        first = await world[0].spawn(Chatty, name="logs/first", on=1)
        second = await world[0].spawn(Chatty, name="logs/second", on=2)
        await first.call(Chatty.relay, second)
    [relaying] = by_event(lines, "relaying")
    [relayed] = [line for line in by_event(lines, "said") if line["word"] == "relayed"]
    first_names = (relaying["node"], relaying["actor"], relaying["endpoint"])
    second_names = (relayed["node"], relayed["actor"], relayed["endpoint"])
    assert first_names == (1, "actor 'logs/first' (Chatty) on node 1", "relay")
    assert second_names == (2, "actor 'logs/second' (Chatty) on node 2", "say")


def test_run_configures_structlog_with_it() -> None:
    before = structlog.get_config()
    try:
        structlog.reset_defaults()
        configure_logging("warning")
        assert actorch.add_call_context in structlog.get_config()["processors"]
    finally:
        structlog.configure(**before)
