"""Relocation in in-process worlds: ``Restart(relocate=True)`` actors move when their node is lost.

A killed node here is cut off (``LocalWorld.kill``), as a dead process would
be; the real kill -9 between processes is in ``test_relocation_multiprocess``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from actors import Counter, Holder, Store, Tally
from fake_gpus import FakeAccelerator, installed

import actorch
from actorch._actors.relocation.movable import MovableRef
from actorch._actors.relocation.relocator import Relocator
from actorch._actors.relocation.spec import RelocationSpec, eligible_nodes
from actorch._actors.spawn_request import SpawnRequest
from actorch._engine.system_ids import RELOCATOR_ID
from actorch._transport.base import NodeInfo
from actorch.testing import LocalWorld, local_world

RELOCATE = actorch.Restart(relocate=True, backoff=0.0)


@pytest.fixture
async def world4() -> AsyncIterator[LocalWorld]:
    """Four nodes: rank 0 calls, ranks 1 to 3 host and take in relocatable actors."""
    async with local_world(4, stop_grace=0.5, lookup_timeout=5.0) as running:
        yield running


def relocator(world: LocalWorld) -> Relocator:
    cell = world[0].host.node.cell(RELOCATOR_ID)
    assert cell is not None
    assert isinstance(cell.instance, Relocator)
    return cell.instance


# ---------------------------------------------------------------------- the policy


def test_restart_relocate_is_off_by_default_and_must_be_a_bool() -> None:
    assert actorch.Restart().relocate is False
    assert actorch.Restart(relocate=True).relocate is True
    with pytest.raises(TypeError, match="relocate must be True or False"):
        actorch.Restart(relocate=1)  # type: ignore[arg-type]


async def test_relocatable_actor_is_refused_on_rank_0(world4: LocalWorld) -> None:
    with pytest.raises(ValueError, match="rank 0 runs main and keeps the snapshots"):
        await world4[0].spawn(Tally, restart=RELOCATE)  # on= defaults to the caller's node
    with pytest.raises(ValueError, match="on=1"):
        await world4[1].spawn(Tally, on=0, restart=RELOCATE)
    assert await world4[0].lookup_all("**") == []


# ---------------------------------------------------------------------- moving


async def test_relocatable_actor_moves_from_its_last_snapshot_when_its_node_is_lost(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, args=(5,), name="tally", on=2, restart=RELOCATE)
    assert isinstance(tally, MovableRef)
    for _ in range(7):
        await tally.call(Tally.add)
    world4.kill(2)
    assert await tally.call(Tally.get) == 5, "what came after the last snapshot (5) is lost, nothing before it"
    assert (await tally.call(Tally.where))[0] == 1
    assert tally.rank == 1
    found = await world4[0].lookup("tally")
    assert found == tally
    assert found.rank == 1
    assert await world4[3].lookup("tally") == tally
    assert relocator(world4).statistics() == {
        "relocatable": 1,
        "moving": 0,
        "relocated": 1,
        "not_relocated": 0,
        "snapshots": 1,
        "written": 0,
    }


async def test_relocatable_actor_without_a_snapshot_starts_fresh_from_its_arguments(world4: LocalWorld) -> None:
    counter = await world4[0].spawn(Counter, args=(40,), on=3, restart=RELOCATE)
    await counter.call(Counter.add, 2)
    world4.kill(3)
    assert await counter.call(Counter.get) == 40


async def test_a_call_in_flight_when_the_node_is_lost_fails_and_the_next_one_succeeds(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, on=2, restart=RELOCATE)
    in_flight = asyncio.ensure_future(tally.call(Tally.hang, 30))
    await asyncio.sleep(0.05)
    world4.kill(2)
    with pytest.raises(actorch.NodeLostError, match="node 2 was lost"):
        await in_flight
    assert await tally.call(Tally.hang, 0) == "survived"


async def test_refs_held_by_other_actors_and_sent_later_follow_the_actor(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, args=(1,), on=2, restart=RELOCATE)
    holder = await world4[0].spawn(Holder, on=3)
    await holder.call(Holder.hold, tally)
    await tally.call(Tally.add, 3)
    world4.kill(2)
    assert await holder.call(Holder.call_held, "get") == 3
    late = await world4[0].spawn(Holder, on=1)
    await late.call(Holder.hold, tally)  # the old ref, sent after the move
    assert await late.call(Holder.call_held, "add", 1) == 4


async def test_tells_and_streams_through_an_old_ref_reach_the_new_home_in_order(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, name="told", on=2, restart=RELOCATE)
    told = await world4[3].lookup("told")  # node 3's own copy of the ref
    world4.kill(2)
    items = [item async for item in tally.stream(Tally.upto, 3)]
    assert items == [0, 1, 2]
    assert isinstance(told, MovableRef)
    assert told.rank == 2
    told.tell(Tally.tell_me, 7)
    heard = told.call(Tally.heard)  # sent after the tell, so handled after it
    told.tell(Tally.tell_me, 8)
    assert await heard == [7]
    assert await told.call(Tally.heard) == [7, 8]


async def test_tell_through_an_old_ref_copies_its_tensors_at_once(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, on=2, restart=RELOCATE)
    world4.kill(2)
    value = torch.zeros(3)
    tally.tell(Tally.tell_me, value)
    value += 1  # the sender reuses its tensor while the tell waits for the new home
    heard = await tally.call(Tally.heard)
    assert heard[0].tolist() == [0.0, 0.0, 0.0]


async def test_wait_stopped_waits_through_a_relocation(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, on=2, restart=RELOCATE)
    waiting = asyncio.ensure_future(tally.wait_stopped())
    await asyncio.sleep(0.05)
    world4.kill(2)
    await tally.call(Tally.get)
    assert not waiting.done(), "a relocation is not a stop"
    await tally.stop()
    assert (await waiting).reason == "stopped"


async def test_events_show_the_name_removed_then_registered_at_the_new_home(world4: LocalWorld) -> None:
    await world4[0].spawn(Tally, name="moving/one", on=2, restart=RELOCATE)
    seen: list[actorch.MembershipEvent] = []
    watching_names = asyncio.Event()

    async def watch() -> None:
        async for event in world4[1].events("moving/*"):
            if isinstance(event, (actorch.NameRegistered, actorch.NameRemoved)):
                seen.append(event)
                watching_names.set()
            if len(seen) == 3:
                return

    watching = asyncio.ensure_future(watch())
    await watching_names.wait()
    world4.kill(2)
    async with asyncio.timeout(5):
        await watching
    assert isinstance(seen[0], actorch.NameRegistered)
    assert seen[0].ref.rank == 2
    assert seen[1] == actorch.NameRemoved("moving/one", "node_lost")
    assert isinstance(seen[2], actorch.NameRegistered)
    assert seen[2].ref.rank == 1


async def test_a_relocated_actor_moves_again_when_its_new_node_is_lost(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, args=(2,), name="twice", on=1, restart=RELOCATE)
    await tally.call(Tally.add, 2)
    world4.kill(1)
    assert await tally.call(Tally.add, 2) == 4  # saved again on its new node
    first = tally.rank
    world4.kill(first)
    assert await tally.call(Tally.get) == 4
    assert tally.rank not in (0, 1, first)
    assert (await world4[0].lookup("twice")).rank == tally.rank


# ---------------------------------------------------------------------- what is not moved


async def test_an_actor_without_relocate_is_not_moved(world4: LocalWorld) -> None:
    counter = await world4[0].spawn(Counter, name="stays", on=2, restart=actorch.Restart())
    assert not isinstance(counter, MovableRef)
    world4.kill(2)
    with pytest.raises(actorch.NodeLostError):
        await counter.call(Counter.get)
    with pytest.raises(actorch.ActorNotFoundError):
        async with asyncio.timeout(0.3):
            await world4[0].lookup("stays")


async def test_no_eligible_node_releases_the_name_and_calls_say_why() -> None:
    async with local_world(2, stop_grace=0.5, lookup_timeout=5.0) as world:
        tally = await world[0].spawn(Tally, name="alone", on=1, restart=RELOCATE)
        world.kill(1)
        with pytest.raises(actorch.NodeLostError, match=r"no node can host it \(node 0: rank 0 hosts no relocatable"):
            await tally.call(Tally.get)
        ended = await tally.wait_stopped()
        assert ended.reason == "node_lost"
        assert "could not be relocated" in (ended.error or "")
        with pytest.raises(actorch.ActorNotFoundError):
            async with asyncio.timeout(0.3):
                await world[0].lookup("alone")
        await world[0].spawn(Tally, name="alone", on=0)  # the name is free again
        assert relocator(world).statistics()["not_relocated"] == 1
        await tally.stop()  # nothing left to stop: it returns


async def test_relocation_counts_against_the_policys_restarts(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, on=2, restart=actorch.Restart(max_restarts=0, relocate=True))
    world4.kill(2)
    with pytest.raises(actorch.NodeLostError, match="restarts were used up"):
        await tally.call(Tally.get)


async def test_a_stopped_relocatable_actor_is_not_moved_when_its_node_is_lost_later(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, on=2, restart=RELOCATE)
    await tally.stop()
    assert relocator(world4).statistics()["relocatable"] == 0
    world4.kill(2)
    with pytest.raises(actorch.ActorStoppedError, match="has stopped"):
        await tally.call(Tally.get)
    assert (await tally.wait_stopped()).reason == "stopped"


async def test_a_snapshot_from_an_instance_that_no_longer_hosts_the_actor_is_refused(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, on=2, restart=RELOCATE)
    assert isinstance(tally, MovableRef)
    world4.kill(2)
    await tally.call(Tally.get)  # it lives on node 1 now
    with pytest.raises(actorch.ActorStoppedError, match="a snapshot from node 2 is not kept"):
        await relocator(world4).keep(tally._origin, 2, 99)


# ---------------------------------------------------------------------- save_snapshot


async def test_save_snapshot_keeps_nothing_for_an_actor_that_is_not_relocatable(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, args=(1,), on=2)
    assert await tally.call(Tally.add) == 1  # it saved: a no-op here
    assert relocator(world4).statistics()["snapshots"] == 0


class NoRestore(actorch.Actor):
    async def save(self) -> bool:
        return await self.save_snapshot(1)


async def test_save_snapshot_needs_a_restore_hook(world4: LocalWorld) -> None:
    actor = await world4[0].spawn(NoRestore, on=1, restart=RELOCATE)
    with pytest.raises(TypeError, match="defines no restore"):
        await actor.call(NoRestore.save)


def test_an_actor_class_cannot_define_save_snapshot_itself() -> None:
    with pytest.raises(TypeError, match="save_snapshot is a method every actor has"):

        class Clash(actorch.Actor):
            async def save_snapshot(self, state: Any) -> bool:
                return True

    assert "save_snapshot" not in Tally._actorch_endpoints


# ---------------------------------------------------------------------- the replay buffer


@pytest.mark.parametrize("kind", [actorch.ReplayBuffer, actorch.replay.PrioritizedReplayBuffer])
async def test_replay_buffer_relocates_with_what_its_last_save_held(
    world4: LocalWorld, kind: type[actorch.ReplayBuffer]
) -> None:
    buffer = await world4[0].spawn(
        kind, args=(100,), kwargs={"snapshot_every": 10, "seed": 1}, name="replay", on=3, restart=RELOCATE
    )
    for index in range(57):
        await buffer.call(kind.add, {"i": torch.tensor(index)})
    assert (await buffer.call(kind.statistics))["saved"] == 5
    world4.kill(3)
    moved = await world4[0].lookup("replay")
    assert await moved.call(kind.size) == 50, "the 7 transitions added after the last save are lost, and only they"
    sample = await moved.call(kind.sample, 2000)
    assert set(sample.data["i"].tolist()) == set(range(50))
    assert await moved.call(kind.add, {"i": torch.tensor(99)}) == 51


def test_replay_buffer_snapshot_every_must_be_a_positive_int() -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="snapshot_every must be a positive int"):
            actorch.ReplayBuffer(10, snapshot_every=bad)  # type: ignore[arg-type]


def test_replay_buffer_restore_refuses_a_state_of_another_shape() -> None:
    with pytest.raises(actorch.SnapshotError, match=r"is \(tensors, meta\), not a list"):
        actorch.ReplayBuffer(10).restore([1, 2])  # type: ignore[arg-type]


# ---------------------------------------------------------------------- choosing the node


def spec(device: str | None = None, gpus: int = 0) -> RelocationSpec:
    return RelocationSpec((1, 4), SpawnRequest("actors:Tally", (), {}, "t", RELOCATE, device, gpus))


NODES = [
    NodeInfo(0, "node0", "h", 1),
    NodeInfo(1, "node1", "h", 2),
    NodeInfo(2, "node2", "h", 3, ("cuda:0",)),
    NodeInfo(3, "node3", "h", 4, ("cuda:0", "cuda:1")),
]


def test_eligible_nodes_skip_unavailable_ones_and_prefer_the_least_loaded() -> None:
    chosen, refused = eligible_nodes(spec(), NODES, {0: "rank 0", 1: "lost"}, {2: 1})
    assert chosen == [3, 2]
    assert refused == {0: "rank 0", 1: "lost"}


def test_eligible_nodes_keep_to_the_device_and_gpus_the_spawn_asked_for() -> None:
    chosen, refused = eligible_nodes(spec(device="cuda:1"), NODES, {}, {})
    assert chosen == [3]
    assert refused[2] == "has no cuda:1 (cuda:0)"
    assert refused[1] == "has no cuda:1 (no GPU)"
    chosen, refused = eligible_nodes(spec(gpus=2), NODES, {}, {})
    assert chosen == [3]
    assert refused[2] == "has 1 gpus, needs 2 gpus"
    assert eligible_nodes(spec(device="cpu"), NODES, {}, {})[0] == [0, 1, 2, 3]


async def test_a_gpu_actor_moves_to_a_node_with_a_free_gpu_past_one_whose_gpu_is_held() -> None:
    with installed(FakeAccelerator(devices=())):
        inventory = {1: ("cuda:0",), 2: ("cuda:0",), 3: ("cuda:0",)}
        async with local_world(4, stop_grace=0.5, devices=inventory) as world:
            learner = await world[0].spawn(Tally, gpus=1, restart=RELOCATE)
            assert learner.rank == 1  # rank 0 is skipped: it hosts no relocatable actor
            await world[0].spawn(Counter, gpus=1, on=2)  # node 2's only GPU is held
            world.kill(1)
            assert (await learner.call(Tally.where))[0] == 3


class EagerSaver(actorch.Actor):
    """Saves a snapshot in ``on_start``: on its first node, and on each node it moves to."""

    def __init__(self) -> None:
        self.starts = 0

    def restore(self, state: int) -> None:
        self.starts = state

    async def on_start(self) -> None:
        self.starts += 1
        await self.save_snapshot(self.starts)

    async def started(self) -> int:
        return self.starts


async def test_an_actor_may_save_in_on_start_before_its_adoption_and_on_the_node_it_moves_to(
    world4: LocalWorld,
) -> None:
    eager = await world4[0].spawn(EagerSaver, on=1, restart=RELOCATE)
    assert relocator(world4).statistics()["snapshots"] == 1
    world4.kill(1)
    assert await eager.call(EagerSaver.started) == 2  # restored 1, then its on_start counted and saved 2
    world4.kill(eager.rank)
    assert await eager.call(EagerSaver.started) == 3


class FailsAfterSaving(actorch.Actor):
    def restore(self, state: int) -> None:
        pass

    async def on_start(self) -> None:
        await self.save_snapshot(1)
        raise OSError("no dataset here")


async def test_a_relocatable_actor_that_fails_to_start_is_forgotten_with_what_it_saved(world4: LocalWorld) -> None:
    with pytest.raises(OSError, match="no dataset here"):
        await world4[0].spawn(FailsAfterSaving, on=2, restart=RELOCATE)
    assert relocator(world4)._unadopted == {}
    assert relocator(world4).statistics()["relocatable"] == 0


async def test_after_rank_0_is_lost_a_live_actor_answers_and_a_lost_one_is_not_moved(world4: LocalWorld) -> None:
    await world4[0].spawn(Tally, name="orphan", on=2, restart=RELOCATE)
    tally = await world4[3].lookup("orphan")  # node 3's ref
    world4.kill(0)
    assert await tally.call(Tally.add) == 1  # its node lives: nothing changes for it
    world4.kill(2)
    with pytest.raises(actorch.NodeLostError, match="and so was rank 0, which relocates actors"):
        await tally.call(Tally.get)
    assert (await tally.wait_stopped()).reason == "node_lost"


async def test_an_actor_that_stopped_while_it_was_being_moved_is_stopped_again(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, name="late", on=2, restart=actorch.Restart(relocate=True, backoff=0.2))
    assert isinstance(tally, MovableRef)
    world4.kill(2)
    await asyncio.sleep(0)  # the move has begun, and waits its backoff
    await relocator(world4).forget(tally._origin, actorch.ActorExit("stopped"))  # as if its stop came late
    with pytest.raises(actorch.ActorStoppedError, match="has stopped"):
        await tally.call(Tally.get)
    await asyncio.sleep(0.4)
    assert [cell.name for host in (world4[1], world4[3]) for cell in host.host.node.cells()] == [None, None]
    with pytest.raises(actorch.ActorNotFoundError):
        async with asyncio.timeout(0.2):
            await world4[0].lookup("late")


async def test_a_ref_pickled_inside_a_value_stays_a_ref_that_follows(world4: LocalWorld) -> None:
    tally = await world4[0].spawn(Tally, on=2, restart=RELOCATE)
    echoed = await (await world4[0].spawn(Store, on=3)).call(Store.echo, SimpleNamespace(ref=tally))
    assert isinstance(echoed.ref, MovableRef)
    assert echoed.ref == tally
    assert echoed.ref is not tally
    world4.kill(2)
    assert await echoed.ref.call(Tally.add) == 1


# ---------------------------------------------------------------------- placed by what a node has


async def test_an_actor_placed_by_label_moves_only_to_a_node_with_that_label() -> None:
    labels = {1: "env", 2: "learner", 3: "env"}
    async with local_world(4, stop_grace=0.5, lookup_timeout=5.0, labels=labels) as world:
        tally = await world[0].spawn(Tally, on=actorch.Where(label="env"), restart=RELOCATE)
        home = tally.rank
        assert home in (1, 3)
        world.kill(home)
        assert (await tally.call(Tally.where))[0] == 4 - home, "the other env node, never the learner's"


async def test_an_actor_holding_resources_moves_to_a_node_that_has_them_and_holds_them_there() -> None:
    resources = {1: {"slots": 1}, 2: {"slots": 1}}
    async with local_world(4, stop_grace=0.5, lookup_timeout=5.0, resources=resources) as world:
        where = actorch.Where(resources={"slots": 1})
        tally = await world[0].spawn(Tally, on=where, restart=RELOCATE)
        home = tally.rank
        assert home in (1, 2)
        world.kill(home)
        assert (await tally.call(Tally.where))[0] == 3 - home, "node 3 declares no slots"
        with pytest.raises(actorch.PlacementError, match="slots"):
            await world[0].spawn(Counter, on=where)  # the slot moved with the actor: none is free


async def test_an_actor_placed_by_label_with_no_node_of_that_label_left_says_why() -> None:
    async with local_world(3, stop_grace=0.5, lookup_timeout=5.0, labels={1: "env", 2: "learner"}) as world:
        tally = await world[0].spawn(Tally, on=actorch.Where(label="env"), restart=RELOCATE)
        world.kill(1)
        with pytest.raises(actorch.NodeLostError, match="node 2: label 'learner', not 'env'"):
            await tally.call(Tally.get)


async def test_a_relocatable_actor_in_a_process_of_its_own_is_refused_before_any_process_starts(
    world4: LocalWorld,
) -> None:
    before = len(world4[0].nodes)
    with pytest.raises(ValueError, match="process of its own"):
        await world4[0].spawn(Tally, on=actorch.Where(process="own"), restart=RELOCATE)
    assert len(world4[0].nodes) == before


# ---------------------------------------------------------------------- affinity: near and apart from


async def test_an_actor_placed_apart_from_another_never_moves_to_its_node() -> None:
    async with local_world(4, stop_grace=0.5, lookup_timeout=5.0, labels={1: "env", 2: "env", 3: "env"}) as world:
        other = await world[0].spawn(Counter, on=2)
        tally = await world[0].spawn(Tally, on=actorch.Where(label="env", apart_from=other), restart=RELOCATE)
        assert tally.rank == 1
        world.kill(1)
        assert (await tally.call(Tally.where))[0] == 3, "node 2 comes first by load and rank, but holds the other"


async def test_an_actor_placed_near_a_relocatable_one_follows_it_to_its_new_node(world4: LocalWorld) -> None:
    await world4[0].spawn(Tally, on=1, restart=RELOCATE)  # node 1 hosts one: the anchor moves to node 3
    anchor = await world4[0].spawn(Tally, on=2, restart=RELOCATE)
    follower = await world4[0].spawn(Tally, on=actorch.Where(near=anchor), restart=RELOCATE)
    assert follower.rank == 2
    world4.kill(2)
    assert (await anchor.call(Tally.where))[0] == 3
    assert (await follower.call(Tally.where))[0] == 3, "by load it would have gone to node 1"


async def test_an_actor_placed_near_one_whose_node_was_lost_is_not_relocated_and_says_why(
    world4: LocalWorld,
) -> None:
    await world4[0].spawn(Counter, on=2, name="anchor")
    anchor = await world4[0].lookup("anchor")
    follower = await world4[0].spawn(Tally, on=actorch.Where(near=anchor), restart=RELOCATE)
    world4.kill(2)
    with pytest.raises(actorch.NodeLostError) as lost:
        await follower.call(Tally.get)
    assert "node 1: not the node of anchor (node 2, lost); node 2: lost; node 3: not the node of anchor" in str(
        lost.value
    )
