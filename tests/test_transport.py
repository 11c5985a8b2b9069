import asyncio

import torch

from actorch._transport import PORT_HOLD, InProcessHub, Port


async def test_port_sends_replies_back_once_every_expected_one_is_in():
    done = []
    port = Port(asyncio.get_running_loop(), done.append)
    port.expect()
    port.expect()
    port.release()  # dispatch of the batch is over
    assert port.put(b"a", None)
    assert not done
    assert port.put(b"b", [torch.ones(1)])
    assert port.closed
    assert done[0][0] == [b"a", b"b"]
    assert list(done[0][1]) == [1]


async def test_port_closes_after_its_hold_and_refuses_later_replies():
    done = []
    port = Port(asyncio.get_running_loop(), done.append)
    port.expect()
    port.release()
    await asyncio.sleep(PORT_HOLD * 5)
    assert done == [([], {})]
    assert not port.put(b"late", None)


async def test_port_held_for_a_slow_reply_stays_open_past_its_usual_hold():
    done = []
    port = Port(asyncio.get_running_loop(), done.append)
    port.expect()
    port.release()
    port.hold(0.2)
    await asyncio.sleep(PORT_HOLD * 5)
    assert not done
    assert port.put(b"batched", None)
    assert done == [([b"batched"], {})]


async def test_port_hold_still_closes_at_the_held_time_without_the_reply():
    done = []
    port = Port(asyncio.get_running_loop(), done.append)
    port.expect()
    port.release()
    port.hold(0.05)
    port.hold(0.0)  # a shorter hold never cuts a longer one
    await asyncio.sleep(0.02)
    assert not done
    await asyncio.sleep(0.1)
    assert done == [([], {})]


async def test_port_of_a_batch_without_calls_completes_at_once():
    done = []
    port = Port(asyncio.get_running_loop(), done.append)
    port.release()
    assert done == [([], {})]


async def test_transport_sends_one_batch_per_destination_per_loop_iteration():
    hub = InProcessHub(2)
    sender, receiver = hub.transport(0), hub.transport(1)
    received = []
    loop = asyncio.get_running_loop()
    sender.attach(loop, lambda *_: None, lambda *_: None)
    receiver.attach(loop, lambda src, batch, port: received.append((src, batch[0])), lambda *_: None)
    for index in range(5):
        sender.send(1, bytes([index]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sender.batches_sent == 1
    assert sender.messages_sent == 5
    assert received == [(0, [bytes([index]) for index in range(5)])]


async def test_sending_to_a_disconnected_rank_reports_it_lost():
    hub = InProcessHub(2)
    sender = hub.transport(0)
    lost = []
    sender.attach(asyncio.get_running_loop(), lambda *_: None, lambda rank, why: lost.append(rank))
    sender.send(1, b"x")
    await asyncio.sleep(0)
    assert lost == [1]


async def test_hub_disconnect_tells_every_other_rank():
    hub = InProcessHub(3)
    lost = {}
    for rank in range(3):
        transport = hub.transport(rank)
        transport.attach(
            asyncio.get_running_loop(), lambda *_: None, lambda gone, why, me=rank: lost.setdefault(me, gone)
        )
    hub.disconnect(2, "test")
    assert lost == {0: 2, 1: 2}
