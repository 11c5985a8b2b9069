import asyncio
import os
import socket
import time

import torch

from actorch._transport import sequencing
from actorch._transport.base import PORT_HOLD, NodeInfo, Port
from actorch._transport.bridge import Inbox
from actorch._transport.inprocess import InProcessHub
from actorch._transport.network import address_towards, interface_chosen, interface_towards
from actorch._transport.torch_rpc import inbox
from actorch._transport.torch_rpc import rpc as _rpc_transport
from actorch._transport.torch_rpc.options import TorchRpc
from actorch._transport.torch_rpc.rpc import RpcTransport


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


async def test_port_whose_hold_passed_sends_at_once_with_the_reply_that_finds_it_so():
    done = []
    port = Port(asyncio.get_running_loop(), done.append)
    port.expect()
    port.expect()
    port.release()  # dispatch done: two replies expected
    time.sleep(PORT_HOLD * 2)  # noqa: ASYNC251 - a busy loop: the port's timer could not run
    assert port.put(b"first", None)
    assert done == [([b"first"], {})]  # it left with the first reply, not held for the second
    assert not port.put(b"second", None)  # the second goes on its own


async def test_port_of_an_autograd_bundle_waits_for_its_reply_without_a_time_limit():
    done = []
    port = Port(asyncio.get_running_loop(), done.append, autograd=7)
    port.expect()
    port.release()
    port.hold(0.001)  # a batched endpoint's hold does not put a limit on it either
    await asyncio.sleep(PORT_HOLD * 5)
    assert done == []
    assert port.put(b"reply", None)
    assert done == [([b"reply"], {})]


async def test_send_alone_leaves_after_what_is_queued_for_that_rank():
    hub = InProcessHub(2)
    sender, receiver = hub.transport(0), hub.transport(1)
    received = []
    loop = asyncio.get_running_loop()
    sender.attach(loop, lambda *_: None, lambda *_: None)
    receiver.attach(loop, lambda src, bundle, port: received.extend(bundle[0]), lambda *_: None)
    sender.send(1, b"first")
    sender.send_alone(1, b"second")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert received == [b"first", b"second"]


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
    assert sender.bundles_sent == 1
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


# ---------------------------------------------------------------------- the torch RPC side, without RPC running


class _Beside:
    """A path beside torch RPC that opens nowhere and meets nobody (bundles come through ``arrived_beside``)."""

    name = "lane"

    def __init__(self) -> None:
        self.ranks_met: list[int] = []

    async def open_beside(self, secret: bytes, host: str) -> str | None:
        return None

    def met(self, info: NodeInfo) -> None:
        self.ranks_met.append(info.rank)


def _rpc_transport_for_test(lost: set[int]):
    """An RpcTransport of rank 0 in a world of 3 that counts ``lost`` lost, wired as start() would."""
    transport = RpcTransport(0, 3, "127.0.0.1", 0, TorchRpc())
    transport.put_beside(_Beside())
    for rank in range(3):  # as the rendezvous would: every peer met before torch RPC starts
        transport._add_peer(NodeInfo(rank, f"node{rank}", "here", rank))
    received = []
    transport.attach(asyncio.get_running_loop(), lambda src, batch, port: received.append((src, batch)), None)
    transport._inbox = Inbox(asyncio.get_running_loop(), transport._on_inbox)
    transport._inbox_loop = asyncio.get_running_loop()
    transport._lost_ranks = set(lost)
    _rpc_transport._active = transport
    return transport, received


async def test_rpc_inbound_answers_a_lost_or_unknown_sender_expelled_and_hands_the_batch_over_to_refuse():
    _, received = _rpc_transport_for_test({2})
    try:
        from_lost = _rpc_transport._inbound(2, 0, [b"x"], {})
        from_nowhere = _rpc_transport._inbound(7, 0, [b"y", b"z"], {})
        assert from_lost.value() == _rpc_transport.EXPELLED
        assert from_nowhere.value() == _rpc_transport.EXPELLED
        await asyncio.sleep(0)
        assert received == [(2, ([b"x"], {})), (7, ([b"y", b"z"], {}))]  # the node counts and logs them
    finally:
        _rpc_transport._active = None


async def test_rpc_ping_tells_a_stale_pinger_that_it_is_counted_lost():
    transport, _ = _rpc_transport_for_test({2})
    try:
        assert _rpc_transport._ping(2) is True
        assert _rpc_transport._ping(1) is False
        assert _rpc_transport._ping(9) is False
        assert transport._heard[1] > 0
    finally:
        _rpc_transport._active = None


async def test_rpc_losing_a_peer_answers_its_watch_and_held_batches_expelled():
    transport, _ = _rpc_transport_for_test(set())
    lost = []
    transport.attach(asyncio.get_running_loop(), lambda *args: None, lambda rank, why: lost.append((rank, why)))
    try:
        watch = _rpc_transport._watch(1)
        held = _rpc_transport._inbound(1, 5, [b"later"], {})  # out of order: held for seq 0..4
        await asyncio.sleep(0)
        assert not watch.done()
        assert not held.done()
        transport._peer_lost(1, "silent")
        assert watch.value() == _rpc_transport.EXPELLED
        assert held.value() == _rpc_transport.EXPELLED
        assert lost == [(1, "silent")]
        assert _rpc_transport._watch(1).value() == _rpc_transport.EXPELLED
    finally:
        _rpc_transport._active = None


def test_the_interface_towards_loopback_is_lo_and_an_unreachable_host_gives_none():
    assert interface_towards("127.0.0.1", 29500) == "lo"
    assert interface_towards("no-such-host.invalid", 29500) is None


def test_the_fast_lane_listens_where_tensorpipe_does(monkeypatch):
    monkeypatch.delenv("TP_SOCKET_IFNAME", raising=False)
    assert address_towards("127.0.0.1", 29500) == "127.0.0.1"
    assert address_towards("::1", 29500) == "::1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # this machine's route to another address
            probe.connect(("10.255.255.1", 1))
            expected = probe.getsockname()[0]
    except OSError:
        expected = None  # no route out of this machine at all
    if expected is not None:
        assert address_towards("10.255.255.1", 29500) == expected
    monkeypatch.setenv("TP_SOCKET_IFNAME", "lo")  # the user's choice of interface wins, as for TensorPipe
    assert address_towards("10.255.255.1", 29500) == "127.0.0.1"


def test_the_interface_is_chosen_only_while_torch_starts_and_a_users_choice_wins(monkeypatch):
    monkeypatch.delenv("TP_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth9")
    with interface_chosen("lo"):
        assert os.environ["TP_SOCKET_IFNAME"] == "lo"
        assert os.environ["GLOO_SOCKET_IFNAME"] == "eth9"
    assert "TP_SOCKET_IFNAME" not in os.environ
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth9"


async def test_rpc_forgets_a_peer_that_left_and_refuses_what_it_still_sends():
    transport, received = _rpc_transport_for_test(set())
    lost = []
    transport.attach(asyncio.get_running_loop(), lambda *args: received.append(args), lambda *args: lost.append(args))
    try:
        watch = _rpc_transport._watch(2)
        held = _rpc_transport._inbound(2, 3, [b"later"], {})  # out of order: held
        late = _rpc_transport._inbound(2, 4, [b"still queued"], {})
        await asyncio.sleep(0)
        transport.forget(2)
        assert watch.value() is None  # it hears that this node lets it go, not that it is expelled
        assert held.value() is None
        assert late.value() is None
        assert [info.rank for info in transport.peers()] == [0, 1]
        assert transport.world_size == 2
        assert not transport.knows(2)
        assert _rpc_transport._inbound(2, 0, [b"x"], {}).value() == _rpc_transport.EXPELLED
        assert _rpc_transport._ping(2) is False  # nothing to tell a node that left
        transport._lost_from_thread(2, "left the world")  # its links closing are expected
        await asyncio.sleep(0)
        assert lost == []
        transport.forget(2)  # twice is once
        transport.forget(0)  # never itself
        assert transport.knows(1)
        assert transport.peer(0).rank == 0
    finally:
        _rpc_transport._active = None


async def test_transport_counts_what_waits_for_this_iterations_bundle_as_backlog():
    hub = InProcessHub(2)
    sender, receiver = hub.transport(0), hub.transport(1)
    loop = asyncio.get_running_loop()
    sender.attach(loop, lambda *_: None, lambda *_: None)
    receiver.attach(loop, lambda *_: None, lambda *_: None)
    assert sender.backlog(1) == 0
    sender.send(1, b"x" * 100)
    sender.send(1, b"y" * 10, [torch.ones(4)])  # 16 bytes of tensor
    assert sender.backlog(1) == 126
    assert sender.backlog(0) == 0
    await asyncio.sleep(0)  # the bundle leaves; in process, it is handed over at once
    assert sender.backlog(1) == 0


async def test_rpc_transport_holds_early_bundles_in_order_and_loses_a_peer_whose_gap_outgrows_the_budget(monkeypatch):
    transport, received = _rpc_transport_for_test(set())
    lost = []
    transport._lost = lambda rank, why: lost.append((rank, why))
    monkeypatch.setattr(sequencing, "HELD_BUDGET", 250)
    try:
        transport.arrived_beside(1, 1, [b"b" * 100])  # bundle 0 has not come: these wait for it
        transport.arrived_beside(1, 2, [b"c" * 100])
        assert received == []
        transport.arrived_beside(1, 0, [b"a"])
        assert [batch[0] for _, batch in received] == [[b"a"], [b"b" * 100], [b"c" * 100]]
        assert transport.links.held_bytes.get(1, 0) == 0
        transport.arrived_beside(1, 4, [b"e" * 100])  # bundle 3 never comes
        transport.arrived_beside(1, 5, [b"f" * 100])
        assert lost == []
        transport.arrived_beside(1, 6, [b"g" * 100])  # 300 bytes would wait: over the budget
        assert lost == [(1, "300 bytes of bundles waited for bundle 3, which never came")]
        assert transport.links.held[1] == {}
        assert [batch[0] for _, batch in received[3:]] == [[b"g" * 100]]  # refused as from a lost node
    finally:
        _rpc_transport._active = None


def _answered(value: object) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    if isinstance(value, Exception):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


async def test_rpc_answer_to_a_ping_is_a_sign_of_life_unless_it_failed_or_the_peer_left():
    transport, _ = _rpc_transport_for_test(set())
    lost = []
    transport.attach(asyncio.get_running_loop(), lambda *args: None, lambda rank, why: lost.append((rank, why)))
    try:
        transport._heard[1] = transport._heard[2] = 0.0  # silent since long ago
        transport._ping_callback(1)(_answered(RuntimeError("RPCErr:1: timed out")))
        assert transport._heard[1] == 0.0  # a ping that failed is silence
        transport._ping_callback(1)(_answered(False))
        assert transport._heard[1] > 0.0  # answered: alive, even if it never pings this node itself
        transport.forget(2)
        transport._ping_callback(2)(_answered(False))
        assert not transport.knows(2)  # an answer from a node that left does not bring it back
        transport._ping_callback(1)(_answered(True))
        await asyncio.sleep(0)
        assert lost == [(1, "node 1 counts this node lost (it was silent too long)")]
    finally:
        _rpc_transport._active = None


def test_node_info_repr_shows_what_users_read_and_leaves_out_the_runtimes_fields():
    info = NodeInfo(2, "node2", "here", 42, label="env", parent=0, pool=True, lane="127.0.0.1:5000", process="boot:1")
    shown = repr(info)
    assert {"label='env'", "parent=0", "pool=True"} <= set(shown.removeprefix("NodeInfo(").rstrip(")").split(", "))
    assert not {"lane", "process"} & {field.partition("=")[0] for field in shown.split(", ")}
    assert info.lane == "127.0.0.1:5000"


async def test_rpc_hands_the_loop_typed_items_a_bundle_arrived_refused_or_answered():
    transport, received = _rpc_transport_for_test({2})
    posted = []
    transport._inbox = Inbox(asyncio.get_running_loop(), posted.append)
    try:
        _rpc_transport._inbound(1, 0, [b"x"], {})
        _rpc_transport._inbound(2, 0, [b"y"], {})
        transport._in_flight[1] = 10  # a bundle sent by torch RPC, its response still to come
        transport._sent_callback(1, 10)(_answered(([b"reply"], {})))
        transport._lost_from_thread(1, "gone")
        await asyncio.sleep(0)
        assert [type(item) for item in posted] == [
            inbox.Arrived,
            inbox.Refused,
            inbox.Answered,
            inbox.Lost,
        ]
        arrived = posted[0]
        assert (arrived.src, arrived.seq, arrived.bundle[0], arrived.context) == (1, 0, [b"x"], -1)
        assert posted[3].why == "gone"
        for item in posted[:3]:
            transport._on_inbox(item)
        assert [(src, bundle[0]) for src, bundle in received] == [(1, [b"x"]), (2, [b"y"]), (1, [b"reply"])]
        assert transport.bytes_received_by_path["torch_rpc"] == len(b"x") + len(b"reply")
    finally:
        _rpc_transport._active = None


async def test_rpc_severed_peers_are_neither_heard_nor_pinged_until_healed():
    transport, _ = _rpc_transport_for_test(set())
    try:
        transport._heard[1] = 0.0
        transport.sever([1])
        assert _rpc_transport._ping(1) is False
        _rpc_transport._inbound(1, 0, [b"x"], {})
        transport._ping_callback(1)(_answered(False))
        assert transport._heard[1] == 0.0  # nothing from a cut-off peer is a sign of life
        transport.heal([1])
        assert _rpc_transport._ping(1) is False
        assert transport._heard[1] > 0.0
    finally:
        _rpc_transport._active = None


def test_rpc_meets_the_path_beside_it_with_every_peer_and_counts_its_bytes_apart():
    transport = RpcTransport(0, 3, "127.0.0.1", 0, TorchRpc())
    beside = _Beside()
    transport.put_beside(beside)
    for rank in range(3):
        transport._add_peer(NodeInfo(rank, f"node{rank}", "here", rank))
    assert beside.ranks_met == [1, 2]
    assert transport.bytes_received_by_path == {"torch_rpc": 0, "lane": 0}
