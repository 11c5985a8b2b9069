"""The table of kinds: one function opens any kind from a world spec and its options; records travel as json.

It also holds what docs/architecture.md says a new kind takes: one module
(or package) of ``_transport`` that nothing else in actorch imports but the
table and the public modules, one line of ``KINDS``, and a world of its own in
the conformance suite.
"""

from __future__ import annotations

import ast
import json
import pickle
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from conformance import KINDS as CONFORMANCE_WORLDS
from test_conformance import WORLDS

import actorch
from actorch._transport import kinds
from actorch._transport.base import NodeTraits
from actorch._transport.capabilities import elastic_of, fast_lane_of, is_elastic
from actorch._transport.faulty import Delay, Drop, FaultInjection, FaultyTransport, Partition
from actorch._transport.inprocess import InProcess, InProcessHub, InProcessTransport
from actorch._transport.kinds import (
    DEFAULT_KIND,
    KINDS,
    kind_named,
    kind_of,
    open_transport,
    options_from_json,
    options_to_json,
    prepare_join,
)
from actorch._transport.lane.transport import LaneTransport
from actorch._transport.torch_rpc.elastic import ElasticRpcTransport
from actorch._transport.torch_rpc.lone import LoneTransport
from actorch._transport.torch_rpc.options import TorchRpc
from actorch._transport.torch_rpc.rpc import RpcTransport
from actorch._transport.world import WorldSpec

NO_LANE = TorchRpc(lane=False)


def test_kinds_table_names_each_kind_once_with_its_own_options_record() -> None:
    assert [kind.name for kind in KINDS] == ["torch_rpc", "in_process", "faulty"]
    assert len({kind.options for kind in KINDS}) == len(KINDS)
    assert DEFAULT_KIND is kind_named("torch_rpc")
    assert kinds.default_options() == TorchRpc()


def test_kinds_find_a_kind_by_its_options_record_and_refuse_what_is_none() -> None:
    assert kind_of(TorchRpc()).name == "torch_rpc"
    assert kind_of(InProcess()).name == "in_process"
    assert kind_of(FaultyTransport(InProcess())).name == "faulty"
    with pytest.raises(TypeError, match=r"transport= takes a transport kind's options record \(TorchRpc\(...\), "):
        kind_of({"transport": "uv"})
    with pytest.raises(ValueError, match="no transport of kind 'carrier-pigeon' \\(there are: faulty, in_process, "):
        kind_named("carrier-pigeon")


def test_open_transport_opens_a_static_torch_rpc_world_without_a_token_the_lane_beside_it() -> None:
    traits = NodeTraits(label="learner")
    transport = open_transport(WorldSpec(1, 3, "127.0.0.1", 1, traits=traits, liveness_timeout=4.0), TorchRpc())
    assert isinstance(transport, LaneTransport)
    assert type(transport.inner) is RpcTransport
    assert fast_lane_of(transport) is transport
    assert (transport.rank, transport.world_size, transport.traits) == (1, 3, traits)
    assert transport.inner._liveness_timeout == 4.0
    bare = open_transport(WorldSpec(1, 3, "127.0.0.1", 1), NO_LANE)
    assert type(bare) is RpcTransport
    assert fast_lane_of(bare) is None


def test_open_transport_opens_an_elastic_world_with_a_token_public_or_private() -> None:
    spec = WorldSpec(0, 3, "127.0.0.1", 1, token="t", initial=3)
    public = open_transport(spec, TorchRpc(device_maps="auto", lane=False))
    assert isinstance(public, ElasticRpcTransport)
    assert is_elastic(public)
    assert public._options.device_maps == "auto"
    private = open_transport(WorldSpec(0, 3, "127.0.0.1", 1, token="t", public=False), TorchRpc())
    found = elastic_of(private)
    assert isinstance(private, LaneTransport)
    assert isinstance(found, ElasticRpcTransport)
    assert not is_elastic(private)
    assert found._options.device_maps is None  # a private world has no device maps


def test_open_transport_gives_a_newcomer_its_label() -> None:
    spec = WorldSpec(4, 0, "127.0.0.1", 1, label="env", token="t", invited=True)
    transport = open_transport(spec, NO_LANE)
    assert transport.traits.label == "env"


async def test_open_transport_opens_a_lone_node_whose_world_opens_on_a_port_of_its_own() -> None:
    traits = NodeTraits(pool=True)
    alone = open_transport(WorldSpec(0, 1, "127.0.0.1", 0, traits=traits, alone=True), TorchRpc())
    assert isinstance(alone, LoneTransport)
    assert alone.traits == traits
    world = alone._opener()  # what its first invitation opens (not started here)
    elastic = elastic_of(world)
    try:
        assert isinstance(world, LaneTransport)
        assert isinstance(elastic, ElasticRpcTransport)
        assert not is_elastic(world)  # only the node processes it starts may join
        assert elastic._listener is not None
        assert elastic._master[1] == elastic._listener.getsockname()[1] != 0
    finally:
        assert elastic is not None
        assert isinstance(elastic._listener, socket.socket)
        elastic._listener.close()


def test_open_transport_opens_an_in_process_rank_on_its_hub_and_nowhere_else() -> None:
    hub = InProcessHub(2)
    transport = open_transport(WorldSpec(1, 2, hub.address, 0), InProcess())
    assert isinstance(transport, InProcessTransport)
    assert hub.transports[1] is transport
    with pytest.raises(ValueError, match=r"open it with actorch\.testing\.local_world"):
        open_transport(WorldSpec(0, 2, "127.0.0.1", 0), InProcess())


def test_open_transport_opens_a_wrapping_kind_over_the_kind_it_wraps() -> None:
    hub = InProcessHub(2)
    faulty = open_transport(WorldSpec(0, 2, hub.address, 0, liveness_timeout=1.5), FaultyTransport(InProcess()))
    assert isinstance(faulty, FaultInjection)
    assert isinstance(faulty.inner, InProcessTransport)
    assert faulty._liveness_timeout == 1.5
    over_rpc = open_transport(WorldSpec(0, 2, "127.0.0.1", 1), FaultyTransport(TorchRpc()))
    assert isinstance(over_rpc, FaultInjection)
    assert isinstance(over_rpc.inner, LaneTransport)


def test_each_kind_refuses_options_of_another() -> None:
    torch_rpc, in_process = kind_named("torch_rpc"), kind_named("in_process")
    with pytest.raises(TypeError, match="a torch RPC transport takes TorchRpc options, not"):
        torch_rpc.open(WorldSpec(0, 1, "127.0.0.1", 1), InProcess(), None)
    with pytest.raises(TypeError, match="an in-process transport takes InProcess options, not"):
        in_process.open(WorldSpec(0, 1, "in-process:0", 1), TorchRpc(), None)


RECORDS = [
    TorchRpc(tensorpipe="shm", lane=False, threads=8, timeout=0, init_timeout=5.0, device_maps=None),
    InProcess(),
    FaultyTransport(
        TorchRpc(device_maps=None),
        Drop(0.25, src=1, start=1.0, stop=2.0),
        Delay(0.01, jitter=0.02, dst=0),
        Partition([2, 3], start=5.0),
        seed=11,
        epoch=1700000000.5,
    ),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda record: type(record).__name__)
def test_an_options_record_travels_as_json_and_as_a_pickle_and_comes_back_the_same(record: object) -> None:
    data = json.loads(json.dumps(options_to_json(record)))
    assert data["kind"] == kind_of(record).name
    assert options_from_json(data) == record
    assert pickle.loads(pickle.dumps(record)) == record


def test_torch_rpc_options_travel_as_json_without_their_device_maps() -> None:
    back = options_from_json(options_to_json(TorchRpc(device_maps={"cuda:0": "cuda:1"})))
    assert back == TorchRpc(device_maps=None)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "torch_rpc"}, "not a transport's options"),
        ({"kind": "pigeon", "options": {}}, "no transport of kind 'pigeon'"),
        ({"kind": "torch_rpc", "options": {"wings": 2}}, "not torch_rpc's options"),
        ({"kind": "torch_rpc", "options": {"tensorpipe": "ib"}}, "tensorpipe must be 'uv' or 'shm'"),
        (
            {"kind": "faulty", "options": {"inner": options_to_json(InProcess()), "faults": [{"fault": "flood"}]}},
            "flood",
        ),
    ],
)
def test_options_from_json_refuses_what_is_no_kinds_options(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        options_from_json(data)


def test_prepare_join_goes_through_the_kind_a_wrapping_kind_wraps_and_refuses_one_that_takes_nobody() -> None:
    with pytest.raises(actorch.UnsupportedError, match="a world on in_process takes no process that joins it"):
        prepare_join("127.0.0.1", 1, 0.1, options=FaultyTransport(InProcess()))


def test_running_and_at_exit_ask_every_kind() -> None:
    assert not kinds.running()
    kinds.at_exit()  # nothing runs: nothing to take down, and it returns


def test_each_kind_is_the_kind_record_of_one_module_and_one_line_of_the_table() -> None:
    source = Path(kinds.__file__).read_text()
    table = source[source.index("KINDS: tuple") : source.index('"""Every kind of transport')]
    lines = [line.strip() for line in table.splitlines()[1:-1]]
    assert len(lines) == len(KINDS)
    for kind, line in zip(KINDS, lines, strict=True):
        home = sys.modules[kind.open.__module__]
        assert home.KIND is kind  # type: ignore[attr-defined]
        assert line.endswith(".KIND,")


PACKAGE = Path(__file__).resolve().parents[2] / "actorch"
PUBLIC = frozenset({"actorch", "actorch.testing"})
"""The modules that may name a kind's own besides the table: they export its options record to users."""


def home_of(kind: Any) -> str:
    """The module or package of ``_transport`` that a kind is (``actorch._transport.torch_rpc``)."""
    return ".".join(kind.open.__module__.split(".")[:3])


def imports_of_the_package() -> dict[str, set[str]]:
    """Every module of actorch, by name, with the modules it imports (at any depth, absolute imports)."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        found[module] = imported
    return found


def within(name: str, home: str) -> bool:
    return name == home or name.startswith(home + ".")


def test_no_module_but_the_table_and_the_public_ones_imports_a_kinds_own() -> None:
    homes = {home_of(kind) for kind in KINDS}
    assert homes >= {"actorch._transport.torch_rpc", "actorch._transport.inprocess", "actorch._transport.faulty"}
    importers: dict[str, set[str]] = {home: set() for home in homes}
    for module, imported in imports_of_the_package().items():
        for home in homes:
            if not within(module, home) and any(within(name, home) for name in imported):
                importers[home].add(module)
    for home, found in importers.items():
        assert "actorch._transport.kinds" in found, home
        assert found - PUBLIC == {"actorch._transport.kinds"}, home


def test_the_conformance_suite_runs_a_world_of_every_kind_of_the_table() -> None:
    assert {param.values[0] for param in WORLDS} == set(CONFORMANCE_WORLDS)
    assert {kind_of(record).name for record in CONFORMANCE_WORLDS.values()} == {kind.name for kind in KINDS}
