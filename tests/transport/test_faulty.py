"""``FaultyTransport``: drops, delays and partitions on the links of any kind, in one process (a local world)."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

import actorch
from actorch._transport.faulty import FaultInjection
from actorch._transport.inprocess import InProcessHub
from actorch.testing import Delay, Drop, FaultyTransport, InProcess, LocalWorld, Partition, local_world

ARRIVALS: list[Any] = []
"""What ``Note`` actors saw, in the order they saw it (every node of a local world shares this process)."""


class Note(actorch.Actor):
    async def note(self, what: Any) -> None:
        ARRIVALS.append(what)

    async def echo(self, value: Any) -> Any:
        return value

    async def tell_many(self, target: actorch.ActorRef[Note], count: int) -> None:
        for number in range(count):
            target.tell(Note.note, number)
            await asyncio.sleep(0)  # each in a bundle of its own

    async def call_within(self, target: actorch.ActorRef[Note], seconds: float) -> str:
        try:
            async with asyncio.timeout(seconds):
                await target.call(Note.echo, "hello")
        except TimeoutError:
            return "timed out"
        return "answered"


@pytest.fixture(autouse=True)
def fresh_arrivals() -> None:
    ARRIVALS.clear()


async def until(condition: Any, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 - nothing to wait on but what the actors saw
            await asyncio.sleep(0.005)


def faults_of(world: LocalWorld, rank: int) -> FaultInjection:
    transport = world._hosts[rank].node.transport
    assert isinstance(transport, FaultInjection)
    return transport


# ---------------------------------------------------------------------- the record


@pytest.mark.parametrize(
    ("make", "error", "says"),
    [
        (lambda: Drop(1.5), ValueError, "probability must be a number in 0..1"),
        (lambda: Drop(src=-1), ValueError, "src must be a rank"),
        (lambda: Drop(dst=True), ValueError, "dst must be a rank"),
        (lambda: Delay(-0.1), ValueError, "seconds must be a number of seconds >= 0"),
        (lambda: Delay(0.1, jitter=float("nan")), ValueError, "jitter must be a number of seconds >= 0"),
        (lambda: Delay(0.1, start=2.0, stop=1.0), ValueError, "stop must be None or a number of seconds after start"),
        (lambda: Partition([]), ValueError, "a partition's side must hold at least one rank"),
        (lambda: Partition(["a"]), ValueError, "a partition's side must be a rank"),
        (lambda: Partition([1], start=-1), ValueError, "start must be a number of seconds >= 0"),
        (lambda: FaultyTransport(InProcess(), "drop"), TypeError, "takes Drop, Delay and Partition faults"),
        (lambda: FaultyTransport(InProcess(), seed=1.5), ValueError, "seed must be an int"),
        (lambda: FaultyTransport(InProcess(), epoch="now"), ValueError, "epoch must be None or a time.time() value"),
    ],
)
def test_faulty_transport_refuses_a_fault_or_setting_it_does_not_take(make: Any, error: type, says: str) -> None:
    with pytest.raises(error) as refused:
        make()
    assert says in str(refused.value)


def test_faulty_transport_prints_and_pickles_as_actorch_testing_names_it() -> None:
    record = FaultyTransport(InProcess(), Partition({2}, start=1.0), seed=3)
    assert repr(record).startswith("FaultyTransport(inner=InProcess(), faults=(Partition(side=frozenset({2})")
    assert type(record).__module__ == "actorch.testing"
    assert pickle.loads(pickle.dumps(record)) == record


def test_faulty_transport_answers_the_launch_as_the_kind_it_wraps() -> None:
    over_rpc = FaultyTransport(actorch.TorchRpc(device_maps={"cuda:0": "cuda:0"}), Drop(0.1))
    assert over_rpc.refuses_elastic() == over_rpc.inner.refuses_elastic()
    assert over_rpc.fixes_world() == over_rpc.inner.fixes_world()
    joining = over_rpc.joining(3.0)
    assert joining.inner == over_rpc.inner.joining(3.0)
    assert joining.faults == over_rpc.faults
    assert FaultyTransport(InProcess()).refuses_elastic() is not None


# ---------------------------------------------------------------------- faults in a local world


async def test_a_drop_loses_what_crosses_its_link_and_the_caller_times_out() -> None:
    async with local_world(3, transport=FaultyTransport(InProcess(), Drop(1.0, src=1, dst=2))) as world:
        sender = await world[0].spawn(Note, on=1)
        target = await world[0].spawn(Note, on=2)
        assert await sender.call(Note.call_within, target, 0.3) == "timed out"
        assert await target.call(Note.echo, "from 0") == "from 0"  # other links carry as before
        assert faults_of(world, 1).statistics()["dropped"] >= 1


async def test_random_drops_draw_the_same_with_the_same_seed() -> None:
    kept = []
    for seed in (7, 7, 8):
        ARRIVALS.clear()
        record = FaultyTransport(InProcess(), Drop(0.5, src=1, dst=2), seed=seed)
        async with local_world(3, transport=record) as world:
            sender = await world[0].spawn(Note, on=1)
            target = await world[0].spawn(Note, on=2)
            await sender.call(Note.tell_many, target, 40)
            await sender.call(Note.echo, "flushed")
            await asyncio.sleep(0.05)
            kept.append(list(ARRIVALS))
    assert kept[0] == kept[1]
    assert 0 < len(kept[0]) < 40
    assert kept[0] != kept[2]


async def test_a_delay_reorders_links_against_each_other_never_a_link_within_itself() -> None:
    async with local_world(3, transport=FaultyTransport(InProcess(), Delay(0.2, src=0, dst=1))) as world:
        slow, fast = await world[0].spawn(Note, on=1), await world[0].spawn(Note, on=2)
        for number in range(10):
            slow.tell(Note.note, ("slow", number))
            await asyncio.sleep(0)
        fast.tell(Note.note, ("fast", 0))
        await until(lambda: len(ARRIVALS) == 11)
        assert ARRIVALS[0] == ("fast", 0)
        assert ARRIVALS[1:] == [("slow", number) for number in range(10)]
        assert faults_of(world, 0).statistics()["delayed"] >= 10


async def test_a_partition_cuts_both_ways_and_each_side_counts_the_other_lost() -> None:
    record = FaultyTransport(InProcess(), Partition({2}))
    async with local_world(3, transport=record, liveness_timeout=0.3) as world:
        await until(lambda: 2 in world[0].lost_nodes and 2 in world[1].lost_nodes and 0 in world[2].lost_nodes)
        assert "a partition" in world[0].lost_nodes[2]
        assert 1 not in world[0].lost_nodes
        assert faults_of(world, 2).statistics()["cut"] == [0, 1]


async def test_a_short_partition_holds_what_crosses_it_and_sends_it_in_order_once_healed() -> None:
    record = FaultyTransport(InProcess(), Partition({1}, start=0.0, stop=0.3))
    async with local_world(2, transport=record, liveness_timeout=5.0) as world:
        note = await world[0].spawn(Note, on=1)  # the spawn itself waits for the heal
        for number in range(5):
            note.tell(Note.note, number)
        assert await note.call(Note.echo, "after") == "after"
        await until(lambda: len(ARRIVALS) == 5)
        assert list(range(5)) == ARRIVALS
        assert world[0].lost_nodes == {}
        assert faults_of(world, 0).statistics()["held"] >= 1


async def test_without_faults_a_faulty_world_is_its_inner_kinds() -> None:
    async with local_world(2, transport=FaultyTransport(InProcess())) as world:
        note = await world[0].spawn(Note, on=1)
        assert await note.call(Note.echo, [1, 2]) == [1, 2]
        assert faults_of(world, 0).statistics() == {"dropped": 0, "delayed": 0, "held": 0, "waiting": 0, "cut": []}


# ---------------------------------------------------------------------- one node's faults, directly


async def test_a_cut_off_node_neither_answers_off_the_loop_nor_takes_a_bundle_of_an_autograd_context() -> None:
    hub = InProcessHub(2)
    faulty = FaultInjection(hub.transport(0), FaultyTransport(InProcess(), Partition({1})), liveness_timeout=1.0)
    other = hub.transport(1)
    taken: list[Any] = []
    loop = asyncio.get_running_loop()
    faulty.attach(loop, lambda *_: None, lambda *_: None)
    other.attach(loop, lambda src, bundle, port: taken.append(bundle), lambda *_: None)
    await faulty.start()
    await until(lambda: faulty.statistics()["cut"] == [1])  # the partition begins
    with pytest.raises(TimeoutError, match="node 1 is cut off"):
        faulty.ask_off_loop(1, "loop", 1.0)
    faulty.send_alone(1, b"in a context")
    await asyncio.sleep(0)
    assert taken == []
    assert faulty.dropped == 1
    await faulty.close()


def test_local_world_refuses_a_liveness_timeout_that_is_not_a_positive_number() -> None:
    async def open_one() -> None:
        async with local_world(1, liveness_timeout=0):
            pass

    with pytest.raises(ValueError, match="liveness_timeout must be a positive number of seconds, not 0"):
        asyncio.run(open_one())


def test_local_world_refuses_a_transport_that_is_not_in_process_at_its_core() -> None:
    async def open_one() -> None:
        async with local_world(2, transport=FaultyTransport(actorch.TorchRpc())):
            pass

    with pytest.raises(
        ValueError, match=r"its transport is InProcess\(\) or a kind that wraps it, not FaultyTransport"
    ):
        asyncio.run(open_one())
