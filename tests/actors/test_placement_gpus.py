"""Placing actors by resource: ``spawn(..., gpus=k)`` on nodes with made-up GPU inventories, on the CPU.

The in-process worlds give some ranks fake GPUs (``local_world(devices=...)``)
and a fake accelerator makes devices current by recording them, so no test
touches CUDA. One multi-process run (``mp_scripts/placement.py``) does the same
between real processes, whose inventories meet at the rendezvous.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _mp import run_script
from conftest import Spy
from fake_gpus import FakeAccelerator, installed

import actorch
from actorch._actors.node.service import NodeService
from actorch._actors.placement.where_placer import Placer
from actorch._actors.where import Where
from actorch._transport.base import NodeTraits
from actorch._transport.inprocess import InProcessHub
from actorch.testing import LocalWorld, local_world

_births = itertools.count()


class Learner(actorch.Actor):
    fatal_errors = (RuntimeError,)

    def __init__(self) -> None:
        self.birth = next(_births)

    async def where(self) -> tuple[int, str, int]:
        """Its node, its device and which instance answers."""
        return self.system.rank, str(self.device), self.birth

    async def crash(self) -> None:
        raise RuntimeError("the learner diverged")


class FailingStart(actorch.Actor):
    async def on_start(self) -> None:
        raise OSError("no driver")


class RefusedHelper(actorch.Actor):
    """Its ``on_start`` raises ``PlacementError`` of its own on node 1 (a helper it could not place)."""

    async def on_start(self) -> None:
        if self.system.rank == 1:
            raise actorch.PlacementError("the helper found no GPU")


@pytest.fixture
def fake() -> Iterator[FakeAccelerator]:
    """The fake accelerator, installed for the test and removed after it."""
    with installed(FakeAccelerator(devices=())) as replacement:
        yield replacement


async def gpus_of(world: LocalWorld, rank: int) -> tuple[tuple[str, ...], dict[str, str]]:
    """What node ``rank``'s service says of its GPUs: the devices and their holders."""
    return await world[0].host.services[rank].call(NodeService.gpus)


async def test_nodes_list_the_devices_the_world_gives_them(fake: FakeAccelerator) -> None:
    async with local_world(3, devices={1: ["cuda:1", "cuda:0"], 2: ("cuda:0",)}) as world:
        assert [node.devices for node in world[2].nodes] == [(), ("cuda:1", "cuda:0"), ("cuda:0",)]


@pytest.mark.parametrize(
    ("devices", "message"),
    [({3: ("cuda:0",)}, "not a rank"), ({True: ("cuda:0",)}, "not a rank"), ({1: ("cpu",)}, "CUDA devices")],
)
def test_a_hub_refuses_devices_of_no_rank_or_off_cuda(devices: dict[Any, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        InProcessHub(3, devices=devices)


async def test_a_gpu_spawn_goes_to_the_lowest_rank_with_a_free_gpu(fake: FakeAccelerator) -> None:
    async with local_world(3, devices={1: ("cuda:0",), 2: ("cuda:0",)}) as world:
        learner = await world[0].spawn(Learner, gpus=1)
        assert (await learner.call(Learner.where))[:2] == (1, "cuda:0")


async def test_a_gpu_spawn_prefers_the_callers_node(fake: FakeAccelerator) -> None:
    async with local_world(3, devices={1: ("cuda:0",), 2: ("cuda:0",)}) as world:
        learner = await world[2].spawn(Learner, gpus=1)
        assert learner.rank == 2


async def test_a_placed_actor_runs_on_the_first_gpu_it_holds(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0", "cuda:1", "cuda:2")}) as world:
        pair = await world[0].spawn(Learner, gpus=2, name="pair")
        single = await world[0].spawn(Learner, gpus=1)
        fake.made_current.clear()
        assert (await pair.call(Learner.where))[:2] == (1, "cuda:0")
        assert fake.made_current[-1] == "cuda:0"  # current while its handler ran
        assert (await single.call(Learner.where))[:2] == (1, "cuda:2")
        devices, holders = await gpus_of(world, 1)
        assert devices == ("cuda:0", "cuda:1", "cuda:2")
        assert holders.pop("cuda:2").startswith("Learner#")  # unnamed: by class and id
        assert holders == {"cuda:0": "pair", "cuda:1": "pair"}


async def test_two_gpu_spawns_at_once_on_a_one_gpu_node_get_it_once(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0",)}) as world:
        started = time.monotonic()
        async with asyncio.timeout(5):
            outcomes = await asyncio.gather(
                world[0].spawn(Learner, gpus=1, name="first"),
                world[0].spawn(Learner, gpus=1, name="second"),
                return_exceptions=True,
            )
        assert time.monotonic() - started < 1.0
        placed = [outcome for outcome in outcomes if isinstance(outcome, actorch.ActorRef)]
        refused = [outcome for outcome in outcomes if isinstance(outcome, actorch.PlacementError)]
        assert len(placed) == 1
        assert len(refused) == 1
        holder = placed[0].name
        assert str(refused[0]).endswith(f"node 1: 0 gpus free, needs 1 gpus (held by {holder})")
        assert await world[0].lookup_all("*") == placed  # the refused spawn's name was given back


async def test_a_gpu_spawn_that_finds_its_gpu_taken_meanwhile_moves_on(fake: FakeAccelerator) -> None:
    async with local_world(3, devices={1: ("cuda:0",), 2: ("cuda:0",)}) as world:
        async with asyncio.timeout(5):
            # Both see node 1 free; its host lends its GPU to one, the other goes on to node 2.
            learners = await asyncio.gather(*(world[0].spawn(Learner, gpus=1) for _ in range(2)))
        assert sorted(learner.rank for learner in learners) == [1, 2]


async def test_a_gpu_spawn_on_a_node_without_gpus_names_it(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0",)}) as world:
        with pytest.raises(actorch.PlacementError) as refused:
            await world[0].spawn(Learner, gpus=1, on=0)
        assert str(refused.value) == "spawn(Learner, gpus=1, on=0): no node fits; node 0: has 0 gpus, needs 1 gpus"


async def test_the_refusal_says_what_every_node_has_and_who_holds_it(fake: FakeAccelerator) -> None:
    async with local_world(3, devices={1: ("cuda:0", "cuda:1")}) as world:
        await world[0].spawn(Learner, gpus=1, name="learner/0")
        with pytest.raises(actorch.PlacementError) as refused:
            await world[0].spawn(Learner, gpus=2)
        assert str(refused.value) == (
            "spawn(Learner, gpus=2): no node fits; node 0: has 0 gpus, needs 2 gpus; "
            "node 1: 1 gpus free, needs 2 gpus (held by learner/0); node 2: has 0 gpus, needs 2 gpus"
        )


async def test_a_gpu_spawn_skips_lost_nodes(fake: FakeAccelerator) -> None:
    async with local_world(3, devices={1: ("cuda:0",), 2: ("cuda:0",)}) as world:
        world.kill(1)
        first = await world[0].spawn(Learner, gpus=1)
        assert first.rank == 2
        with pytest.raises(actorch.PlacementError, match=r"node 1: lost; node 2: 0 gpus free, needs 1 gpus"):
            await world[0].spawn(Learner, gpus=1)


async def test_stopping_the_actor_gives_its_gpus_back(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0",)}) as world:
        first = await world[0].spawn(Learner, gpus=1)
        await first.stop()
        assert await gpus_of(world, 1) == (("cuda:0",), {})
        second = await world[0].spawn(Learner, gpus=1)
        assert (await second.call(Learner.where))[:2] == (1, "cuda:0")


async def test_an_actor_failed_for_good_gives_its_gpus_back(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0",)}, stop_grace=0.5) as world:
        learner = await world[0].spawn(Learner, gpus=1)
        with pytest.raises(RuntimeError):
            await learner.call(Learner.crash)
        async with asyncio.timeout(5):
            assert (await learner.wait_stopped()).reason == "failed"
        assert await gpus_of(world, 1) == (("cuda:0",), {})


async def test_a_failed_start_gives_the_gpus_back(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0",)}) as world:
        with pytest.raises(OSError, match="no driver"):
            await world[0].spawn(FailingStart, gpus=1)
        assert await gpus_of(world, 1) == (("cuda:0",), {})


async def test_a_restarted_actor_keeps_its_gpu(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0",)}) as world:
        learner = await world[0].spawn(Learner, gpus=1, name="learner", restart=actorch.Restart(backoff=0.01))
        _, _, birth = await learner.call(Learner.where)
        with pytest.raises(RuntimeError):
            await learner.call(Learner.crash)
        rank, device, reborn = await learner.call(Learner.where)
        assert (rank, device) == (1, "cuda:0")
        assert reborn != birth
        assert await gpus_of(world, 1) == (("cuda:0",), {"cuda:0": "learner"})


async def test_shutting_a_node_down_gives_its_gpus_back(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0", "cuda:1")}) as world:
        await world[0].spawn(Learner, gpus=2)
        await world._hosts[1].stop_all()
        assert world._hosts[1].lifecycle.gpus.holders == {}


async def test_an_explicit_device_holds_no_gpu(fake: FakeAccelerator) -> None:
    async with local_world(2, devices={1: ("cuda:0",)}) as world:
        shared = await world[0].spawn(Learner, device="cuda:0", on=1)
        lent = await world[0].spawn(Learner, gpus=1)
        assert (await shared.call(Learner.where))[:2] == (await lent.call(Learner.where))[:2] == (1, "cuda:0")


async def test_a_placement_error_of_the_actors_own_is_not_taken_for_a_refusal(fake: FakeAccelerator) -> None:
    async with local_world(3, devices={1: ("cuda:0",), 2: ("cuda:0",)}) as world:
        with pytest.raises(actorch.PlacementError, match="the helper found no GPU"):
            await world[0].spawn(RefusedHelper, gpus=1)
        assert await gpus_of(world, 2) == (("cuda:0",), {})  # it did not move on to node 2


async def test_a_gpu_spawn_on_a_rank_goes_through_the_one_placer_as_a_where(fake: FakeAccelerator, spy: Spy) -> None:
    placed = spy(Placer, "place")
    async with local_world(3, devices={1: ("cuda:0", "cuda:1"), 2: ("cuda:0", "cuda:1")}) as world:
        pair = await world[0].spawn(Learner, on=1, gpus=2)
        assert (await pair.call(Learner.where))[:2] == (1, "cuda:0")
        anywhere = await world[0].spawn(Learner, gpus=1)
        plain = await world[0].spawn(Learner, on=2)
    assert [(what, request.where) for what, request, _ in placed] == [
        ("spawn(Learner, gpus=2, on=1)", Where(rank=1, gpus=2)),
        ("spawn(Learner, gpus=1)", Where(gpus=1)),
        ("spawn(Learner, on=2)", Where(rank=2)),
    ]
    assert (anywhere.rank, plain.rank) == (2, 2)  # node 1's two GPUs were lent to the pair


async def test_a_gpu_spawn_skips_an_actors_own_process_unless_it_names_it(fake: FakeAccelerator) -> None:
    async with local_world(3, devices={1: ("cuda:0",), 2: ("cuda:0",)}) as world:
        world._hub.traits[1] = NodeTraits(owner="learner", parent=0)
        assert (await world[0].spawn(Learner, gpus=1, name="lent")).rank == 2
        with pytest.raises(actorch.PlacementError) as refused:
            await world[0].spawn(Learner, gpus=1)
        assert str(refused.value) == (
            "spawn(Learner, gpus=1): no node fits; node 0: has 0 gpus, needs 1 gpus; "
            "node 1: the own process of learner; node 2: 0 gpus free, needs 1 gpus (held by lent)"
        )
        named = await world[0].spawn(Learner, gpus=1, on=1)  # the exact form takes the node as it is
        assert (await named.call(Learner.where))[:2] == (1, "cuda:0")


@pytest.mark.parametrize("gpus", [-1, 1.0, True, "1", None])
async def test_gpus_must_be_a_count(world: LocalWorld, gpus: Any) -> None:
    with pytest.raises(ValueError, match="gpus must be an int >= 0"):
        await world[0].spawn(Learner, gpus=gpus)


async def test_gpus_and_device_together_are_refused(world: LocalWorld) -> None:
    with pytest.raises(ValueError, match=r"give device= or gpus=, not both"):
        await world[0].spawn(Learner, gpus=1, device="cuda:0")


async def test_gpus_zero_places_like_a_plain_spawn(world: LocalWorld) -> None:
    learner = await world[0].spawn(Learner, gpus=0, on=2)
    assert (await learner.call(Learner.where))[:2] == (2, "cpu")


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_gpu_spawns_at_once_between_processes_get_the_one_gpu_once() -> None:
    run = run_script("placement.py", timeout=75)
    run.assert_clean_exit(0)
    r = run.result("placement")
    assert r["devices"] == [[], ["cuda:0"]]
    assert r["where"] == [[1, "cuda:0"]]
    (refused,) = r["refused"]
    assert refused["type"] == "PlacementError"
    assert refused["message"] in {
        f"spawn(Learner, gpus=1): no node fits; node 0: has 0 gpus, needs 1 gpus; "
        f"node 1: 0 gpus free, needs 1 gpus (held by {name})"
        for name in ("learner/a", "learner/b")
    }
    assert r["where_again"] == [1, "cuda:0"]  # stopping gave it back
