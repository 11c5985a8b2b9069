"""``TorchRpc``: torch RPC's own options, checked when made, and what they answer the launch."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

import actorch
from actorch._transport.torch_rpc.options import DEVICE_MAPS_FIX_THE_WORLD, TorchRpc


def test_torch_rpc_defaults_are_tcp_with_the_lane_four_threads_and_auto_device_maps() -> None:
    options = actorch.TorchRpc()
    assert (options.tensorpipe, options.lane, options.threads, options.timeout) == ("uv", True, 4, 60.0)
    assert options.device_maps == "auto"
    assert repr(options).startswith("TorchRpc(tensorpipe='uv', lane=True")


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"tensorpipe": "ib"}, "tensorpipe must be 'uv' or 'shm', not 'ib'"),
        ({"lane": 1}, "lane must be True or False, not 1"),
        ({"lane": None}, "lane must be True or False, not None"),
        ({"threads": 0}, "threads must be an int >= 1, not 0"),
        ({"threads": 1.5}, "threads must be an int >= 1, not 1.5"),
        ({"threads": False}, "threads must be an int >= 1, not False"),
        ({"timeout": -1.0}, "timeout must be a finite number of seconds >= 0 (0: none), not -1.0"),
        ({"timeout": float("inf")}, "timeout must be a finite number of seconds >= 0"),
        ({"timeout": "60"}, "timeout must be a finite number of seconds >= 0"),
        ({"init_timeout": 0}, "init_timeout must be a positive number of seconds, not 0"),
        ({"device_maps": 3}, "device_maps must be 'auto', None or a mapping, not 3"),
        ({"device_maps": {"cuda:0": "cuda:1", "cuda:1": "cuda:1"}}, "device_maps must be one-to-one"),
    ],
)
def test_torch_rpc_refuses_a_value_it_does_not_take_naming_the_field(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(says)):
        TorchRpc(**given)


def test_torch_rpc_with_maps_of_its_own_refuses_an_elastic_world_and_auto_gives_way() -> None:
    assert TorchRpc(device_maps={"cuda:0": "cuda:0"}).refuses_elastic() is not None
    assert TorchRpc(device_maps="auto").refuses_elastic() is None
    assert TorchRpc(device_maps=None).refuses_elastic() is None


def test_torch_rpc_with_device_maps_fixes_the_world_and_without_them_lets_it_grow() -> None:
    assert TorchRpc(device_maps={"cuda:0": "cuda:0"}).fixes_world() == DEVICE_MAPS_FIX_THE_WORLD
    assert TorchRpc(device_maps=None).fixes_world() is None
    assert TorchRpc().fixes_world() is None  # "auto" on a machine without a GPU: nothing to map


def test_torch_rpc_of_a_newcomer_has_no_device_maps_and_its_own_wait() -> None:
    options = TorchRpc(tensorpipe="shm", threads=8, device_maps="auto", init_timeout=60.0)
    assert options.joining(5.0) == dataclasses.replace(options, device_maps=None, init_timeout=5.0)
    assert options.joining().init_timeout == 60.0


def test_torch_rpc_from_json_refuses_a_field_it_does_not_have() -> None:
    with pytest.raises(TypeError, match="wings"):
        TorchRpc.from_json({"wings": 2})
