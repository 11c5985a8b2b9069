"""Elastic membership in one process: the join protocol over a store, validation, and what a departure means.

The real thing (processes joining over torch RPC, leaving, dying) is in
``test_elastic_multiprocess``. Here: the store protocol against torch's
in-memory store, every argument check, and the engine's side of a node that
left (its calls end in ``ActorStoppedError``, not ``NodeLostError``), on an
in-process world where the departure is staged by hand.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
import torch.distributed as dist
from _mp import free_port, refused_port
from actors import Counter, Victim

import actorch
from actorch._actors.events import EventHub, NodeJoined, NodeLeft, Subscription
from actorch._actors.restart import EXIT_REASONS
from actorch._engine.node import describe_ranks
from actorch._launch.world import run as run_module
from actorch._transport.base import NodeInfo
from actorch._transport.membership import Membership, facts_of, info_of, new_token, parse_address
from actorch._transport.torch_rpc.elastic import ElasticRpcTransport, prepare_join
from actorch._transport.torch_rpc.options import TorchRpc
from actorch.testing import LocalWorld, local_world

ME = NodeInfo(5, "node5", "host-a", 4242, ("cuda:0",), "observers")


# ---------------------------------------------------------------- the store protocol


def test_addresses_parse_as_host_and_port() -> None:
    assert parse_address("127.0.0.1:29500") == ("127.0.0.1", 29500)
    assert parse_address("[::1]:80") == ("::1", 80)
    for bad in ("127.0.0.1", ":80", "host:", "host:port", "host:0", "host:70000"):
        with pytest.raises(ValueError, match="host:port"):
            parse_address(bad)


def test_node_facts_survive_the_store() -> None:
    assert info_of(json.loads(json.dumps(facts_of(ME)))) == ME


def test_tokens_are_fresh_and_long() -> None:
    tokens = {new_token() for _ in range(20)}
    assert len(tokens) == 20
    assert all(len(token) >= 32 for token in tokens)


def _store() -> Any:
    return dist.HashStore()  # type: ignore[attr-defined]


def test_an_admitted_newcomer_learns_the_members_and_the_token_never_enters_the_store() -> None:
    store, token = _store(), "s3cret-token"
    rank0 = Membership(store)
    rank0.open(2, {"config": {"stop_grace": 1.0}})
    newcomer = Membership(store)
    newcomer.wait_elastic(1.0)
    rank = newcomer.take_rank()
    assert rank == 2  # after the launch's own two
    assert newcomer.take_rank() == 3  # never reused
    assert newcomer.settings() == {"config": {"stop_grace": 1.0}}
    asking = NodeInfo(rank, f"node{rank}", "host-a", 4242)
    newcomer.ask(asking, token)
    request = rank0.request(rank)
    assert request is not None
    assert request.info == asking
    assert request.verify(token)
    assert not request.verify("another-token")
    assert token not in bytes(store.get(f"join/{rank}")).decode()
    rank0.answer(rank, None, [ME])
    assert newcomer.wait_answer(rank, 1.0) == [ME]
    newcomer.up(rank)
    assert rank0.is_up(rank)
    assert not rank0.is_ready(rank)
    rank0.ready(rank)
    newcomer.wait_ready(rank, 1.0)
    assert rank0.request(99) is None


def test_each_request_rings_the_next_bell_so_rank_0_need_not_poll() -> None:
    store = _store()
    rank0 = Membership(store)
    assert not rank0.wait_bell(1, 0.05)  # nobody asked: the wait ends at its timeout
    Membership(store).ask(NodeInfo(2, "node2", "h", 1), "token")
    Membership(store).ask(NodeInfo(3, "node3", "h", 2), "token")
    assert rank0.wait_bell(1, 0.05)
    assert rank0.wait_bell(2, 0.05)
    assert not rank0.wait_bell(3, 0.05)


def test_a_request_proven_for_another_rank_does_not_verify() -> None:
    store = _store()
    Membership(store).ask(NodeInfo(2, "node2", "h", 1), "token")
    raw = json.loads(bytes(store.get("join/2")).decode())
    store.set("join/3", json.dumps({**raw, "rank": 3}))  # a proof copied onto another request
    request = Membership(store).request(3)
    assert request is not None
    assert not request.verify("token")


def test_a_refused_newcomer_hears_why() -> None:
    store = _store()
    Membership(store).ask(NodeInfo(2, "node2", "h", 1), None)
    request = Membership(store).request(2)
    assert request is not None
    assert request.proof == ""
    Membership(store).answer(2, "wrong join token")
    with pytest.raises(actorch.JoinError, match="refused this node: wrong join token"):
        Membership(store).wait_answer(2, 1.0)


def test_a_newcomer_waiting_while_the_system_closes_is_told_so() -> None:
    store = _store()
    Membership(store).close()
    with pytest.raises(actorch.JoinError, match="shutting down"):
        Membership(store).wait_answer(2, 5.0)
    with pytest.raises(actorch.JoinError, match="shutting down"):
        Membership(store).wait_ready(2, 5.0)


def test_waits_without_an_answer_end_in_a_join_error() -> None:
    store = _store()
    with pytest.raises(actorch.JoinError, match="does not accept new nodes"):
        Membership(store).wait_elastic(0.1)
    with pytest.raises(actorch.JoinError, match=r"did not answer the request to join within 0\.1 s"):
        Membership(store).wait_answer(2, 0.1)
    with pytest.raises(actorch.JoinError, match="were not told of this node in time"):
        Membership(store).wait_ready(2, 0.1)


def test_joining_a_store_that_is_not_an_elastic_system_is_refused() -> None:
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 1, True, wait_for_workers=False)  # type: ignore[attr-defined]
    try:
        with pytest.raises(actorch.JoinError, match="does not accept new nodes"):
            prepare_join("127.0.0.1", port, 0.5)
    finally:
        del store


def test_joining_an_address_nothing_serves_ends_in_a_join_error() -> None:
    with (
        refused_port() as port,
        pytest.raises(actorch.JoinError, match=r"cannot reach an actorch system at 127\.0\.0\.1"),
    ):
        prepare_join("127.0.0.1", port, 0.5)


def test_serve_gives_up_on_an_address_nothing_serves_within_its_join_timeout() -> None:
    # torch's store client alone retried for 2-3 times this long; serve() keeps actorch's own deadline.
    join_timeout = 4.0
    outcome: list[BaseException] = []

    def join(port: int) -> None:
        try:
            actorch.serve(f"127.0.0.1:{port}", join_timeout=join_timeout, configure_logs=False)
        except BaseException as exc:
            outcome.append(exc)

    with refused_port() as port:
        joining = threading.Thread(target=join, args=(port,), daemon=True)
        joining.start()
        joining.join(join_timeout + 2.0)
    assert not joining.is_alive(), "serve() was still trying to join 2 s past its join_timeout"
    assert isinstance(outcome[0], actorch.JoinError), outcome
    assert "nothing answered within 4 s" in str(outcome[0])


def test_an_elastic_transport_refuses_device_maps() -> None:
    with pytest.raises(ValueError, match="no device maps"):
        ElasticRpcTransport(0, "127.0.0.1", 1, TorchRpc(device_maps={"cuda:0": "cuda:0"}), token="t")


def test_ranks_are_described_as_a_range_or_a_list() -> None:
    assert describe_ranks([0, 1, 2]) == "0..2"
    assert describe_ranks([0, 1, 4]) == "0, 1, 4"
    assert describe_ranks([]) == ""


# ---------------------------------------------------------------- run() and serve() refuse bad input


async def _never(system: actorch.ActorSystem) -> None:
    raise AssertionError("main must not run")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"transport": actorch.TorchRpc(device_maps={"cuda:0": "cuda:0"})}, "no device maps"),
        ({"world_size": 0}, "world_size must be a positive int"),
        ({"world_size": True}, "world_size must be a positive int"),
        ({"port": -1}, "port must be an int"),
        ({"port": 70000}, "port must be an int"),
    ],
)
def test_run_elastic_refuses_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        actorch.run(_never, elastic=True, configure_logs=False, **kwargs)


def test_run_elastic_refuses_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match="not under torchrun"):
        actorch.run(_never, elastic=True, configure_logs=False)


def test_an_elastic_launch_takes_the_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setenv("ACTORCH_JOIN_TOKEN", "from-the-environment")
    monkeypatch.setattr(run_module, "_launch_local", lambda *args: seen.append(args))
    actorch.run(_never, elastic=True, configure_logs=False)
    assert seen[0][1] == 1  # no world_size: the system starts with rank 0 alone
    assert seen[0][-1] == "from-the-environment"
    monkeypatch.delenv("ACTORCH_JOIN_TOKEN")
    actorch.run(_never, world_size=3, elastic=True, port=0, configure_logs=False)
    assert seen[1][1] == 3
    assert len(seen[1][-1]) >= 32  # a fresh one


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs the system's address"),
        ({"address": "nowhere"}, "host:port"),
        ({"address": "127.0.0.1:1", "name": ""}, "name must be a non-empty str"),
        ({"address": "127.0.0.1:1", "name": 3}, "name must be a non-empty str"),
        ({"address": "127.0.0.1:1", "join_timeout": 0}, "join_timeout must be a positive number"),
    ],
)
def test_serve_refuses_bad_arguments(monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], match: str) -> None:
    monkeypatch.delenv("ACTORCH_ADDRESS", raising=False)
    with pytest.raises(ValueError, match=match):
        actorch.serve(configure_logs=False, **kwargs)


def test_serve_reads_the_address_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with refused_port() as port:
        monkeypatch.setenv("ACTORCH_ADDRESS", f"127.0.0.1:{port}")
        with pytest.raises(actorch.JoinError, match="cannot reach an actorch system"):
            actorch.serve(join_timeout=0.5, configure_logs=False)


# ---------------------------------------------------------------- a static system has no joining nor leaving


async def test_a_static_system_neither_hands_out_join_env_nor_lets_nodes_leave(world: LocalWorld) -> None:
    assert not world[0].elastic
    with pytest.raises(actorch.UnsupportedError, match="only an elastic system takes new nodes"):
        world[0].join_env()
    with pytest.raises(actorch.UnsupportedError, match="join_env\\(\\) is rank 0's"):
        world[1].join_env()
    with pytest.raises(actorch.UnsupportedError, match="elastic system can leave"):
        await world[0].leave(1)
    with pytest.raises(actorch.UnsupportedError, match="elastic system can leave"):
        await world[1].leave()


# ---------------------------------------------------------------- a node that left, staged in one process


def _stage_departure(world: LocalWorld, rank: int) -> None:
    """What the others see of node ``rank`` leaving: it says it has left, then its links close."""
    for host in world._hosts:
        if host.rank != rank:
            host.peer_left(rank)
    world.kill(rank)


async def test_calls_to_a_node_that_left_end_in_actor_stopped_not_node_lost() -> None:
    async with local_world(3, stop_grace=0.2) as world:
        events = world[0].events()
        assert isinstance(await anext(events), NodeJoined)
        victim = await world[0].spawn(Victim, name="gone/victim", on=2)
        counter = await world[0].spawn(Counter, name="stays", on=1)
        pending = asyncio.ensure_future(victim.call(Victim.hang, 30))
        await asyncio.sleep(0.05)
        _stage_departure(world, 2)
        with pytest.raises(actorch.ActorStoppedError, match="node 2 left the system"):
            await pending
        with pytest.raises(actorch.ActorStoppedError, match="node 2 left the system"):
            await victim.call(Victim.get)
        assert (await victim.wait_stopped()).reason == "node_left"
        await victim.stop()  # already stopped: nothing to do
        with pytest.raises(actorch.PlacementError, match="node 2: it is leaving the system"):
            await world[0].spawn(Counter, on=2)
        assert world[0].lost_nodes == {}
        assert [ref.name for ref in await world[0].lookup_all("**")] == ["stays"]
        assert await counter.call(Counter.add) == 1
        kinds = []
        async with asyncio.timeout(2):
            async for event in events:
                kinds.append(type(event).__name__)
                if isinstance(event, NodeLeft):
                    assert event.rank == 2
                    break
        assert "NodeLost" not in kinds
        await events.aclose()


async def test_a_node_lost_without_saying_it_left_is_still_lost() -> None:
    async with local_world(3, stop_grace=0.2) as world:
        victim = await world[0].spawn(Victim, on=2)
        world.kill(2)
        with pytest.raises(actorch.NodeLostError):
            await victim.call(Victim.get)
        assert (await victim.wait_stopped()).reason == "node_lost"
        assert list(world[0].lost_nodes) == [2]


def test_node_events_reach_every_subscription() -> None:
    hub = EventHub()
    subscription = Subscription(None)
    hub.subscriptions.add(subscription)
    hub.node_joined(ME)
    hub.node_left(5, "left the system")
    assert subscription.queue.get_nowait() == NodeJoined(5, ME)
    assert subscription.queue.get_nowait() == NodeLeft(5, "left the system")


def test_actor_exit_knows_a_node_that_left() -> None:
    assert "node_left" in EXIT_REASONS
    assert not actorch.ActorExit("node_left").failed


def test_a_newcomer_whose_system_went_away_gets_a_join_error_not_torchs() -> None:
    with refused_port() as port:
        transport = ElasticRpcTransport(5, "127.0.0.1", port, TorchRpc(init_timeout=0.5), token="t")
        with pytest.raises(actorch.JoinError, match=r"could not join the system at 127\.0\.0\.1:\d+"):
            transport._init_rpc()
