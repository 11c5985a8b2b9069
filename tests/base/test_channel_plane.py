"""The data plane: which channel a tensor takes, what the system may leave out, empty tensors as metadata."""

from __future__ import annotations

import importlib
import pkgutil

import msgpack  # noqa: TID251 - the test forges channel payloads the codec would make
import pytest
import torch
from tensor_cases import DTYPES, bits

from actorch import SerializationError
from actorch._base import channels
from actorch._base.channels.base import CHANNEL_CODES, Channel
from actorch._base.channels.plane import OPTIONAL, DataPlane, check_channels
from actorch._base.channels.route import TensorRoute
from actorch._base.channels.segments import SegmentPool
from actorch._base.channels.shm import SharedMemoryChannel
from actorch._base.codec import Codec

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

ROUTE = TensorRoute(1)


def channel_classes() -> dict[str, list[type[Channel]]]:
    """The ``Channel`` subclasses of every module of ``_base/channels/``, by module."""
    found: dict[str, list[type[Channel]]] = {}
    for module in pkgutil.iter_modules(channels.__path__, f"{channels.__name__}."):
        loaded = importlib.import_module(module.name)
        classes = [value for value in vars(loaded).values() if isinstance(value, type) and issubclass(value, Channel)]
        found[module.name] = [cls for cls in classes if cls is not Channel and cls.__module__ == module.name]
    return {module: classes for module, classes in found.items() if classes}


def test_each_channel_is_a_module_of_its_own_with_its_code_in_the_table() -> None:
    found = channel_classes()
    assert all(len(classes) == 1 for classes in found.values()), found
    assert sorted(classes[0].name for classes in found.values()) == sorted(CHANNEL_CODES)
    always = DataPlane.standard(()).names  # a channel is always in the plane, or one a system may choose
    assert sorted((*always, *OPTIONAL)) == sorted(CHANNEL_CODES)


def test_the_plane_tries_channels_in_the_documented_order() -> None:
    shm = SharedMemoryChannel(SegmentPool(1 << 20))
    assert DataPlane.standard(shm=shm).names == ("metadata", "inline", "shm", "device_map", "staged", "transport")
    assert DataPlane.standard(("staged",), shm=shm).names == ("metadata", "inline", "staged", "transport")
    assert DataPlane.standard(()).names == ("metadata", "inline", "transport"), "those are always there"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), (["staged"], ("staged",)), (("staged", "shm"), ("shm", "staged")), ([], ())],
)
def test_check_channels_takes_a_collection_of_optional_names(value: object, expected: object) -> None:
    assert check_channels(value) == expected


@pytest.mark.parametrize("value", ["staged", ["nvlink"], ["inline"], 3])
def test_check_channels_refuses_anything_else_naming_the_choices(value: object) -> None:
    with pytest.raises(ValueError, match="channel") as refused:
        check_channels(value)
    assert all(name in str(refused.value) for name in OPTIONAL) or "unknown channel" in str(refused.value)


def test_a_plane_whose_channels_share_a_code_is_refused() -> None:
    shm = SharedMemoryChannel(SegmentPool(1 << 20))
    with pytest.raises(ValueError, match="share code"):
        DataPlane([shm, shm])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_empty_tensor_of_any_dtype_travels_as_metadata(dtype: torch.dtype) -> None:
    codec = Codec(plane=DataPlane.standard())
    sent = torch.empty(3, 0, 4, dtype=dtype).transpose(0, 2)
    body, side = codec.encode([sent], route=ROUTE)
    assert side == []
    [received] = codec.decode(body, side)
    assert (received.shape, received.stride(), received.dtype, received.device) == (
        sent.shape,
        sent.stride(),
        sent.dtype,
        sent.device,
    )
    assert codec.plane.statistics()["metadata"]["tensors"] == 1


def test_an_empty_device_tensor_lands_where_its_map_says_else_on_the_receivers_device() -> None:
    # A meta tensor stands for a GPU one: off the CPU, with no memory (nothing to copy, as for an empty one).
    codec = Codec()
    empty = torch.empty(0, 5, device="meta")
    body, side = codec.encode([empty], route=TensorRoute(1, {"meta": "cpu"}))
    assert codec.decode(body, side, device=torch.device("meta"))[0].device.type == "cpu", "the map's target"
    body, side = codec.encode([empty], route=TensorRoute(1))
    assert codec.decode(body, side, device=torch.device("meta"))[0].device.type == "meta", "the receiver's device"
    assert codec.decode(body, side)[0].device.type == "cpu", "a receiver without a device: the CPU"


def test_an_empty_cpu_tensor_that_requires_grad_keeps_the_transports_path() -> None:
    codec = Codec(plane=DataPlane.standard())
    sent = torch.zeros(0, requires_grad=True)
    _, side = codec.encode([sent], route=ROUTE)
    assert len(side) == 1
    assert codec.plane.statistics()["transport"]["tensors"] == 1


def test_an_empty_device_tensor_that_requires_grad_arrives_requiring_grad() -> None:
    codec = Codec()
    body, side = codec.encode([torch.empty(0, device="meta", requires_grad=True)], route=ROUTE)
    assert codec.decode(body, side)[0].requires_grad


def test_a_gpu_tensor_no_allowed_channel_carries_is_refused_naming_it_and_the_fix() -> None:
    codec = Codec(plane=DataPlane.standard(()))
    with pytest.raises(SerializationError) as refused:
        codec.encode([(torch.ones(1), {"w": torch.ones(2, device="meta")}), {}], route=ROUTE, arguments=True)
    message = str(refused.value)
    assert message.startswith("args[1]['w']: no channel this system uses (metadata, inline, transport)")
    assert "add 'staged' to run(channels=...)" in message


def test_a_payload_of_a_channel_this_node_lacks_is_refused_by_name() -> None:
    data = msgpack.packb([msgpack.ExtType(CHANNEL_CODES["shm"], msgpack.packb(["x"]))])
    with pytest.raises(SerializationError, match="arrived on channel shm, which this node does not use"):
        Codec().decode(data, [])


@pytest.mark.parametrize(
    "payload",
    [
        ["float32"],
        ["no-such-dtype", [0], [1], None, False],
        ["float32", [0, -1], [1, 1], None, False],
        ["float32", [2, 3], [3, 1], None, False],
        ["float32", [0], [1, 2], None, False],
        ["float32", [0], [1], "cuda:99", False],
    ],
)
def test_malformed_metadata_is_a_serialization_error(payload: list[object]) -> None:
    data = msgpack.packb([msgpack.ExtType(CHANNEL_CODES["metadata"], msgpack.packb(payload))])
    with pytest.raises(SerializationError):
        Codec().decode(data, [])


def test_a_side_index_out_of_range_is_a_serialization_error() -> None:
    data = msgpack.packb([msgpack.ExtType(CHANNEL_CODES["transport"], msgpack.packb(3))])
    with pytest.raises(SerializationError, match="names tensor 3 of 0"):
        Codec().decode(data, [])


def test_the_plane_counts_tensors_and_bytes_by_channel_and_by_destination() -> None:
    codec = Codec(plane=DataPlane.standard())
    small, large = torch.ones(4), torch.ones(40_000)
    codec.encode([small, large, torch.empty(0)], route=TensorRoute(7))
    counts = codec.plane.statistics()
    assert counts["inline"] == {"tensors": 1, "bytes": small.nbytes}
    assert counts["transport"] == {"tensors": 1, "bytes": large.nbytes}
    assert counts["metadata"] == {"tensors": 1, "bytes": 0}
    assert codec.plane.sent_to == {7: large.nbytes}, "bytes apart from the message, by destination"
    assert bits(codec.decode(*codec.encode([large], route=ROUTE))[0]) == bits(large)
