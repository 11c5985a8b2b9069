"""``ActorSystem``: spawning, lifecycle hooks, names across nodes, stopping, statistics."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
import torch
from actors import Counter
from conftest import Spy

import actorch
from actorch._actors.node.node_system import NodeSystem
from actorch._actors.node.service import NodeService
from actorch._actors.node.spawner import Spawner
from actorch._actors.system import ActorSystem, SpawnOptions
from actorch.testing import LocalWorld, local_world

JOURNAL: list[tuple[str, str]] = []
"""Lifecycle events of ``Hooks`` actors, as (tag, event); tests use unique tags."""

_tags = itertools.count()


def new_tag() -> str:
    return f"tag{next(_tags)}"


def events_of(tag: str) -> list[str]:
    return [event for owner, event in JOURNAL if owner == tag]


class Hooks(actorch.Actor):
    def __init__(self, tag: str) -> None:
        self.tag = tag
        JOURNAL.append((tag, "init"))

    async def on_start(self) -> None:
        JOURNAL.append((self.tag, "start"))

    async def on_stop(self) -> None:
        JOURNAL.append((self.tag, "stop"))

    async def work(self) -> None:
        JOURNAL.append((self.tag, "work"))

    async def quit(self) -> str:
        await self.ref.stop()
        return "bye"


class FailingInit(actorch.Actor):
    def __init__(self) -> None:
        raise ValueError("init refused")


class FailingStart(actorch.Actor):
    async def on_start(self) -> None:
        raise RuntimeError("start refused")


class Parent(actorch.Actor):
    async def identity(self) -> tuple[Any, ...]:
        return (self.ref, self.name, self.system.rank)

    async def spawn_child(self, on: int) -> tuple[actorch.ActorRef[Counter], int]:
        child = await self.system.spawn(Counter, args=(10,), name=f"{self.name}/child", on=on)
        return child, await child.call(Counter.add, 1)

    async def find(self, name: str) -> actorch.ActorRef[Any]:
        return await self.system.lookup(name)


async def names(system: actorch.ActorSystem, pattern: str) -> list[str | None]:
    async with asyncio.timeout(5):
        return [ref.name for ref in await system.lookup_all(pattern)]


@pytest.mark.parametrize("rank", [0, 1, 2])
async def test_spawn_places_the_actor_on_the_requested_rank(world: LocalWorld, rank: int) -> None:
    counter = await world[0].spawn(Counter, on=rank)
    assert counter.rank == rank
    async with asyncio.timeout(5):
        hosting_rank, _pid = await counter.call(Counter.where)
    assert hosting_rank == rank


async def test_spawn_without_on_places_the_actor_on_the_calling_node(world: LocalWorld) -> None:
    counter = await world[2].spawn(Counter)
    assert counter.rank == 2


@pytest.mark.parametrize("on", [3, -1, "1", 1.0, True], ids=["too high", "negative", "str", "float", "bool"])
async def test_spawn_with_a_bad_rank_raises_value_error(world: LocalWorld, on: Any) -> None:
    with pytest.raises(ValueError, match="not a rank"):
        await world[0].spawn(Counter, on=on)


@pytest.mark.parametrize(
    "cls",
    [object, int, Counter(), "Counter", actorch.Actor.__init__],
    ids=["object", "int", "an instance", "a class name", "a method"],
)
async def test_spawn_of_something_that_is_not_an_actor_class_raises_type_error(world: LocalWorld, cls: Any) -> None:
    with pytest.raises(TypeError, match="Actor subclass"):
        await world[0].spawn(cls)


async def test_spawn_of_a_class_defined_in_a_function_raises_type_error(world: LocalWorld) -> None:
    class Local(actorch.Actor):
        pass

    with pytest.raises(TypeError, match="module level"):
        await world[0].spawn(Local, on=1)


async def test_spawn_of_a_system_actor_class_raises_type_error(world: LocalWorld) -> None:
    with pytest.raises(TypeError, match="Actor subclass"):
        await world[0].spawn(NodeService, on=1)


async def test_spawn_fails_when_init_raises_and_frees_the_name(world: LocalWorld, on: int) -> None:
    with pytest.raises(ValueError, match="init refused"):
        await world[0].spawn(FailingInit, name="retry/x", on=on)
    assert await names(world[0], "retry/*") == []
    counter = await world[0].spawn(Counter, name="retry/x", on=on)
    async with asyncio.timeout(5):
        assert await world[1].lookup("retry/x") == counter


async def test_spawn_fails_when_on_start_raises_and_frees_the_name(world: LocalWorld, on: int) -> None:
    with pytest.raises(RuntimeError, match="start refused"):
        await world[0].spawn(FailingStart, name="retry/y", on=on)
    assert await names(world[0], "retry/*") == []
    counter = await world[0].spawn(Counter, name="retry/y", on=on)
    async with asyncio.timeout(5):
        assert await counter.call(Counter.add) == 1


async def test_failed_spawn_leaves_no_actor_behind(world: LocalWorld, on: int) -> None:
    before = world[on].statistics()["actors"]
    with pytest.raises(RuntimeError):
        await world[0].spawn(FailingStart, on=on)
    assert world[on].statistics()["actors"] == before


async def test_on_start_runs_after_init_and_on_stop_runs_at_stop(world: LocalWorld, on: int) -> None:
    tag = new_tag()
    hooks = await world[0].spawn(Hooks, args=(tag,), on=on)
    assert events_of(tag) == ["init", "start"]
    async with asyncio.timeout(5):
        await hooks.call(Hooks.work)
        await hooks.stop()
    assert events_of(tag) == ["init", "start", "work", "stop"]


async def test_on_stop_runs_at_world_shutdown() -> None:
    tags = [new_tag() for _ in range(3)]
    async with local_world(3, stop_grace=0.5) as world:
        for rank, tag in enumerate(tags):
            await world[0].spawn(Hooks, args=(tag,), on=rank)
    for tag in tags:
        assert events_of(tag) == ["init", "start", "stop"]


async def test_stop_lets_queued_messages_finish_first(world: LocalWorld, on: int) -> None:
    tag = new_tag()
    hooks = await world[0].spawn(Hooks, args=(tag,), on=on)
    for _ in range(3):
        hooks.tell(Hooks.work)
    async with asyncio.timeout(5):
        await hooks.stop()
    assert events_of(tag) == ["init", "start", "work", "work", "work", "stop"]


async def test_actor_knows_its_ref_name_and_system(world: LocalWorld, on: int) -> None:
    parent = await world[0].spawn(Parent, name="family/parent", on=on)
    async with asyncio.timeout(5):
        ref, name, rank = await parent.call(Parent.identity)
    assert ref == parent
    assert name == "family/parent"
    assert rank == on


async def test_actor_can_spawn_and_call_another(world: LocalWorld, on: int) -> None:
    parent = await world[0].spawn(Parent, name="family/parent", on=on)
    async with asyncio.timeout(5):
        child, value = await parent.call(Parent.spawn_child, 2)
        assert value == 11
        assert child.name == "family/parent/child"
        assert child.rank == 2
        assert await child.call(Counter.add, 1) == 12
        assert await world[1].lookup("family/parent/child") == child


async def test_actor_can_look_up_another(world: LocalWorld, on: int) -> None:
    counter = await world[0].spawn(Counter, name="found/counter", on=2)
    parent = await world[0].spawn(Parent, on=on)
    async with asyncio.timeout(5):
        assert await parent.call(Parent.find, "found/counter") == counter


async def test_lookup_waits_for_a_name_spawned_later(world: LocalWorld) -> None:
    async with asyncio.timeout(5):
        waiting = asyncio.ensure_future(world[1].lookup("late/counter"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        counter = await world[0].spawn(Counter, name="late/counter", on=2)
        found = await waiting
        assert found == counter
        assert await found.call(Counter.add, 5) == 5


async def test_lookup_finds_a_name_at_once_from_every_node(world: LocalWorld) -> None:
    counter = await world[0].spawn(Counter, name="everywhere", on=1)
    async with asyncio.timeout(1):
        for system in world.systems:
            assert await system.lookup("everywhere") == counter


async def test_lookup_all_matches_globs(world: LocalWorld) -> None:
    for rank, name in enumerate(["grp/a", "grp/b", "grp/sub/c", "other/d", "grp/bb"]):
        await world[0].spawn(Counter, name=name, on=rank % 3)
    assert await names(world[1], "grp/*") == ["grp/a", "grp/b", "grp/bb"]
    assert await names(world[2], "grp/**") == ["grp/a", "grp/b", "grp/bb", "grp/sub/c"]
    assert await names(world[0], "**") == ["grp/a", "grp/b", "grp/bb", "grp/sub/c", "other/d"]
    assert await names(world[0], "grp/?") == ["grp/a", "grp/b"]
    assert await names(world[0], "grp/[!a]") == ["grp/b"]
    assert await names(world[0], "*/d") == ["other/d"]
    assert await names(world[0], "none/*") == []


async def test_lookup_all_does_not_list_unnamed_actors(world: LocalWorld) -> None:
    await world[0].spawn(Counter, on=1)
    assert await names(world[0], "**") == []


async def test_stopped_actor_name_is_gone_from_every_node(world: LocalWorld, on: int) -> None:
    counter = await world[0].spawn(Counter, name="gone/x", on=on)
    async with asyncio.timeout(5):
        for system in world.systems:
            assert await system.lookup("gone/x") == counter
        await counter.stop()
    for system in world.systems:
        with pytest.raises(actorch.ActorNotFoundError):
            async with asyncio.timeout(0.05):
                await system.lookup("gone/x")
        assert await names(system, "gone/*") == []


async def test_names_of_actors_stopped_together_are_gone_from_every_node_as_each_stop_returns(
    world: LocalWorld,
) -> None:
    refs = [await world[0].spawn(Counter, name=f"together/{i}", on=i % 3) for i in range(12)]
    async with asyncio.timeout(5):
        for system in world.systems:
            for i in range(12):
                await system.lookup(f"together/{i}")  # every node has every name cached

        async def stop_then_look(index: int) -> list[bool]:
            await refs[index].stop()
            return [host.cache.get(f"together/{index}") is None for host in world._hosts]

        evicted = await asyncio.gather(*(stop_then_look(i) for i in range(12)))
    assert evicted == [[True, True, True]] * 12
    assert await names(world[1], "together/*") == []


async def test_name_can_be_reused_after_stop(world: LocalWorld, on: int) -> None:
    first = await world[0].spawn(Counter, name="reuse/x", on=on)
    async with asyncio.timeout(5):
        await world[2].lookup("reuse/x")
        await first.stop()
        second = await world[0].spawn(Counter, args=(100,), name="reuse/x", on=2 - on)
        assert second != first
        found = await world[2].lookup("reuse/x")
        assert found == second
        assert await found.call(Counter.add, 1) == 101


async def test_names_of_a_killed_node_disappear(world: LocalWorld) -> None:
    await world[0].spawn(Counter, name="k/on2", on=2)
    survivor = await world[0].spawn(Counter, name="k/on1", on=1)
    async with asyncio.timeout(5):
        assert await world[1].lookup("k/on2") is not None
        world.kill(2)
        while await names(world[1], "k/*") != ["k/on1"]:  # noqa: ASYNC110 - the registry forgets in a task of its own
            await asyncio.sleep(0.005)
        assert await world[1].lookup("k/on1") == survivor
    with pytest.raises(actorch.ActorNotFoundError):
        async with asyncio.timeout(0.05):
            await world[1].lookup("k/on2")
    replacement = await world[0].spawn(Counter, name="k/on2", on=1)
    assert await names(world[0], "k/*") == ["k/on1", "k/on2"]
    assert replacement.rank == 1


async def test_world_lists_lost_nodes(world: LocalWorld) -> None:
    assert world[0].lost_nodes == {}
    world.kill(2)
    assert set(world[0].lost_nodes) == {2}
    assert "killed" in world[1].lost_nodes[2]


async def test_nodes_leave_out_a_lost_node_which_lost_nodes_lists(world: LocalWorld) -> None:
    assert [info.rank for info in world[0].nodes] == [0, 1, 2]
    world.kill(2)
    for rank in (0, 1):
        assert [info.rank for info in world[rank].nodes] == [0, 1]
        assert list(world[rank].lost_nodes) == [2]
        assert world[rank].world_size == 3  # lost nodes count in the world's size


async def test_stopping_twice_is_fine(world: LocalWorld, on: int) -> None:
    tag = new_tag()
    hooks = await world[0].spawn(Hooks, args=(tag,), name="twice", on=on)
    async with asyncio.timeout(5):
        await hooks.stop()
        await hooks.stop()
    assert events_of(tag).count("stop") == 1


async def test_stopping_concurrently_runs_on_stop_once(world: LocalWorld, on: int) -> None:
    tag = new_tag()
    hooks = await world[0].spawn(Hooks, args=(tag,), name="twice", on=on)
    async with asyncio.timeout(5):
        await asyncio.gather(hooks.stop(), hooks.stop(), hooks.stop())
    assert events_of(tag).count("stop") == 1
    assert await names(world[0], "twice") == []


async def test_actor_stopping_itself_from_a_handler_completes_quickly(world: LocalWorld, on: int) -> None:
    tag = new_tag()
    hooks = await world[0].spawn(Hooks, args=(tag,), name="self/stopper", on=on)
    started = time.monotonic()
    async with asyncio.timeout(2):
        assert await hooks.call(Hooks.quit) == "bye"
    assert time.monotonic() - started < 0.4
    assert events_of(tag) == ["init", "start", "stop"]
    assert await names(world[0], "self/*") == []
    with pytest.raises(actorch.ActorStoppedError):
        async with asyncio.timeout(1):
            await hooks.call(Hooks.work)


async def test_statistics_count_calls_tells_and_actors(world: LocalWorld) -> None:
    before = [system.statistics() for system in world.systems]
    counter = await world[0].spawn(Counter, on=1)
    async with asyncio.timeout(5):
        for _ in range(3):
            await counter.call(Counter.add)
        counter.tell(Counter.add)
        await counter.call(Counter.add)
    caller, callee = world[0].statistics(), world[1].statistics()
    assert callee["actors"] == before[1]["actors"] + 1
    assert caller["calls_sent"] - before[0]["calls_sent"] >= 4
    assert callee["calls_received"] - before[1]["calls_received"] >= 4
    assert caller["tells_sent"] - before[0]["tells_sent"] == 1
    assert callee["tells_received"] - before[1]["tells_received"] == 1
    assert caller["pending_calls"] == 0
    assert caller["waiting_for_room"] == 0
    assert caller["messages_refused"] == 0


async def test_system_repr_names_the_node(world: LocalWorld) -> None:
    assert "node 1 of 3" in repr(world[1])


async def test_system_describes_every_node_of_the_world(world):
    for system in world.systems:
        assert system.world_size == len(world)
        nodes = system.nodes
        assert [node.rank for node in nodes] == list(range(len(world)))
        assert [node.name for node in nodes] == [f"node{rank}" for rank in range(len(world))]
        assert all(node.pid > 0 and node.host for node in nodes)


async def test_ref_knows_its_actor_class_when_it_can_be_imported(world, on):
    spawned = await world[0].spawn(Counter, name="klass/c", on=on)
    assert spawned.actor_class is Counter
    assert (await world[1].lookup("klass/c")).actor_class is Counter  # a ref decoded on another node


async def test_system_rref_needs_the_torch_rpc_transport(world: LocalWorld) -> None:
    with pytest.raises(actorch.UnsupportedError, match="InProcessTransport"):
        world[0].rref(torch.ones(1))


# ---------------------------------------------------------------------- spawn's keywords, declared once


def test_spawn_and_spawn_group_are_declared_by_the_actor_system_alone() -> None:
    for method in ("spawn", "spawn_group"):
        assert method in vars(ActorSystem)
        assert method not in vars(NodeSystem), f"NodeSystem declares {method}'s keywords again"
        assert method not in ActorSystem.__abstractmethods__


async def test_spawn_hands_its_keywords_inward_as_one_value(world: LocalWorld, spy: Spy) -> None:
    given = spy(Spawner, "spawn")
    counter = await world[0].spawn(Counter, args=(3,), name="options/c", on=1)
    assert await counter.call(Counter.add) == 4
    await world[0].spawn(Counter)
    assert [options for _, options in given] == [
        SpawnOptions((3,), None, "options/c", 1, None, None, 0),
        SpawnOptions((), None, None, None, None, None, 0),
    ]


async def test_spawn_group_hands_its_keywords_inward_as_one_value(world: LocalWorld, spy: Spy) -> None:
    given = spy(Spawner, "spawn_group")
    restart = actorch.Restart(max_restarts=1)
    members = await world[0].spawn_group(Counter, 2, kwargs={"start": 1}, name="options/g", on=2, restart=restart)
    assert [member.rank for member in members] == [2, 2]
    assert given == [(Counter, 2, SpawnOptions((), {"start": 1}, "options/g", 2, restart, None, 0), False)]
