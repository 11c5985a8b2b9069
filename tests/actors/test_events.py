"""Membership events, and names of lost nodes: gone at once, never returned by a lookup."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import actorch
from actorch._actors.registry import Registry
from actorch.testing import LocalWorld, local_world


class Worker(actorch.Actor):
    fatal_errors = (RuntimeError,)

    async def ping(self) -> str:
        return "pong"

    async def break_down(self) -> None:
        raise RuntimeError("broken")


async def take(events: Any, count: int) -> list[Any]:
    taken = []
    async with asyncio.timeout(2.0):
        for _ in range(count):
            taken.append(await anext(events))
    return taken


async def test_events_start_with_the_current_state_then_follow_changes(world: LocalWorld) -> None:
    first = await world[0].spawn(Worker, name="jobs/a", on=1)
    events = world[0].events()
    initial = await take(events, 4)
    assert [type(event) for event in initial] == [actorch.NodeJoined] * 3 + [actorch.NameRegistered]
    assert [event.rank for event in initial[:3]] == [0, 1, 2]
    assert initial[0].info == world[0].nodes[0]
    assert initial[3] == actorch.NameRegistered("jobs/a", first)
    second = await world[0].spawn(Worker, name="jobs/b", on=2)
    await first.stop()
    assert await take(events, 2) == [
        actorch.NameRegistered("jobs/b", second),
        actorch.NameRemoved("jobs/a", "stopped"),
    ]
    await events.aclose()
    assert world._hosts[0].events.subscriptions == set()


async def test_events_can_be_watched_from_any_node_and_filtered_by_pattern(world: LocalWorld) -> None:
    await world[0].spawn(Worker, name="other/x")
    events = world[2].events("jobs/*")
    assert [type(event) for event in await take(events, 3)] == [actorch.NodeJoined] * 3
    await world[0].spawn(Worker, name="other/y")
    job = await world[1].spawn(Worker, name="jobs/c", on=1)
    assert await take(events, 1) == [actorch.NameRegistered("jobs/c", job)]
    await events.aclose()


async def test_a_lost_node_and_its_names_are_reported(world: LocalWorld) -> None:
    ref = await world[0].spawn(Worker, name="jobs/lost", on=2)
    events = world[1].events()
    assert len(await take(events, 4)) == 4
    world.kill(2)
    lost, removed = await take(events, 2)
    assert lost == actorch.NodeLost(2, "killed by the test")
    assert removed == actorch.NameRemoved("jobs/lost", "node_lost")
    assert ref not in await world[1].lookup_all("**")
    await events.aclose()


async def test_a_failed_actor_name_is_removed_as_failed(world: LocalWorld) -> None:
    ref = await world[0].spawn(Worker, name="jobs/fragile", on=1)
    events = world[0].events("jobs/**")
    assert len(await take(events, 4)) == 4
    with pytest.raises(RuntimeError):
        await ref.call(Worker.break_down)
    assert await take(events, 1) == [actorch.NameRemoved("jobs/fragile", "failed")]
    await events.aclose()


async def test_events_end_when_the_node_shuts_down() -> None:
    async with local_world(2) as world:
        events = world[1].events()
        assert len(await take(events, 2)) == 2
        collected = asyncio.ensure_future(asyncio.wait_for(_drain(events), 2.0))
        await asyncio.sleep(0.01)
    assert await collected == []


async def _drain(events: Any) -> list[Any]:
    return [event async for event in events]


async def test_changes_racing_the_snapshot_are_neither_lost_nor_doubled(world: LocalWorld) -> None:
    events = world[1].events("race/*")
    pending = asyncio.ensure_future(take(events, 3))  # the 3 NodeJoined
    spawned = [await world[0].spawn(Worker, name=f"race/{index}") for index in range(5)]
    await pending
    names = [event.name for event in await take(events, 5)]
    assert names == [f"race/{index}" for index in range(5)]
    assert all(ref.name in names for ref in spawned)
    await events.aclose()


async def test_lookup_waits_rather_than_return_a_name_of_a_lost_node(world: LocalWorld) -> None:
    await world[0].spawn(Worker, name="svc/one", on=2)
    world._hosts[1].node._on_peer_lost(2, "seen lost by node 1 first")  # the registry has not heard yet
    looking = asyncio.ensure_future(world[1].lookup("svc/one"))
    await asyncio.sleep(0.15)
    assert not looking.done()
    world._hosts[0].node._on_peer_lost(2, "now the registry hears")
    replacement = await world[0].spawn(Worker, name="svc/one", on=0)
    assert await asyncio.wait_for(looking, 2.0) == replacement


async def test_lookup_of_a_name_only_a_lost_node_holds_times_out() -> None:
    async with local_world(3, lookup_timeout=0.2) as world:
        await world[0].spawn(Worker, name="svc/dead", on=2)
        world._hosts[1].node._on_peer_lost(2, "seen lost by node 1 only")
        with pytest.raises(actorch.ActorNotFoundError, match="svc/dead"):
            await world[1].lookup("svc/dead")


async def test_a_name_reserved_by_a_node_that_is_lost_becomes_free(world: LocalWorld) -> None:
    registry = world._hosts[0].node.cell(2).instance
    assert isinstance(registry, Registry)
    await registry.reserve("half/done", 2)
    with pytest.raises(actorch.NameTakenError):
        await world[0].spawn(Worker, name="half/done", on=1)
    world.kill(2)
    ref = await world[0].spawn(Worker, name="half/done", on=1)
    assert await ref.call(Worker.ping) == "pong"
