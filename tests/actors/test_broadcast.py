"""Broadcast over the in-process world: one copy per node, each member's own outcome, order, windows, loss.

Members spread over the three nodes of the world (the caller is rank 0), so a
broadcast mixes the local path with one ``CAST`` per other node. The transport
counts the bytes it sends per destination: that is how the tests see one copy
per node.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
import torch
from actors import Sleeper, Stranger, wait_until_counts
from fake_gpus import FakeAccelerator, installed

import actorch
from actorch import broadcast, broadcast_tell
from actorch._base.codec import Codec
from actorch._base.deadline import inherited_deadline
from actorch._engine import multicast
from actorch.group import ActorGroup
from actorch.testing import LocalWorld, local_world

MB = 1 << 20


class Member(Sleeper):
    """A group test's worker that can also be held at a gate and digest a tensor."""

    def __init__(self, tag: int) -> None:
        super().__init__(tag)
        self.gate = asyncio.Event()

    async def digest(self, data: torch.Tensor, *, scale: int = 1) -> list[float]:
        return [self.tag, float(data.sum()) * scale]

    async def hold(self) -> int:
        await self.gate.wait()
        return self.tag


async def spawn_members(world: LocalWorld, ranks: tuple[int, ...], **options: Any) -> list[actorch.ActorRef[Any]]:
    return [await world[0].spawn(Member, args=(tag,), on=rank, **options) for tag, rank in enumerate(ranks)]


def instance(world: LocalWorld, ref: actorch.ActorRef[Any]) -> Any:
    cell = world._hosts[ref.rank].node.cell(ref._actor_id)
    assert cell is not None
    return cell.instance


def sent_since(world: LocalWorld, before: dict[int, int]) -> dict[int, int]:
    after = world._hosts[0].node.transport.tensor_bytes_sent
    return {rank: after.get(rank, 0) - before.get(rank, 0) for rank in (1, 2)}


# --------------------------------------------------------------------------- delivery and cost


async def test_broadcast_delivers_the_same_arguments_to_every_member(world: LocalWorld) -> None:
    refs = await spawn_members(world, (0, 1, 1, 2, 2, 2))
    data = torch.arange(10.0)
    async with asyncio.timeout(5):
        results = await asyncio.gather(*broadcast(refs, Member.digest, data, scale=2))
    assert results == [[tag, 90.0] for tag in range(6)]


async def test_broadcast_sends_each_tensor_once_per_node_not_once_per_member(world: LocalWorld) -> None:
    refs = await spawn_members(world, (0, 1, 1, 1, 2, 2, 2, 0))  # 8 members: 2 local, 3 on each other node
    data = torch.ones(MB)  # 4 MB
    transport = world._hosts[0].node.transport
    async with asyncio.timeout(5):
        before, messages = dict(transport.tensor_bytes_sent), transport.messages_sent
        results = await asyncio.gather(*broadcast(refs, Member.digest, data))
        assert sent_since(world, before) == {1: data.nbytes, 2: data.nbytes}
        assert transport.messages_sent - messages == 2, "one CAST per other node"
        assert transport.bytes_sent[1] > 0
        assert [value for _, value in results] == [float(MB)] * 8
        before = dict(transport.tensor_bytes_sent)
        broadcast_tell(refs, Member.record, data)
        await asyncio.sleep(0)  # queued messages leave at the end of the loop iteration
        assert sent_since(world, before) == {1: data.nbytes, 2: data.nbytes}
        before = dict(transport.tensor_bytes_sent)
        for ref in refs:
            ref.tell(Member.record, data)  # each tell copies its tensors at once: one copy per member
        await asyncio.sleep(0)
        assert sent_since(world, before) == {1: 3 * data.nbytes, 2: 3 * data.nbytes}
        # Calls made one by one in one loop iteration share the tensor object in one bundle, which
        # torch's pickler sends once; broadcast makes that one copy per node whatever the timing.
        before, messages = dict(transport.tensor_bytes_sent), transport.messages_sent
        await asyncio.gather(*(ref.call(Member.digest, data) for ref in refs))
        assert sent_since(world, before) == {1: data.nbytes, 2: data.nbytes}
        assert transport.messages_sent - messages == 6
    assert world._hosts[1].node.callee.calls_received >= 6


async def test_members_on_one_node_share_the_decoded_arguments(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 2))
    async with asyncio.timeout(5):
        await asyncio.gather(*broadcast(refs, Member.record, [1, 2, 3]))
    kept = [instance(world, ref).received[0] for ref in refs]
    assert kept == [[1, 2, 3]] * 3
    assert kept[0] is kept[1], "decoded once on node 1"
    assert kept[0] is not kept[2]


async def test_members_on_different_devices_of_one_node_get_their_own_decoding() -> None:
    with installed(FakeAccelerator()):
        async with local_world(2, stop_grace=0.5) as world:
            refs = [
                await world[0].spawn(Member, args=(tag,), on=1, device=device)
                for tag, device in enumerate(("cuda:0", "cuda:0", "cuda:1"))
            ]
            async with asyncio.timeout(5):
                await asyncio.gather(*broadcast(refs, Member.record, [7]))
            kept = [instance(world, ref).received[0] for ref in refs]
    assert kept[0] is kept[1]
    assert kept[0] is not kept[2]
    assert kept[2] == [7]


async def test_broadcast_reaches_the_same_actor_twice_when_listed_twice(world: LocalWorld) -> None:
    (ref,) = await spawn_members(world, (1,))
    async with asyncio.timeout(5):
        assert await asyncio.gather(*broadcast([ref, ref], Member.record, "x")) == [None, None]
        assert await ref.call(Member.recorded) == ["x", "x"]


async def test_broadcast_without_arguments_and_to_lone_members(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 2))
    async with asyncio.timeout(5):
        assert await asyncio.gather(*broadcast(refs, Member.ident)) == [0, 1, 2]
        assert await asyncio.gather(*broadcast(refs, "ident")) == [0, 1, 2]


async def test_broadcast_to_no_refs_sends_nothing() -> None:
    assert broadcast([], Member.ident) == []
    broadcast_tell([], Member.record, 1)


# --------------------------------------------------------------------------- each member's own outcome


async def test_broadcast_gives_each_member_its_own_error(world: LocalWorld) -> None:
    refs = await spawn_members(world, (0, 1, 1, 2))
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*broadcast(refs, Member.fail_if, 2), return_exceptions=True)
    assert outcomes[:2] == [0, 1]
    assert outcomes[3] == 3
    assert isinstance(outcomes[2], ValueError)
    assert isinstance(outcomes[2], actorch.RemoteError)
    assert str(outcomes[2]) == "worker 2 refuses"


async def test_broadcast_to_stopped_members_fails_only_them(world: LocalWorld) -> None:
    refs = await spawn_members(world, (0, 0, 1, 1))
    await refs[1].stop()
    await refs[2].stop()
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*broadcast(refs, Member.ident), return_exceptions=True)
    assert outcomes[0] == 0
    assert outcomes[3] == 3
    assert isinstance(outcomes[1], actorch.ActorStoppedError)
    assert isinstance(outcomes[2], actorch.ActorStoppedError)
    assert "has stopped" in str(outcomes[2])


async def test_broadcast_to_a_lost_node_fails_only_its_members_with_node_lost(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 2, 2))
    world.kill(2)
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*broadcast(refs, Member.ident), return_exceptions=True)
    assert outcomes[:2] == [0, 1]
    assert all(isinstance(outcome, actorch.NodeLostError) for outcome in outcomes[2:])
    assert outcomes[2] is not outcomes[3]


async def test_a_node_lost_during_a_broadcast_fails_only_its_members(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 2, 2))
    calls = broadcast(refs, Member.sleep, 0.2)
    await wait_until_counts(refs[2], started=1)
    world.kill(2)
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert outcomes[:2] == [0, 1]
    assert all(isinstance(outcome, actorch.NodeLostError) for outcome in outcomes[2:])
    assert world._hosts[0].node.caller.pending == {}


async def test_broadcast_after_shutdown_raises_system_closed_for_remote_members() -> None:
    async with local_world(3, stop_grace=0.5) as world:
        refs = await spawn_members(world, (1, 1, 2))
    for call in broadcast(refs, Member.ident):
        with pytest.raises(actorch.SystemClosedError):
            await call


async def test_broadcast_of_arguments_over_the_size_limit_fails_each_remote_member() -> None:
    async with local_world(3, stop_grace=0.5, max_message_size=1000) as world:
        refs = await spawn_members(world, (0, 1, 1))
        async with asyncio.timeout(5):
            outcomes = await asyncio.gather(*broadcast(refs, Member.digest, torch.ones(1000)), return_exceptions=True)
    assert outcomes[0] == [0, 1000.0], "the caller's node takes them by reference"
    assert all(isinstance(outcome, actorch.MessageTooLargeError) for outcome in outcomes[1:])
    assert refs[1]._label in str(outcomes[1]), "each member's own error names it"


async def test_a_node_that_refuses_a_broadcast_as_too_large_fails_each_of_its_members(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 2))
    world._hosts[1].node.callee.max_message_size = 100  # node 1 takes less than the caller may send
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*broadcast(refs, Member.digest, torch.ones(100)), return_exceptions=True)
    assert all(isinstance(outcome, actorch.MessageTooLargeError) for outcome in outcomes[:2])
    assert outcomes[0] is not outcomes[1]
    assert outcomes[2] == [2, 100.0]


async def test_a_node_that_cannot_read_a_broadcast_fails_each_of_its_members(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 2))
    world._hosts[1].node.callee.codec = Codec(strict=True)  # node 1 refuses pickled values
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*broadcast(refs, Member.record, {1, 2}), return_exceptions=True)
    assert all(isinstance(outcome, actorch.SerializationError) for outcome in outcomes[:2])
    assert outcomes[2] is None


# --------------------------------------------------------------------------- order, cancellation, deadlines


async def test_a_broadcast_then_a_call_reach_each_actor_in_that_order(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 2, 2))
    async with asyncio.timeout(5):
        calls = broadcast(refs, Member.record, "first")
        after = [ref.call(Member.record, "second") for ref in refs]
        broadcast_tell(refs, Member.record, "third")
        for ref in refs:
            ref.tell(Member.record, "fourth")
        await asyncio.gather(*calls, *after)
        kept = await asyncio.gather(*(ref.call(Member.recorded) for ref in refs))
    assert kept == [["first", "second", "third", "fourth"]] * 4


async def test_cancelling_one_members_call_cancels_only_its_handler(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 1))
    calls = broadcast(refs, Member.sleep, 0.3)
    for ref in refs:
        await wait_until_counts(ref, started=1)
    assert calls[1].cancel()  # type: ignore[attr-defined]
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert outcomes[0] == 0
    assert outcomes[2] == 2
    assert isinstance(outcomes[1], asyncio.CancelledError)
    await wait_until_counts(refs[1], cancelled=1)
    assert [(await ref.call(Member.counts))["cancelled"] for ref in refs] == [0, 1, 0]
    assert world._hosts[0].node.caller.pending == {}
    assert world._hosts[0].node.flow.outstanding == {}


async def test_a_deadline_passed_before_sending_fails_each_call_with_timeout(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1))
    token = inherited_deadline.set(asyncio.get_running_loop().time() - 1)  # as a remote caller's passed deadline
    try:
        calls = broadcast(refs, Member.ident)
    finally:
        inherited_deadline.reset(token)
    for call in calls:
        with pytest.raises(TimeoutError, match="deadline passed before calling 'ident'"):
            await call
    assert world._hosts[0].node.flow.outstanding == {}


async def test_group_call_deadline_cancels_every_broadcast_member(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 1, 2))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await ActorGroup(refs).call(Member.sleep, 30)
    for ref in refs:
        await wait_until_counts(ref, started=1, cancelled=1)


# --------------------------------------------------------------------------- windows


async def test_a_member_with_a_full_window_waits_for_room_while_the_others_are_answered() -> None:
    async with local_world(2, mailbox_size=1, stop_grace=0.5) as world:
        refs = await spawn_members(world, (1, 1, 1))
        held = refs[1].call(Member.hold)  # takes member 1's only slot
        calls = broadcast(refs, Member.ident)
        async with asyncio.timeout(5):
            assert await calls[0] == 0
            assert await calls[2] == 2
            assert not calls[1].done()  # type: ignore[attr-defined]
            instance(world, refs[1]).gate.set()
            assert await held == 1
            assert await calls[1] == 1


async def test_broadcast_tell_refuses_only_members_with_a_full_window() -> None:
    async with local_world(2, mailbox_size=1, stop_grace=0.5) as world:
        refs = await spawn_members(world, (1, 1, 1))
        held = refs[1].call(Member.hold)
        with pytest.raises(actorch.GroupError, match="1 of 3 tells of 'record' failed") as caught:
            broadcast_tell(refs, Member.record, "told")
        assert caught.value.failed == [1]
        assert isinstance(caught.value.results[1], actorch.MailboxFullError)
        assert caught.value.results[0] is None
        instance(world, refs[1]).gate.set()
        async with asyncio.timeout(5):
            await held
            kept = await asyncio.gather(*(ref.call(Member.recorded) for ref in refs))
    assert kept == [["told"], [], ["told"]]


# --------------------------------------------------------------------------- tells


async def test_broadcast_tell_copies_tensors_at_once(world: LocalWorld) -> None:
    refs = await spawn_members(world, (0, 1, 1))
    data = torch.zeros(4)
    broadcast_tell(refs, Member.record, data)
    data += 1
    async with asyncio.timeout(5):
        kept = await asyncio.gather(*(ref.call(Member.recorded) for ref in refs))
    assert all(torch.equal(values[0], torch.zeros(4)) for values in kept)


async def test_broadcast_tell_checks_each_members_endpoint_and_sends_to_the_rest(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 2))
    stranger = await world[0].spawn(Stranger, on=1)
    mixed: list[actorch.ActorRef[Any]] = [refs[0], stranger, refs[1]]
    with pytest.raises(actorch.GroupError, match="1 of 3 tells of 'record' failed") as caught:
        broadcast_tell(mixed, "record", 1)
    assert caught.value.failed == [1]
    refused = caught.value.results[1]
    assert isinstance(refused, actorch.EndpointError)
    assert refused.__notes__ == [f"in {stranger._label}, one of the tells of 'record'"]
    with pytest.raises(actorch.GroupError) as caught:
        broadcast_tell(refs, Member.record, 1, 2)  # type: ignore[call-overload]
    assert caught.value.failed == [0, 1]
    async with asyncio.timeout(5):
        assert await asyncio.gather(*(ref.call(Member.recorded) for ref in refs)) == [[1], [1]]


async def test_broadcast_tell_to_a_lost_node_is_logged_and_dropped(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 2, 2))
    world.kill(2)
    with structlog.testing.capture_logs() as logs:
        broadcast_tell(refs, Member.record, "x")
    assert [entry["event"] for entry in logs].count("tell dropped: node lost") == 2
    async with asyncio.timeout(5):
        assert await refs[0].call(Member.recorded) == ["x"]


async def test_broadcast_tell_of_arguments_that_cannot_be_sent_refuses_each_remote_member() -> None:
    async with local_world(3, strict=True, stop_grace=0.5) as world:
        refs = await spawn_members(world, (1, 1, 2))
        with pytest.raises(actorch.GroupError) as caught:
            broadcast_tell(refs, Member.record, {1})
    assert caught.value.failed == [0, 1, 2]
    assert all(isinstance(error, actorch.SerializationError) for error in caught.value.exceptions)


# --------------------------------------------------------------------------- refused broadcasts and fallbacks


async def test_broadcast_refuses_a_method_that_is_no_endpoint(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1,))
    with pytest.raises(actorch.EndpointError, match="not 42"):
        broadcast(refs, 42)  # type: ignore[call-overload]
    with pytest.raises(actorch.EndpointError, match="not 42"):
        broadcast_tell(refs, 42)  # type: ignore[call-overload]


async def test_broadcast_refuses_items_that_are_not_refs(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1,))
    with pytest.raises(TypeError, match="item 1 is 'm'"):
        broadcast([refs[0], "m"], Member.ident)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="item 0 is 3"):
        broadcast_tell([3], "record", 1)  # type: ignore[list-item]


async def test_broadcast_refuses_refs_of_different_systems(world: LocalWorld) -> None:
    ref = await world[0].spawn(Member, args=(0,), name="m/0", on=2)
    seen_from_node_1 = await world[1].lookup("m/0")
    with pytest.raises(ValueError, match="actors of one system"):
        broadcast([ref, seen_from_node_1], "ident")
    with pytest.raises(ValueError, match="actors of one system"):
        broadcast_tell([ref, seen_from_node_1], "record", 1)


async def test_broadcast_in_an_autograd_context_sends_each_member_its_own_call(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    refs = await spawn_members(world, (1, 1, 1))
    monkeypatch.setattr(multicast, "current_context_id", lambda: 7)  # a context: its calls must leave alone
    transport = world._hosts[0].node.transport
    messages = transport.messages_sent
    async with asyncio.timeout(5):
        assert await asyncio.gather(*broadcast(refs, Member.ident)) == [0, 1, 2]
        assert transport.messages_sent - messages == 3
        broadcast_tell(refs, Member.record, 1)
        await asyncio.sleep(0)
        assert transport.messages_sent - messages == 6


async def test_broadcast_made_off_the_loop_runs_each_call_on_it(world: LocalWorld) -> None:
    refs = await spawn_members(world, (1, 2))
    loop = asyncio.get_running_loop()
    results: list[Any] = []

    def from_thread() -> None:
        calls = broadcast(refs, Member.ident)
        results.extend(asyncio.run_coroutine_threadsafe(call, loop).result(5) for call in calls)

    async with asyncio.timeout(5):
        await asyncio.to_thread(from_thread)
    assert results == [0, 1]
