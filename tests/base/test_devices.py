"""Devices without a GPU: naming them, device maps, staging through an injected accelerator, actors' devices.

``meta`` tensors stand for GPU tensors, and the fake accelerator of
``mp_scripts/fake_gpus.py`` stages them (host copies full of 7s; a move to a
device adds 100).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from actors import Counter
from fake_gpus import FakeAccelerator, installed

import actorch
from actorch._base.channels.plane import DataPlane
from actorch._base.channels.route import TensorRoute
from actorch._base.codec import INLINE_TENSOR_BYTES, Codec, serializable, tensor_path
from actorch._base.devices import on_device, parse_device
from actorch._transport.autograd import NO_CONTEXT
from actorch._transport.base import Port
from actorch._transport.torch_rpc.options import TorchRpc, normalize_device_maps
from actorch._transport.torch_rpc.rpc import RpcTransport, tensorpipe_options
from actorch._transport.torch_rpc.rpc_setup import resolve_device_maps
from actorch.testing import LocalWorld, local_world


@pytest.fixture
def fake() -> Iterator[FakeAccelerator]:
    with installed(FakeAccelerator()) as accelerator:
        yield accelerator


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


# ---------------------------------------------------------------- naming devices


@pytest.mark.parametrize(
    ("value", "expected"),
    [("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:1", "cuda:1"), (2, "cuda:2"), (torch.device("cuda", 3), "cuda:3")],
)
def test_parse_device_names_cpu_and_cuda_devices_with_an_index(value: Any, expected: str) -> None:
    assert str(parse_device(value)) == expected


@pytest.mark.parametrize("value", ["gpu0", True, None, 1.5, "meta", "cuda:x"])
def test_parse_device_refuses_what_is_not_the_cpu_or_a_cuda_device(value: Any) -> None:
    with pytest.raises(ValueError, match="device"):
        parse_device(value, "the device")


# ---------------------------------------------------------------- device maps


def test_device_maps_take_one_map_for_every_pair_or_maps_per_source_and_destination() -> None:
    assert normalize_device_maps("auto") == "auto"
    assert normalize_device_maps(None) is None
    assert normalize_device_maps({}) is None
    assert normalize_device_maps({0: 1}) == {-1: {-1: {"cuda:0": "cuda:1"}}}
    assert normalize_device_maps({0: {1: {"cuda:1": torch.device("cuda", 0)}}}) == {0: {1: {"cuda:1": "cuda:0"}}}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("everywhere", "'auto', None or a mapping"),
        ({"cpu": "cuda:0"}, "CUDA devices to CUDA devices"),
        ({"cuda:0": "cuda:1", "cuda:1": "cuda:1"}, "one-to-one"),
        ({0: {0: {"cuda:0": "cuda:0"}}}, "other ranks"),
        ({-1: {1: {"cuda:0": "cuda:0"}}}, "source ranks"),
        ({0: {1: ["cuda:0"]}}, "map devices to devices"),
    ],
)
def test_malformed_device_maps_are_refused_when_run_is_called(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TorchRpc(device_maps=spec)


def test_auto_maps_every_gpu_index_all_ranks_have_when_they_share_a_host() -> None:
    maps = resolve_device_maps("auto", 1, [("cuda:0", "cuda:1"), ("cuda:0",), ("cuda:0", "cuda:1")], ["h"] * 3)
    assert maps == {0: {"cuda:0": "cuda:0"}, 2: {"cuda:0": "cuda:0"}}


@pytest.mark.parametrize(
    ("inventories", "hosts"),
    [([("cuda:0",), ()], ["h", "h"]), ([("cuda:0",), ("cuda:0",)], ["h", "other"]), ([(), ()], ["h", "h"])],
    ids=["a rank without GPU", "two hosts", "no GPU"],
)
def test_auto_maps_nothing_unless_every_rank_on_one_host_has_a_gpu(inventories: Any, hosts: list[str]) -> None:
    assert resolve_device_maps("auto", 0, inventories, hosts) == {}


def test_explicit_maps_are_this_ranks_own_and_checked_against_both_ends_inventories() -> None:
    inventories = [("cuda:0", "cuda:1"), ("cuda:0",), ()]
    spec = normalize_device_maps({0: {1: {"cuda:1": "cuda:0"}}, 1: {0: {"cuda:0": "cuda:1"}}})
    assert resolve_device_maps(spec, 0, inventories, ["h"] * 3) == {1: {"cuda:1": "cuda:0"}}
    assert resolve_device_maps(spec, 1, inventories, ["h"] * 3) == {0: {"cuda:0": "cuda:1"}}
    assert resolve_device_maps(spec, 2, inventories, ["h"] * 3) == {}
    everywhere = normalize_device_maps({"cuda:0": "cuda:0"})
    with pytest.raises(ValueError, match=r"node 2 has no cuda:0 \(it has no GPU\)"):
        resolve_device_maps(everywhere, 0, inventories, ["h"] * 3)
    with pytest.raises(ValueError, match="outside a world of 3"):
        resolve_device_maps(normalize_device_maps({0: {5: {0: 0}}}), 0, inventories, ["h"] * 3)


def test_the_maps_reach_torchs_tensorpipe_options_by_worker_name() -> None:
    backend = tensorpipe_options(TorchRpc(), {1: {"cuda:1": "cuda:0"}, 2: {"cuda:0": "cuda:0"}})
    assert backend.device_maps == {
        "node1": {torch.device("cuda", 1): torch.device("cuda", 0)},
        "node2": {torch.device("cuda", 0): torch.device("cuda", 0)},
    }
    assert tensorpipe_options(TorchRpc(), {}).device_maps == {}


def test_run_refuses_an_unknown_devices_policy_and_a_bad_map_before_starting() -> None:
    async def main(system: actorch.ActorSystem) -> None:
        raise AssertionError("must not start")

    with pytest.raises(ValueError, match="'stage' or 'strict'"):
        actorch.run(main, devices="lenient", configure_logs=False)
    with pytest.raises(ValueError, match="one-to-one"):
        actorch.run(main, transport=actorch.TorchRpc(device_maps={0: 1, 1: 1}), configure_logs=False)


# ---------------------------------------------------------------- staging in the codec


LARGE = INLINE_TENSOR_BYTES // 4 + 1
"""Elements of a float32 CPU tensor too large to ride inside a message's bytes: it takes the side list."""


@serializable(101)
@dataclasses.dataclass
class Step:
    obs: torch.Tensor
    reward: float


def test_a_tensor_no_map_covers_is_staged_through_the_host_and_moved_to_the_receivers_device(
    fake: FakeAccelerator,
) -> None:
    codec = Codec()
    on_cpu = torch.ones(LARGE)  # a small one would ride inside the bytes
    body, tensors = codec.encode([(meta(2), on_cpu), {}], route=TensorRoute(1), arguments=True)
    assert fake.staged == 1
    assert tensors[0].device.type == "cpu"
    assert tensors[1] is on_cpu
    assert fake.synced == ["meta"]  # once per device, after the copies were queued
    (staged, plain), _ = codec.decode(body, tensors, device=torch.device("cuda", 1))
    assert staged.tolist() == [107.0, 107.0]  # moved to the receiving actor's device
    assert plain is on_cpu  # a CPU tensor is not moved
    (staged, _), _ = codec.decode(body, tensors)
    assert staged.tolist() == [7.0, 7.0]  # no device: it stays on the host


def test_a_tensor_on_a_mapped_device_travels_as_it_is(fake: FakeAccelerator) -> None:
    tensor = meta(3)
    body, tensors = Codec().encode([tensor], route=TensorRoute(1, {"meta": "meta"}))
    assert tensors == [tensor]
    assert fake.staged == 0
    assert Codec().decode(body, tensors, device=torch.device("cuda", 0))[0] is tensor


def test_a_told_tensor_staged_is_a_copy_and_a_mapped_one_is_cloned(fake: FakeAccelerator) -> None:
    mapped = torch.ones(LARGE)
    _, tensors = Codec().encode([meta(2), mapped], copy_tensors=True, route=TensorRoute(1))
    assert fake.staged == 1
    assert tensors[1] is not mapped
    assert torch.equal(tensors[1], mapped)


def test_strict_refuses_with_the_tensors_path_its_device_and_the_missing_map(fake: FakeAccelerator) -> None:
    route = TensorRoute(3, {"cuda:1": "cuda:1"})
    codec = Codec(plane=DataPlane.standard(strict=True))  # devices="strict"
    with pytest.raises(actorch.SerializationError) as refused:
        codec.encode([(1, {"obs": [torch.ones(1), meta(2)]}), {}], route=route, arguments=True)
    message = str(refused.value)
    assert message.startswith("args[1]['obs'][1]: a tensor on meta cannot go to node 3")
    assert "devices mapped there: cuda:1" in message
    assert "devices='strict'" in message
    with pytest.raises(actorch.SerializationError, match=r"^kwargs\['step'\]\.obs: a tensor on meta"):
        codec.encode([(), {"step": Step(meta(1), 1.0)}], route=route, arguments=True)
    with pytest.raises(actorch.SerializationError, match=r"^value\['w'\]: a tensor on meta"):
        codec.encode({"w": meta(1)}, route=route)
    assert fake.staged == 0


def test_a_tensor_that_cannot_be_staged_is_a_serialization_error() -> None:
    with pytest.raises(actorch.SerializationError, match=r"args\[0\]: a tensor on meta cannot be staged"):
        Codec().encode([[meta(2)], {}], route=TensorRoute(1), arguments=True)


def test_tensor_path_names_a_tensor_the_walk_cannot_reach_plainly() -> None:
    hidden = torch.ones(1)
    assert tensor_path({"a": object()}, hidden) == "a tensor"
    assert tensor_path([[hidden]], hidden) == "value[0][0]"


# ---------------------------------------------------------------- a reply with device tensors


def test_a_reply_carrying_device_tensors_leaves_on_its_own_not_on_the_bundles_response() -> None:
    async def scenario() -> None:
        transport = RpcTransport(1, 2, "127.0.0.1", 1, TorchRpc())  # never started: replies are only queued
        transport._routes_direct = True  # a device map is set: replies may hold CUDA tensors
        loop = asyncio.get_running_loop()
        transport.attach(loop, lambda *a: None, lambda *a: None)
        completed: list[Any] = []
        port = Port(loop, completed.append, NO_CONTEXT)
        port.expect()
        port.expect()
        port.expect()
        transport.reply(0, port, b"on-device", [meta(1)])
        assert port.waiting == 3
        assert not port.closed
        assert transport._outgoing[0][0] == [b"on-device"]
        transport.reply(0, port, b"on-cpu", [torch.ones(1)])
        transport.reply(0, port, b"an-rref", [object()])  # the side list also holds RRefs, which have no device
        port.release()  # the bundle is dispatched
        assert port.closed
        assert completed[0][0] == [b"on-cpu", b"an-rref"]

    asyncio.run(scenario())


# ---------------------------------------------------------------- actors' devices


def test_on_device_makes_the_device_current_for_every_step(fake: FakeAccelerator) -> None:
    async def two_steps() -> str:
        await asyncio.sleep(0)
        return "done"

    async def scenario() -> None:
        assert await on_device(two_steps(), torch.device("cuda", 1)) == "done"
        assert fake.made_current == ["cuda:1", "cuda:1"]
        coroutine = two_steps()
        assert on_device(coroutine, torch.device("cpu")) is coroutine
        await coroutine

    asyncio.run(scenario())


def test_a_class_device_is_normalised_and_a_bad_one_refused() -> None:
    class OnGpu(actorch.Actor):
        device = "cuda:1"  # type: ignore[assignment]

    assert OnGpu.device == torch.device("cuda", 1)
    assert actorch.Actor.device == torch.device("cpu")
    with pytest.raises(TypeError, match=r"BadDevice\.device must be the CPU or a CUDA device"):

        class BadDevice(actorch.Actor):
            device = "meta"  # type: ignore[assignment]


class OnGpu(actorch.Actor):
    device = "cuda:1"  # type: ignore[assignment]


async def test_spawn_on_a_device_the_node_lacks_fails_naming_what_it_has(world: LocalWorld) -> None:
    nodes = world[0].nodes
    assert all(node.devices == () for node in nodes)  # this machine has no GPU
    received = world[1].statistics()["calls_received"]
    for cls, device, name in ((Counter, "cuda:0", "missing/a"), (OnGpu, None, "missing/b")):
        with pytest.raises(actorch.PlacementError) as missing:
            await world[0].spawn(cls, on=1, device=device, name=name)
        assert type(missing.value) is actorch.PlacementError  # refused by the caller, not an actor's RemoteError
        assert str(missing.value) == f"cannot place {cls.__qualname__} on {device or 'cuda:1'}: node 1 has no GPU"
        assert await world[0].lookup_all("missing/*") == []  # the name was never held
    assert world[1].statistics()["calls_received"] == received  # nothing was sent to node 1
    with pytest.raises(ValueError, match="must be a device"):
        await world[0].spawn(Counter, device="gpu0")
    counter = await world[0].spawn(Counter, device="cpu")
    assert await counter.call(Counter.add, 2) == 2


class Placed(actorch.Actor):
    def __init__(self) -> None:
        self.built_on = str(self.device)

    async def where(self) -> tuple[str, str]:
        await asyncio.sleep(0)
        return self.built_on, str(self.device)


async def test_an_actor_spawned_on_a_gpu_sees_it_from_init_and_runs_with_it_current(fake: FakeAccelerator) -> None:
    async with local_world(2, stop_grace=0.5) as world:
        assert world[0].nodes[1].devices == ("cuda:0", "cuda:1")
        placed = await world[0].spawn(Placed, on=1, device="cuda:1")
        fake.made_current.clear()
        assert await placed.call(Placed.where) == ("cuda:1", "cuda:1")
        assert fake.made_current == ["cuda:1", "cuda:1"]  # both steps of the handler
        plain = await world[0].spawn(Placed, on=1)
        fake.made_current.clear()
        assert await plain.call(Placed.where) == ("cpu", "cpu")
        assert fake.made_current == []
