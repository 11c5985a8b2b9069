"""Opening a transport: one function for every launch path, a table of kinds, and the transport each spec opens."""

from __future__ import annotations

import socket

import pytest

from actorch._transport.base import NodeTraits, TransportSpec
from actorch._transport.capabilities import is_elastic
from actorch._transport.opening import DEFAULT_KIND, KINDS, open_transport
from actorch._transport.torch_rpc.elastic import ElasticRpcTransport
from actorch._transport.torch_rpc.lone import LoneTransport
from actorch._transport.torch_rpc.plugin import open_torch_rpc
from actorch._transport.torch_rpc.rpc import RpcTransport
from actorch._transport.torch_rpc.rpc_setup import RpcOptions


def test_open_transport_opens_a_static_world_without_a_token() -> None:
    traits = NodeTraits(label="learner")
    transport = open_transport(TransportSpec(1, 3, "127.0.0.1", 1, RpcOptions(), traits=traits))
    assert type(transport) is RpcTransport
    assert (transport.rank, transport.world_size, transport.traits) == (1, 3, traits)


def test_open_transport_opens_an_elastic_world_with_a_token_public_or_private() -> None:
    spec = TransportSpec(0, 3, "127.0.0.1", 1, RpcOptions(device_maps="auto"), token="t", initial=3)
    public = open_transport(spec)
    assert isinstance(public, ElasticRpcTransport)
    assert is_elastic(public)
    assert public._options.device_maps == "auto"
    private = open_transport(TransportSpec(0, 3, "127.0.0.1", 1, RpcOptions(), token="t", public=False))
    assert isinstance(private, ElasticRpcTransport)
    assert not is_elastic(private)
    assert private._options.device_maps is None  # a private world has no device maps


def test_open_transport_gives_a_newcomer_its_label() -> None:
    spec = TransportSpec(4, 0, "127.0.0.1", 1, RpcOptions(), label="env", token="t", invited=True)
    transport = open_transport(spec)
    assert transport.traits.label == "env"


async def test_open_transport_opens_a_lone_node_whose_world_opens_on_a_port_of_its_own() -> None:
    traits = NodeTraits(pool=True)
    alone = open_transport(TransportSpec(0, 1, "127.0.0.1", 0, RpcOptions(), traits=traits, alone=True))
    assert isinstance(alone, LoneTransport)
    assert alone.traits == traits
    world = alone._opener()  # what its first invitation opens (not started here)
    try:
        assert isinstance(world, ElasticRpcTransport)
        assert not is_elastic(world)  # only the node processes it starts may join
        assert world._listener is not None
        assert world._master[1] == world._listener.getsockname()[1] != 0
    finally:
        assert isinstance(world._listener, socket.socket)
        world._listener.close()


def test_open_transport_refuses_a_kind_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="no transport of kind 'carrier-pigeon' \\(there are: torch_rpc\\)"):
        open_transport(TransportSpec(0, 1, "127.0.0.1", 1, RpcOptions()), "carrier-pigeon")


def test_open_transport_refuses_options_of_another_kind() -> None:
    with pytest.raises(TypeError, match="a torch RPC transport takes RpcOptions, not"):
        open_transport(TransportSpec(0, 1, "127.0.0.1", 1, {"transport": "uv"}))


def test_open_transport_opens_torch_rpc_by_default() -> None:
    assert KINDS[DEFAULT_KIND] is open_torch_rpc
