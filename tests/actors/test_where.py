"""Placing actors by what nodes have, over in-process worlds: ``Where``, resources held and given back, groups.

The worlds give ranks labels and declared resources (``local_world(labels=...,
resources=...)``), as a launch gives its nodes. Starting node processes needs a
real launch: ``test_pool_multiprocess.py`` does that; here an in-process world
only says it cannot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from conftest import Spy
from fake_gpus import FakeAccelerator, installed

import actorch
from actorch._actors.node.spawner import Spawner
from actorch._actors.ref import make_ref
from actorch._actors.where import Where, where_of
from actorch._base.resources import check_resources, describe_amount, detect_resources
from actorch._launch.cli.serve import parse_resource
from actorch._launch.cli.tables import status_tables
from actorch._launch.services.status import gather_status
from actorch._launch.world.nodes import declared_resources, grow_refusal
from actorch._transport.base import NodeTraits
from actorch._transport.torch_rpc.lone import LoneTransport
from actorch._transport.torch_rpc.rpc import RpcTransport
from actorch.testing import LocalWorld, local_world


class Sim(actorch.Actor):
    async def rank(self) -> int:
        return self.system.rank


class Crashing(Sim):
    fatal_errors = (RuntimeError,)

    async def crash(self) -> None:
        raise RuntimeError("the simulator diverged")


@pytest.fixture
async def envs() -> AsyncIterator[LocalWorld]:
    """Rank 0 plain; ranks 1 and 2 labelled ``env`` with 2 and 1 env slots; rank 3 a learner with 4 CPUs."""
    async with local_world(
        4,
        stop_grace=0.5,
        labels={1: "env", 2: "env", 3: "learner"},
        resources={1: {"env_slots": 2}, 2: {"env_slots": 1}, 3: {"cpus": 4}},
    ) as world:
        yield world


async def test_nodes_carry_their_label_declared_resources_and_detected_ones(envs: LocalWorld) -> None:
    nodes = envs[2].nodes
    assert [node.label for node in nodes] == [None, "env", "env", "learner"]
    assert nodes[1].resources["env_slots"] == 2.0
    assert nodes[3].resources["cpus"] == 4.0, "a declared amount replaces the detected one"
    detected = detect_resources(())
    assert nodes[0].resources == detected
    assert detected["cpus"] >= 1
    assert detected["memory"] > 0
    assert (nodes[0].owner, nodes[0].parent, nodes[0].pool) == (None, None, False)


async def test_a_where_spawn_goes_to_a_node_with_the_label_and_room(envs: LocalWorld) -> None:
    first = await envs[0].spawn(Sim, on=Where(label="env", resources={"env_slots": 1}))
    second = await envs[0].spawn(Sim, on=Where(label="env", resources={"env_slots": 1}))
    third = await envs[0].spawn(Sim, on=Where(label="env", resources={"env_slots": 1}))
    assert [first.rank, second.rank, third.rank] == [1, 1, 2], "lowest rank first, while it has room"
    assert await third.call(Sim.rank) == 2
    learner = await envs[0].spawn(Sim, on=Where(cpus=3))
    assert learner.rank == 3, "only node 3 has 3 CPUs"


async def test_a_where_spawn_prefers_the_callers_node(envs: LocalWorld) -> None:
    here = await envs[2].spawn(Sim, on=Where(label="env"))
    assert here.rank == 2


async def test_resources_held_by_an_actor_come_back_when_it_stops(envs: LocalWorld) -> None:
    holder = await envs[0].spawn(Sim, name="sims/only", on=Where(label="env", host=None, resources={"env_slots": 1}))
    assert holder.rank == 1
    taken = await envs[0].host.services[1].call("resources")
    assert taken["free"]["env_slots"] == 1.0
    assert taken["held"] == {"sims/only": {"env_slots": 1.0}}
    await holder.stop()
    given_back = await envs[0].host.services[1].call("resources")
    assert given_back["free"]["env_slots"] == 2.0
    assert given_back["held"] == {}


async def test_a_placement_error_names_unnamed_holders_by_class_id_and_node(envs: LocalWorld) -> None:
    first = await envs[0].spawn(Sim, on=Where(label="env", resources={"env_slots": 2}))
    second = await envs[0].spawn(Sim, on=Where(label="env", resources={"env_slots": 1}))
    assert (first.rank, second.rank) == (1, 2)
    with pytest.raises(actorch.PlacementError) as refused:
        await envs[0].spawn(Sim, on=Where(label="env", resources={"env_slots": 1}))
    first_id, second_id = first._actor_id, second._actor_id
    assert first_id == second_id, "ids are per node: the number alone would name both"
    assert str(refused.value) == (
        "spawn(Sim, on=Where(label='env', resources={'env_slots': 1.0})): no node fits; "
        "node 0: label None, not 'env'; "
        f"node 1: 0 env_slots free, needs 1 env_slots (held by Sim#{first_id} on node 1); "
        f"node 2: 0 env_slots free, needs 1 env_slots (held by Sim#{second_id} on node 2); "
        "node 3: label 'learner', not 'env'"
    )


async def test_a_placement_error_names_every_node_and_why(envs: LocalWorld) -> None:
    await envs[0].spawn(Sim, name="slots/a", on=Where(label="env", resources={"env_slots": 2}))
    await envs[0].spawn(Sim, name="slots/b", on=Where(label="env", resources={"env_slots": 1}))
    envs.kill(3)
    await asyncio.sleep(0)
    with pytest.raises(actorch.PlacementError) as refused:
        await envs[0].spawn(Sim, on=Where(label="env", resources={"env_slots": 1}))
    message = str(refused.value)
    assert message.startswith("spawn(Sim, on=Where(label='env', resources={'env_slots': 1.0})): no node fits; ")
    assert "node 0: label None, not 'env'" in message
    assert "node 1: 0 env_slots free, needs 1 env_slots (held by slots/a)" in message
    assert "node 2: 0 env_slots free, needs 1 env_slots (held by slots/b)" in message
    assert "node 3: lost" in message
    with pytest.raises(actorch.PlacementError, match="node 1: has 2 env_slots, needs 3 env_slots"):
        await envs[0].spawn(Sim, on=Where(resources={"env_slots": 3}))
    with pytest.raises(actorch.PlacementError, match="node 0: on host "):
        await envs[0].spawn(Sim, on=Where(host="no-such-host"))


async def test_two_spawns_racing_for_the_last_slot_never_share_it(envs: LocalWorld) -> None:
    where = Where(label="env", resources={"env_slots": 1})
    outcomes = await asyncio.gather(*(envs[0].spawn(Sim, on=where) for _ in range(4)), return_exceptions=True)
    placed = sorted(outcome.rank for outcome in outcomes if isinstance(outcome, actorch.ActorRef))
    assert placed == [1, 1, 2]
    assert sum(isinstance(outcome, actorch.PlacementError) for outcome in outcomes) == 1


async def test_a_spawn_that_waits_for_capacity_gets_what_a_stopping_actor_gives_back(envs: LocalWorld) -> None:
    holder = await envs[0].spawn(Sim, on=Where(cpus=4))

    async def stop_later() -> None:
        await asyncio.sleep(0.2)
        await holder.stop()

    stopping = asyncio.ensure_future(stop_later())
    async with asyncio.timeout(5):
        waited = await envs[0].spawn(Sim, on=Where(cpus=4, wait=True))
    await stopping
    assert waited.rank == 3


async def test_a_spawn_waiting_for_capacity_ends_in_a_placement_error_at_the_callers_deadline(
    envs: LocalWorld,
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(actorch.PlacementError, match="waited for capacity until the deadline") as refused:
        async with asyncio.timeout(0.3):
            await envs[0].spawn(Sim, on=Where(cpus=64, wait=True))
    assert "node 3: has 4 cpus, needs 64 cpus" in str(refused.value)
    assert loop.time() - started < 2.0


async def test_a_spawn_waiting_without_a_deadline_gives_up_after_the_lookup_timeout() -> None:
    async with local_world(1, lookup_timeout=0.2) as world:
        with pytest.raises(actorch.PlacementError, match="waited for capacity"):
            await world[0].spawn(Sim, on=Where(label="gpu-box", wait=True))


async def test_a_group_spreads_across_the_nodes_that_fit(envs: LocalWorld) -> None:
    members = await envs[0].spawn_group(Sim, 4, name="spread", on=Where(label="env"), spread=True)
    assert [member.rank for member in members] == [1, 2, 1, 2]
    assert [member.name for member in members] == ["spread/0", "spread/1", "spread/2", "spread/3"]
    everywhere = await envs[0].spawn_group(Sim, 4, spread=True)
    assert sorted(member.rank for member in everywhere) == [0, 1, 2, 3]


async def test_a_group_packs_onto_a_node_until_it_is_full(envs: LocalWorld) -> None:
    members = await envs[0].spawn_group(Sim, 3, on=Where(label="env", resources={"env_slots": 1}))
    assert [member.rank for member in members] == [1, 1, 2]
    here = await envs[2].spawn_group(Sim, 2)
    assert [member.rank for member in here] == [2, 2], "no Where, not spread: all on the caller's node"
    there = await envs[0].spawn_group(Sim, 2, on=3)
    assert [member.rank for member in there] == [3, 3]


async def test_a_group_without_room_for_every_member_spawns_none(envs: LocalWorld) -> None:
    with pytest.raises(actorch.PlacementError) as refused:
        await envs[0].spawn_group(Sim, 4, name="many", on=Where(label="env", resources={"env_slots": 1}))
    assert "room for 3 of 4 members" in str(refused.value)
    assert "node 1: room for 2" in str(refused.value)
    assert await envs[0].lookup_all("many/*") == []
    shares = [await envs[0].host.services[rank].call("resources") for rank in (1, 2)]
    assert [share["held"] for share in shares] == [{}, {}]


async def test_a_group_member_that_fails_to_start_stops_the_others(envs: LocalWorld) -> None:
    await envs[0].spawn(Sim, name="taken/1")
    with pytest.raises(actorch.NameTakenError):
        await envs[0].spawn_group(Sim, 3, name="taken", spread=True)
    assert [ref.name for ref in await envs[0].lookup_all("taken/*")] == ["taken/1"]


async def test_wait_nodes_returns_the_nodes_once_there_and_times_out_naming_how_many(envs: LocalWorld) -> None:
    assert [node.rank for node in await envs[1].wait_nodes(2, label="env")] == [1, 2]
    assert len(await envs[0].wait_nodes(4)) == 4
    with pytest.raises(TimeoutError, match=r"wait_nodes\(3\): 2 nodes labelled 'env' in time"):
        await envs[0].wait_nodes(3, label="env", timeout=0.1)
    envs.kill(3)
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError, match="3 nodes in time"):
        async with asyncio.timeout(0.1):
            await envs[0].wait_nodes(4)


async def test_an_in_process_world_cannot_start_node_processes(envs: LocalWorld) -> None:
    with pytest.raises(actorch.UnsupportedError, match="in-process"):
        await envs[1].add_nodes(1)
    with pytest.raises(actorch.UnsupportedError, match="in-process"):
        await envs[0].spawn(Sim, on=Where(process="own"))
    with pytest.raises(actorch.UnsupportedError, match="no host agent on 'elsewhere'"):
        await envs[0].add_nodes(1, host="elsewhere")


async def test_an_actors_own_process_takes_no_other_placed_actor() -> None:
    async with local_world(2, resources={0: {"cpus": 0}}) as world:
        world._hub.traits[1] = NodeTraits(owner="learner", parent=0)
        with pytest.raises(actorch.PlacementError, match=r"node 0: has 0 cpus.*node 1: the own process of learner"):
            await world[0].spawn(Sim, on=Where(cpus=0.5))
        with pytest.raises(actorch.PlacementError, match=r"node 1: the own process of learner$"):
            await world[0].spawn(Sim, on=Where(label="gpu"))  # its owner, not its label, is why
        assert (await world[0].spawn(Sim, on=1)).rank == 1, "on=rank stays the exact form"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cpus": -1}, "cpus"),
        ({"gpus": 1.5}, "gpus"),
        ({"memory": float("nan")}, "memory"),
        ({"label": ""}, "label"),
        ({"resources": {"cpus": 1}}, "give cpus as Where"),
        ({"resources": {"9lives": 1}}, "not a resource name"),
        ({"process": "mine"}, "'any' or 'own'"),
        ({"env": {"A": "1"}}, "process='own'"),
        ({"process": "own", "env": {"A": 1}}, "str to str"),
        ({"wait": "yes"}, "bool"),
    ],
)
def test_where_refuses_what_it_cannot_ask(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Where(**options)


def test_where_shows_what_it_asks_and_what_an_actor_holds() -> None:
    where = Where(label="env", cpus=1, resources={"env_slots": 2})
    assert repr(where) == "Where(label='env', cpus=1, resources={'env_slots': 2.0})"
    assert where.needs() == {"cpus": 1.0, "env_slots": 2.0}
    assert where.describe_needs() == "1 cpus, 2 env_slots"
    assert Where().describe_needs() == "nothing"
    assert Where(process="own").own
    assert describe_amount("memory", 3 * 2**30) == "3 GiB memory"


async def test_spawn_refuses_gpus_beside_a_where(envs: LocalWorld) -> None:
    with pytest.raises(ValueError, match="Where"):
        await envs[0].spawn(Sim, gpus=1, on=Where(label="env"))
    with pytest.raises(ValueError, match="Where"):
        await envs[0].spawn(Sim, device="cpu", on=Where(gpus=1))


async def test_the_node_status_shows_resources_free_held_and_origin(envs: LocalWorld) -> None:
    await envs[0].spawn(Sim, name="status/sim", on=Where(label="env", resources={"env_slots": 2}))
    status = await envs[0].host.services[1].call("status")
    assert status["resources"]["env_slots"] == 2.0
    assert status["free"]["env_slots"] == 0.0
    assert status["held"] == {"status/sim": {"env_slots": 2.0}}
    assert (status["label"], status["owner"], status["parent"], status["pool"]) == ("env", None, None, False)


def test_declared_resources_apply_to_every_rank_or_by_rank() -> None:
    assert declared_resources({"slots": 2}, 2) == {0: {"slots": 2.0}, 1: {"slots": 2.0}}
    assert declared_resources({1: {"slots": 2}}, 2) == {1: {"slots": 2.0}}
    assert declared_resources(None, 2) == {}
    with pytest.raises(ValueError, match="not a rank of this launch"):
        declared_resources({2: {"slots": 1}}, 2)
    with pytest.raises(TypeError, match="mapping"):
        declared_resources(["slots"], 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite number"):
        check_resources({"slots": -1})
    with pytest.raises(TypeError, match="mapping"):
        check_resources(4)


def test_run_refuses_bad_resources_before_anything_starts() -> None:
    async def main(system: actorch.ActorSystem) -> None:
        raise AssertionError("main must not run")

    with pytest.raises(ValueError, match="finite number"):
        actorch.run(main, resources={"slots": -2}, configure_logs=False)
    with pytest.raises(ValueError, match="not a rank of this launch"):
        actorch.run(main, world_size=2, resources={5: {"slots": 1}}, configure_logs=False)


def test_the_serve_command_reads_resources_as_name_equals_amount() -> None:
    assert parse_resource("env_slots=4") == ("env_slots", 4.0)
    for bad in ("env_slots", "env_slots=many", "9x=1", "gpus=0.5"):
        with pytest.raises(Exception, match=r"NAME=AMOUNT|resource name|finite number|whole number"):
            parse_resource(bad)


async def test_add_nodes_and_wait_nodes_refuse_bad_arguments(envs: LocalWorld) -> None:
    with pytest.raises(ValueError, match="count"):
        await envs[0].add_nodes(0)
    with pytest.raises(ValueError, match="count"):
        await envs[0].wait_nodes(True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        await envs[0].wait_nodes(1, timeout=-1)
    with pytest.raises(ValueError, match="finite number"):
        await envs[0].add_nodes(1, resources={"slots": float("inf")})
    with pytest.raises(ValueError, match="str to str"):
        await envs[0].add_nodes(1, env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="count"):
        await envs[0].spawn_group(Sim, 0)


async def test_a_lone_node_sends_nowhere_until_it_opens_a_world() -> None:
    lost: list[int] = []
    alone = LoneTransport(lambda: pytest.fail("opened without being asked"))  # type: ignore[arg-type,return-value]
    alone.attach(asyncio.get_running_loop(), lambda src, bundle, port: None, lambda rank, why: lost.append(rank))
    await alone.start()
    assert [info.rank for info in alone.peers()] == [0]
    assert not alone.knows(1)
    assert alone.route(1) is None
    alone.send(1, b"hello")
    await asyncio.sleep(0)
    assert lost == [1]
    with pytest.raises(actorch.UnsupportedError):
        alone.make_rref(1)
    await alone.close()


def test_connect_and_start_refuse_bad_resources_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="finite number"):
        actorch.connect("127.0.0.1:1", resources={"slots": -1}, configure_logs=False)
    with pytest.raises(ValueError, match="not a resource name"):
        actorch.start(resources={"": 1}, configure_logs=False)


def test_only_systems_on_an_elastic_world_may_grow() -> None:
    mapped = actorch.TorchRpc(device_maps={"cuda:0": "cuda:0"})
    static = RpcTransport(0, 2, "127.0.0.1", 1, mapped)
    assert "TorchRpc(device_maps=None)" in str(grow_refusal(static, mapped, under_torchrun=False))
    assert "torchrun" in str(grow_refusal(static, mapped, under_torchrun=True))
    alone = LoneTransport(lambda: pytest.fail("not opened"))  # type: ignore[arg-type,return-value]
    assert grow_refusal(alone, actorch.TorchRpc(), under_torchrun=False) is None
    assert actorch.TorchRpc(device_maps=None).fixes_world() is None
    assert mapped.fixes_world() is not None


async def test_a_where_spawn_with_gpus_is_lent_devices_and_gives_them_back() -> None:
    with installed(FakeAccelerator(devices=())):
        async with local_world(3, devices={2: ("cuda:0", "cuda:1")}) as world:
            pair = await world[0].spawn(Sim, name="gpu/pair", on=Where(gpus=2))
            assert pair.rank == 2
            with pytest.raises(actorch.PlacementError, match=r"node 2: 0 gpus free, needs 1 gpus \(held by gpu/pair\)"):
                await world[0].spawn(Sim, on=Where(gpus=1))
            await pair.stop()
            assert (await world[0].spawn(Sim, on=Where(gpus=1))).rank == 2


async def test_actorch_status_shows_resources_free_and_whose_process_a_node_is(envs: LocalWorld) -> None:
    envs._hub.traits[3] = NodeTraits(resources={"cpus": 4}, owner="learner", parent=0)
    envs._hub.traits[2] = NodeTraits("env", {"env_slots": 1}, parent=0, pool=True)
    await envs[0].spawn(Sim, on=Where(label="env", resources={"env_slots": 1}))
    status = await gather_status(envs._hosts[0])
    nodes, _ = status_tables(status, None)
    labels, resources = list(nodes.columns[4].cells), list(nodes.columns[5].cells)
    assert labels == ["", "env", "env (started by node 0) (host agent)", "(own process of learner)"]
    assert resources[1].startswith("cpus ")
    assert "env_slots 1/2" in resources[1], "one of node 1's two slots is held"
    assert "cpus 4/4" in resources[3]
    older = {
        **status,
        "nodes": [
            {
                key: value
                for key, value in status["nodes"][0].items()
                if key not in ("resources", "free", "held", "owner", "parent", "pool")
            }
        ],
    }
    old_nodes, _ = status_tables(older, None)
    assert list(old_nodes.columns[5].cells) == ["-"], "a system of schema 1 shows without resources"


async def test_a_restarted_actor_keeps_what_it_holds_and_gives_it_back_when_it_stops_for_good(envs: LocalWorld) -> None:
    where = Where(label="env", resources={"env_slots": 2})
    once = actorch.Restart(max_restarts=1, backoff=0)
    crashing = await envs[0].spawn(Crashing, name="crashing", on=where, restart=once)
    assert crashing.rank == 1
    with pytest.raises(RuntimeError, match="diverged"):
        await crashing.call(Crashing.crash)
    assert await crashing.call(Crashing.rank) == 1  # the new instance answers
    share = await envs[0].host.services[1].call("resources")
    assert share["held"] == {"crashing": {"env_slots": 2.0}}, "a restart keeps what the actor holds"
    with pytest.raises(RuntimeError, match="diverged"):
        await crashing.call(Crashing.crash)
    assert (await crashing.wait_stopped()).reason == "failed"
    share = await envs[0].host.services[1].call("resources")
    assert share["held"] == {}, "stopped for good: what it held goes back"


async def test_where_near_places_on_the_node_of_that_actor(envs: LocalWorld) -> None:
    anchor = await envs[0].spawn(Sim, name="anchor", on=2)
    assert (await envs[0].spawn(Sim, on=Where(near=anchor))).rank == 2
    members = await envs[0].spawn_group(Sim, 2, on=Where(near=anchor), spread=True)
    assert [member.rank for member in members] == [2, 2]
    with pytest.raises(actorch.PlacementError) as refused:
        await envs[0].spawn(Sim, on=Where(near=anchor, label="learner"))
    assert str(refused.value) == (
        "spawn(Sim, on=Where(label='learner', near=<ActorRef actor 'anchor' (Sim) on node 2>)): no node fits; "
        "node 0: label None, not 'learner'; node 1: label 'env', not 'learner'; node 2: label 'env', not 'learner'; "
        "node 3: not the node of anchor (node 2)"
    )


async def test_where_apart_from_never_places_on_the_nodes_of_those_actors(envs: LocalWorld) -> None:
    first = await envs[0].spawn(Sim, name="first", on=1)
    second = await envs[0].spawn(Sim, name="second", on=Where(label="env", apart_from=first))
    assert second.rank == 2
    with pytest.raises(actorch.PlacementError) as refused:
        await envs[0].spawn(Sim, on=Where(label="env", apart_from=[first, second]))
    assert str(refused.value).endswith(
        "no node fits; node 0: label None, not 'env'; node 1: the node of first; "
        "node 2: the node of second; node 3: label 'learner', not 'env'"
    )


# ---------------------------------------------------------------------- one placer: on=rank, gpus= in a Where


def test_where_of_makes_one_where_of_what_a_spawn_said() -> None:
    described = Where(label="env")
    assert where_of(described, 0) is described
    assert where_of(1, 0, gpus=2) == Where(rank=1, gpus=2)
    assert where_of(None, 2, gpus=1) == Where(gpus=1), "GPUs without a rank: any node that lends them"
    assert where_of(None, 2) == Where(rank=2), "nothing said: the caller's node"
    assert where_of(None, 2, anywhere=True) == Where(), "a group spread without on=: any node"
    assert repr(Where(rank=1, gpus=2)) == "Where(rank=1, gpus=2)"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rank": -1}, "Where(rank=...) must be a node's rank (an int >= 0) or None, not -1"),
        ({"rank": True}, "Where(rank=...) must be a node's rank (an int >= 0) or None, not True"),
        ({"rank": "1"}, "Where(rank=...) must be a node's rank (an int >= 0) or None, not '1'"),
        ({"rank": 1, "label": "env"}, "Where(rank=..., label=...): rank names the node, so it takes no label"),
        ({"rank": 1, "host": "h"}, "Where(rank=..., host=...): rank names the node, so it takes no host"),
        ({"rank": 1, "process": "own"}, "Where(rank=..., process=...): rank names the node, so it takes no process"),
        (
            {"rank": 1, "near": make_ref(cast(Any, None), 2, 5, "x", "actors:Counter")},
            "Where(rank=..., near=...): rank names the node, so it takes no near",
        ),
        (
            {"rank": 1, "apart_from": make_ref(cast(Any, None), 2, 5, "x", "actors:Counter")},
            "Where(rank=..., apart_from=...): rank names the node, so it takes no apart_from",
        ),
    ],
)
def test_where_rank_is_a_rank_and_names_the_node_alone(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"^Where\(rank=") as refused:
        Where(**options)
    assert str(refused.value).startswith(message)


async def test_where_rank_places_on_that_node_if_what_the_actor_holds_is_free_there(envs: LocalWorld) -> None:
    assert (await envs[0].spawn(Sim, name="learner/sim", on=Where(rank=3, cpus=3))).rank == 3
    assert (await envs[0].spawn(Sim, on=Where(rank=2))).rank == 2
    with pytest.raises(actorch.PlacementError) as refused:
        await envs[0].spawn(Sim, on=Where(rank=3, cpus=2))
    assert str(refused.value) == (
        "spawn(Sim, on=Where(rank=3, cpus=2)): no node fits; node 3: 1 cpus free, needs 2 cpus (held by learner/sim)"
    )


async def test_where_rank_refuses_a_rank_as_on_rank_does(envs: LocalWorld) -> None:
    with pytest.raises(ValueError, match=r"^on=Where\(rank=9\) is not a rank of this system"):
        await envs[0].spawn(Sim, on=Where(rank=9))
    envs.kill(3)
    await asyncio.sleep(0)
    for on in (3, Where(rank=3)):
        with pytest.raises(actorch.NodeLostError, match="cannot spawn Sim on node 3: it was lost"):
            await envs[0].spawn(Sim, on=on)


async def test_where_rank_waits_for_room_on_that_node(envs: LocalWorld) -> None:
    holder = await envs[0].spawn(Sim, on=Where(rank=3, cpus=4))

    async def stop_later() -> None:
        await asyncio.sleep(0.1)
        await holder.stop()

    stopping = asyncio.ensure_future(stop_later())
    async with asyncio.timeout(5):
        waited = await envs[0].spawn(Sim, on=Where(rank=3, cpus=4, wait=True))
    await stopping
    assert waited.rank == 3


async def test_the_node_chosen_builds_from_a_request_that_names_no_node_any_more(envs: LocalWorld, spy: Spy) -> None:
    built = spy(Spawner, "spawn_on")
    await envs[0].spawn(Sim, on=Where(rank=3, cpus=1))
    await envs[0].spawn_group(Sim, 2, on=2)
    wheres = [(rank, request.where) for _, rank, request in built]
    assert wheres == [(3, Where(cpus=1)), (2, Where()), (2, Where())]  # what a relocated actor is placed by


async def test_a_spawn_that_holds_nothing_asks_no_node_what_it_has_free(envs: LocalWorld) -> None:
    received = [envs[rank].statistics()["calls_received"] for rank in (2, 3)]
    assert (await envs[0].spawn(Sim, on=Where(label="env"))).rank == 1  # node 2 fits too, and is not asked
    assert (await envs[0].spawn(Sim, on=3)).rank == 3
    assert envs[2].statistics()["calls_received"] == received[0]
    assert envs[3].statistics()["calls_received"] == received[1] + 1  # the spawn itself, nothing before it


async def test_a_relocatable_actor_placed_by_what_nodes_have_never_lands_on_rank_0(envs: LocalWorld) -> None:
    relocate = actorch.Restart(relocate=True)
    anywhere = await envs[0].spawn(Sim, on=Where(), restart=relocate)
    assert anywhere.rank == 1, "rank 0 fits, but keeps the snapshots"
    with pytest.raises(actorch.PlacementError) as refused:
        await envs[0].spawn(Sim, on=Where(cpus=64), restart=relocate)
    assert "node 0: rank 0 hosts no relocatable actor (it keeps their snapshots); node 1: has " in str(refused.value)
