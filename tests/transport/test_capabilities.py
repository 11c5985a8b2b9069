"""What only some transports can do: each transport has the capabilities it implements, and asking one lacks raises."""

from __future__ import annotations

import pytest

import actorch
from actorch._transport.capabilities import (
    NO_NEWCOMERS,
    NO_RREFS,
    NO_SHARED_STORE,
    NOT_ELASTIC,
    Elastic,
    FastLane,
    Severable,
    SharedLinks,
    TorchInterop,
    elastic_of,
    fast_lane_of,
    is_elastic,
    layers,
    require_elastic,
    require_torch_interop,
    severable_of,
)
from actorch._transport.faulty import FaultInjection, FaultyTransport
from actorch._transport.inprocess import InProcess, InProcessHub
from actorch._transport.lane.transport import LaneTransport
from actorch._transport.torch_rpc.elastic import ElasticRpcTransport
from actorch._transport.torch_rpc.lone import LoneTransport
from actorch._transport.torch_rpc.options import TorchRpc
from actorch._transport.torch_rpc.rpc import RpcTransport


def _never_opened() -> ElasticRpcTransport:
    pytest.fail("opened without being asked")


def test_capabilities_of_each_transport_are_those_it_implements() -> None:
    in_process = InProcessHub(2).transport(0)
    static = RpcTransport(0, 2, "127.0.0.1", 1, TorchRpc())
    elastic = ElasticRpcTransport(0, "127.0.0.1", 1, TorchRpc(), token="t")
    alone = LoneTransport(_never_opened)
    lane = LaneTransport(RpcTransport(0, 2, "127.0.0.1", 1, TorchRpc()), liveness_timeout=2.5)
    faulty = FaultInjection(InProcessHub(2).transport(0), FaultyTransport(InProcess()), liveness_timeout=2.5)
    kinds = (Elastic, TorchInterop, FastLane, SharedLinks, Severable)
    found = {
        type(transport).__name__: [kind.__name__ for kind in kinds if isinstance(transport, kind)]
        for transport in (in_process, static, elastic, alone, lane, faulty)
    }
    assert found == {
        "InProcessTransport": [],
        "RpcTransport": ["TorchInterop", "SharedLinks", "Severable"],
        "ElasticRpcTransport": ["Elastic", "TorchInterop", "SharedLinks", "Severable"],
        "LoneTransport": ["Elastic", "TorchInterop"],
        "LaneTransport": ["FastLane", "Severable"],
        "FaultInjection": [],
    }


def test_capabilities_are_found_through_the_layers_a_wrapper_wraps() -> None:
    elastic = ElasticRpcTransport(0, "127.0.0.1", 1, TorchRpc(), token="t")
    lane = LaneTransport(elastic, liveness_timeout=2.5)
    faulty = FaultInjection(lane, FaultyTransport(TorchRpc()), liveness_timeout=2.5)
    assert list(layers(faulty)) == [faulty, lane, elastic]
    assert elastic_of(faulty) is elastic
    assert fast_lane_of(faulty) is lane
    assert severable_of(faulty) is lane  # it cuts the lane off too, and hands the cut to the transport it wraps
    assert require_elastic(faulty) is elastic
    assert require_torch_interop(faulty) is elastic
    assert is_elastic(faulty)
    in_process = InProcessHub(1).transport(0)
    assert elastic_of(in_process) is None
    assert severable_of(FaultInjection(in_process, FaultyTransport(InProcess()), liveness_timeout=1.0)) is None


def test_capabilities_of_a_lone_node_are_looked_for_in_its_world_once_it_opens() -> None:
    alone = LoneTransport(_never_opened)
    assert alone.inner is None
    assert severable_of(alone) is None


def test_capabilities_is_elastic_only_for_a_world_any_process_with_the_token_may_join() -> None:
    assert is_elastic(ElasticRpcTransport(0, "127.0.0.1", 1, TorchRpc(), token="t"))
    assert not is_elastic(ElasticRpcTransport(0, "127.0.0.1", 1, TorchRpc(), token="t", public=False))
    assert not is_elastic(LoneTransport(_never_opened))
    assert not is_elastic(RpcTransport(0, 2, "127.0.0.1", 1, TorchRpc()))


def test_capabilities_required_of_a_transport_that_has_them_are_the_transport() -> None:
    elastic = ElasticRpcTransport(0, "127.0.0.1", 1, TorchRpc(), token="t")
    assert require_elastic(elastic) is elastic
    assert require_torch_interop(elastic) is elastic


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (NO_NEWCOMERS, "a world on InProcessTransport takes no new nodes"),
        (NOT_ELASTIC, "only an elastic system takes new nodes"),
    ],
)
def test_capabilities_elastic_required_of_a_static_world_is_refused_naming_it(message: str, expected: str) -> None:
    with pytest.raises(actorch.UnsupportedError, match=expected):
        require_elastic(InProcessHub(1).transport(0), message)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (NO_RREFS, "torch RRefs need the torch RPC transport; this node runs on InProcessTransport"),
        (NO_SHARED_STORE, "a store shared by the nodes needs the torch RPC transport; this node runs on InProcess"),
    ],
)
def test_capabilities_torch_interop_required_off_torch_rpc_is_refused_naming_the_transport(
    message: str, expected: str
) -> None:
    with pytest.raises(actorch.UnsupportedError, match=expected):
        require_torch_interop(InProcessHub(1).transport(0), message)


async def test_capabilities_of_a_lone_node_before_its_world_opens_are_refused() -> None:
    alone = LoneTransport(_never_opened)
    with pytest.raises(actorch.UnsupportedError, match="only an elastic system takes new nodes"):
        alone.join_env()
    with pytest.raises(actorch.UnsupportedError, match=r"torch RRefs need .* runs on LoneTransport"):
        alone.make_rref(1)
    with pytest.raises(actorch.UnsupportedError, match=r"store shared by the nodes .* runs on LoneTransport"):
        alone.shared_store()


def test_hooks_set_on_a_wrapper_at_any_time_are_the_wrapped_transports() -> None:
    inner = RpcTransport(0, 2, "127.0.0.1", 1, TorchRpc())
    faulty = FaultInjection(
        LaneTransport(inner, liveness_timeout=2.5), FaultyTransport(TorchRpc()), liveness_timeout=2.5
    )

    def answer(question: str) -> str:
        return question

    faulty.off_loop = answer  # as a launch does once its node has started
    faulty.lost_in_thread = print
    assert inner.off_loop is answer
    assert inner.lost_in_thread is print
    assert faulty.off_loop is answer


def test_a_lane_cut_off_from_a_peer_cuts_the_transport_it_wraps_and_no_longer_hears_the_peer() -> None:
    inner = RpcTransport(0, 3, "127.0.0.1", 1, TorchRpc())
    lane = LaneTransport(inner, liveness_timeout=2.5)
    told: list[tuple[int, str]] = []
    inner.lose = lambda rank, why: told.append((rank, why))  # type: ignore[method-assign]
    lane.sever({2})
    assert inner._severed == {2}
    lane._lane_lost(2, "node 2 counts this node lost (it was silent too long)")  # its word cannot cross the cut
    lane._lane_lost(1, "fast lane closed (the peer closed it)")
    assert told == [(1, "fast lane closed (the peer closed it)")]
    lane.heal({2})
    assert inner._severed == set()
    lane._lane_lost(2, "fast lane closed (the peer closed it)")
    assert told[-1] == (2, "fast lane closed (the peer closed it)")
