"""Bounded mailboxes and message sizes: the window per actor, credits for tells, and what callers see."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
import torch

import actorch
from actorch._actors.ref import make_ref
from actorch._base.config import SystemConfig
from actorch._engine.flow import FlowControl
from actorch._engine.system_ids import SYSTEM_IDS
from actorch.testing import local_world


class Blocked(actorch.Actor):
    """Holds every message until ``release`` is called; counts what it handled."""

    max_concurrency = 1

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.seen: list[int] = []

    async def wait(self, index: int) -> int:
        await self.gate.wait()
        self.seen.append(index)
        return index

    async def note(self, index: int) -> None:
        await self.gate.wait()
        self.seen.append(index)

    async def seen_so_far(self) -> list[int]:
        return self.seen


class Echo(actorch.Actor):
    async def echo(self, value: Any) -> Any:
        return value

    async def make(self, size: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.uint8)

    async def fail(self) -> None:
        raise ValueError("told to fail")


def open_gate(world: Any, ref: actorch.ActorRef[Blocked]) -> None:
    cell = world._hosts[ref.rank].node.cell(ref._actor_id)
    cell.instance.gate.set()


# ---------------------------------------------------------------------- the window itself


async def test_flow_control_hands_freed_slots_to_waiters_in_order() -> None:
    flow = FlowControl(asyncio.get_running_loop(), 0, 2, lambda src, flat: None)
    target = (1, 7)
    assert flow.try_take(target)
    assert flow.try_take(target)
    assert not flow.try_take(target)
    order: list[str] = []

    async def waiter(tag: str) -> None:
        await flow.take(target)
        order.append(tag)

    first = asyncio.ensure_future(waiter("first"))
    second = asyncio.ensure_future(waiter("second"))
    await asyncio.sleep(0)
    assert flow.waiting() == 2
    assert not flow.try_take(target)  # nobody jumps the line
    flow.release(target)
    await first
    assert order == ["first"]
    assert flow.outstanding[target] == 2  # the slot changed hands
    flow.release(target, 2)
    await second
    assert order == ["first", "second"]
    assert flow.outstanding[target] == 1


async def test_flow_control_waiter_that_gives_up_passes_its_slot_on() -> None:
    flow = FlowControl(asyncio.get_running_loop(), 0, 1, lambda src, flat: None)
    target = (1, 1)
    assert flow.try_take(target)
    quitter = asyncio.ensure_future(flow.take(target))
    patient = asyncio.ensure_future(flow.take(target))
    await asyncio.sleep(0)
    quitter.cancel()
    flow.release(target)  # the quitter is skipped: the patient one gets the slot
    await patient
    with pytest.raises(asyncio.CancelledError):
        await quitter
    assert flow.outstanding[target] == 1
    assert flow.waiting() == 0


async def test_flow_control_fails_waiters_of_a_lost_rank_and_forgets_its_windows() -> None:
    flow = FlowControl(asyncio.get_running_loop(), 0, 1, lambda src, flat: None)
    assert flow.try_take((2, 1))
    assert flow.try_take((3, 1))
    waiting = asyncio.ensure_future(flow.take((2, 1)))
    await asyncio.sleep(0)
    flow.fail_rank(2, lambda: actorch.NodeLostError("node 2 lost"))
    with pytest.raises(actorch.NodeLostError, match="node 2 lost"):
        await waiting
    assert flow.outstanding == {(3, 1): 1}


async def test_flow_control_close_fails_every_waiter() -> None:
    flow = FlowControl(asyncio.get_running_loop(), 0, 1, lambda src, flat: None)
    assert flow.try_take((1, 1))
    waiting = asyncio.ensure_future(flow.take((1, 1)))
    await asyncio.sleep(0)
    flow.close(lambda: actorch.SystemClosedError("closed"))
    with pytest.raises(actorch.SystemClosedError):
        await waiting


async def test_flow_control_coalesces_credits_per_teller_and_iteration() -> None:
    sent: list[tuple[int, list[int]]] = []
    flow = FlowControl(asyncio.get_running_loop(), 0, 8, lambda src, flat: sent.append((src, flat)))
    for _ in range(3):
        flow.owe(1, 5)
    flow.owe(1, 6)
    flow.owe(2, 5)
    assert sent == []
    await asyncio.sleep(0)
    assert sorted(sent) == [(1, [5, 3, 6, 1]), (2, [5, 1])]


async def test_flow_control_credited_releases_slots() -> None:
    flow = FlowControl(asyncio.get_running_loop(), 0, 4, lambda src, flat: None)
    for _ in range(4):
        assert flow.try_take((1, 5))
    assert flow.try_take((1, 6))
    flow.credited(1, [5, 3, 6, 1])
    assert flow.outstanding == {(1, 5): 1}


@pytest.mark.parametrize("window", [0, -1, 1.5, True, "8"])
async def test_system_config_refuses_a_window_that_is_not_a_positive_int(window: Any) -> None:
    with pytest.raises(ValueError, match="mailbox_size"):
        SystemConfig(mailbox_size=window)


@pytest.mark.parametrize(("field", "value"), [("mailbox_size", 0), ("max_message_size", -5), ("stop_grace", -1.0)])
async def test_local_world_refuses_bad_limits(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        async with local_world(1, **{field: value}):
            pass


# ---------------------------------------------------------------------- what callers see


async def test_tell_beyond_the_mailbox_raises_and_nothing_is_lost(on: int) -> None:
    async with local_world(2, mailbox_size=4, stop_grace=0.5) as world:
        ref = await world[0].spawn(Blocked, on=on)
        for index in range(4):
            ref.tell(Blocked.note, index)
        await asyncio.sleep(0.01)
        with pytest.raises(actorch.MailboxFullError, match="mailbox_size"):
            ref.tell(Blocked.note, 99)
        open_gate(world, ref)
        assert await ref.call(Blocked.seen_so_far) == [0, 1, 2, 3]
        ref.tell(Blocked.note, 4)  # room again once the tells were handled
        assert await ref.call(Blocked.seen_so_far) == [0, 1, 2, 3, 4]
        assert world._hosts[0].node.flow.outstanding == {}


async def test_calls_beyond_the_mailbox_wait_for_room_and_all_are_answered(on: int) -> None:
    async with local_world(2, mailbox_size=3, stop_grace=0.5) as world:
        ref = await world[0].spawn(Blocked, on=on)
        calls = [asyncio.ensure_future(ref.call(Blocked.wait, index)) for index in range(20)]
        await asyncio.sleep(0.05)
        cell = world._hosts[on].node.cell(ref._actor_id)
        assert cell is not None
        assert len(cell.queue) <= 3  # the rest wait at the caller
        assert world._hosts[0].node.flow.waiting() >= 16
        open_gate(world, ref)
        assert await asyncio.gather(*calls) == list(range(20))
        assert await ref.call(Blocked.seen_so_far) == list(range(20))
        assert world._hosts[0].node.flow.waiting() == 0


async def test_a_call_waiting_for_room_times_out_at_its_deadline(on: int) -> None:
    async with local_world(2, mailbox_size=1, stop_grace=0.5) as world:
        ref = await world[0].spawn(Blocked, on=on)
        earlier = [asyncio.ensure_future(ref.call(Blocked.wait, index)) for index in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await ref.call(Blocked.wait, 9)
        open_gate(world, ref)
        assert await asyncio.gather(*earlier) == [0, 1]
        assert await ref.call(Blocked.wait, 2) == 2  # the one that timed out left no slot taken
        assert await ref.call(Blocked.seen_so_far) == [0, 1, 2]


async def test_calls_waiting_for_room_on_a_node_that_is_lost_fail_with_node_lost() -> None:
    async with local_world(3, mailbox_size=1, stop_grace=0.5) as world:
        ref = await world[0].spawn(Blocked, on=2)
        first = asyncio.ensure_future(ref.call(Blocked.wait, 0))
        second = asyncio.ensure_future(ref.call(Blocked.wait, 1))
        await asyncio.sleep(0.01)
        world.kill(2)
        for pending in (first, second):
            with pytest.raises(actorch.NodeLostError):
                await pending
        assert world._hosts[0].node.flow.outstanding == {}


async def test_tells_return_their_credit_when_their_handler_raises(on: int) -> None:
    async with local_world(2, mailbox_size=2, stop_grace=0.5) as world:
        ref = await world[0].spawn(Echo, on=on)
        with structlog.testing.capture_logs() as logs:
            for _ in range(10):
                ref.tell(Echo.fail)
                await asyncio.sleep(0.01)
        assert world._hosts[0].node.flow.outstanding == {}
        assert [entry["event"] for entry in logs].count("tell failed") == 10


async def test_tells_to_a_stopped_actor_return_their_credit() -> None:
    async with local_world(2, mailbox_size=2, stop_grace=0.5) as world:
        ref = await world[0].spawn(Echo, on=1)
        stale = make_ref(world._hosts[0].node.caller, 1, ref._actor_id, None, "nowhere:Echo")
        await ref.stop()
        with structlog.testing.capture_logs() as logs:
            for _ in range(5):
                stale.tell("echo", 1)
                await asyncio.sleep(0.01)
        assert world._hosts[0].node.flow.outstanding == {}
        assert [entry["event"] for entry in logs].count("tell failed") == 5


async def test_a_message_over_max_message_size_is_refused_where_it_is_sent() -> None:
    async with local_world(2, max_message_size=1000) as world:
        ref = await world[0].spawn(Echo, on=1)
        with pytest.raises(actorch.MessageTooLargeError, match="max_message_size") as caught:
            await ref.call(Echo.echo, torch.zeros(2000, dtype=torch.uint8))
        assert isinstance(caught.value, actorch.SerializationError)
        with pytest.raises(actorch.MessageTooLargeError):
            ref.tell(Echo.echo, b"x" * 2000)
        with pytest.raises(actorch.MessageTooLargeError, match="result"):
            await ref.call(Echo.make, 2000)
        assert (await ref.call(Echo.make, 10)).numel() == 10  # the actor goes on serving
        local = await world[0].spawn(Echo, on=0)
        assert (await local.call(Echo.make, 5000)).numel() == 5000  # nothing crosses the wire


async def test_a_receiver_with_a_smaller_limit_refuses_and_logs_once() -> None:
    async with local_world(2) as world:
        ref = await world[0].spawn(Echo, on=1)
        world._hosts[1].node.callee.max_message_size = 100
        with (
            structlog.testing.capture_logs() as logs,
            pytest.raises(actorch.MessageTooLargeError, match="refused a message of"),
        ):
            await ref.call(Echo.echo, b"y" * 500)
        refused = [entry for entry in logs if entry["event"] == "message refused"]
        assert len(refused) == 1
        assert refused[0]["node"] == 1
        assert await ref.call(Echo.echo, 1) == 1


async def test_batches_from_a_lost_node_are_refused_and_logged_once() -> None:
    async with local_world(3) as world:
        node = world._hosts[0].node
        node._on_peer_lost(2, "test")
        with structlog.testing.capture_logs() as logs:
            node._receive(2, ([b"\x90"], {}), None)
            node._receive(2, ([b"\x90", b"\x90"], {}), None)
            node._receive(7, ([b"\x90"], {}), None)
        assert node.statistics()["messages_refused"] == 4
        assert [entry["src"] for entry in logs if entry["event"].startswith("messages refused")] == [2, 7]


async def test_a_node_cut_off_from_the_world_sees_its_peers_lost_when_it_sends() -> None:
    async with local_world(3, stop_grace=0.5) as world:
        ref = await world[2].spawn(Echo, on=0)
        world._hub.disconnect(2, "cut off by the test")  # node 2 still runs: it is stale
        with pytest.raises(actorch.NodeLostError, match="counts this node lost"):
            await ref.call(Echo.echo, 1)
        assert 2 in world[0].lost_nodes


async def test_the_system_actors_are_not_bounded_so_watchers_never_block_a_spawn_or_a_stop() -> None:
    async with local_world(2, mailbox_size=1, stop_grace=0.5) as world:
        refs = [await world[0].spawn(Echo, on=1) for _ in range(3)]
        watchers = [asyncio.ensure_future(ref.wait_stopped()) for ref in refs]  # long calls to node 1's service
        await asyncio.sleep(0.01)
        async with asyncio.timeout(2.0):
            extra = await world[0].spawn(Echo, on=1, name="extra")
            assert await world[0].lookup("extra") == extra
            for ref in refs:
                await ref.stop()
            exits = await asyncio.gather(*watchers)
        assert [exit_.reason for exit_ in exits] == ["stopped"] * 3
        assert world._hosts[0].node.flow.outstanding == {}


async def test_user_actors_get_ids_after_the_system_ids_on_every_node() -> None:
    async with local_world(2) as world:
        for rank in (0, 1):
            ref = await world[0].spawn(Echo, on=rank)
            assert ref._actor_id == SYSTEM_IDS + 1


async def test_a_system_id_is_given_once_and_only_below_the_user_ids() -> None:
    async with local_world(1) as world:
        node = world._hosts[0].node
        with pytest.raises(ValueError, match="not a free system id"):
            node.add_actor(object(), {}, name=None, max_concurrency=1, actor_id=1)  # the service has it
        with pytest.raises(ValueError, match="not a free system id"):
            node.add_actor(object(), {}, name=None, max_concurrency=1, actor_id=SYSTEM_IDS + 1)


async def test_a_call_to_a_stopped_actor_is_refused_and_logged_once_at_its_node() -> None:
    async with local_world(2) as world:
        ref = await world[0].spawn(Echo, on=1)
        await ref.stop()
        with structlog.testing.capture_logs() as logs, pytest.raises(actorch.ActorStoppedError, match="has stopped"):
            await ref.call(Echo.echo, 1)
        refused = [entry for entry in logs if entry["event"] == "call refused: actor stopped"]
        assert [(entry["node"], entry["log_level"]) for entry in refused] == [(1, "debug")]  # its caller hears it
