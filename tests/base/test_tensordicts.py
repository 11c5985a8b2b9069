"""TensorDicts in the codec: what they keep, where their tensors go, and the receiver without tensordict."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from actorch import SerializationError
from actorch._base.channels.route import TensorRoute
from actorch._base.codec import INLINE_TENSOR_BYTES, Codec
from actorch.rl import Batch

tensordict = pytest.importorskip("tensordict")
TensorDict = tensordict.TensorDict

ROUTE = TensorRoute(1)  # bound for another process: small tensors inlined, the rest on the side list
ROUTES = [pytest.param(None, id="same-process"), pytest.param(ROUTE, id="another-process")]
DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


def round_trip(value: Any, route: TensorRoute | None = ROUTE, *, strict: bool = True) -> Any:
    codec = Codec(strict=strict)
    data, side = codec.encode(value, route=route)
    return codec.decode(data, side)


def rollout() -> Any:
    """A TensorDict in TorchRL's layout: nested ``next``, a large tensor, a non-tensor entry."""
    td = TensorDict(
        {
            "observation": torch.arange(24, dtype=torch.uint8).view(2, 3, 4),
            "pixels": torch.rand(2, 3, 64, 64),  # 96 KiB: past what is inlined
            "next": TensorDict({"reward": torch.ones(2, 3, 1), "done": torch.zeros(2, 3, 1, dtype=torch.bool)}, [2, 3]),
        },
        batch_size=[2, 3],
        device="cpu",
    )
    td.set_non_tensor("env", "CartPole-v1")
    return td


def assert_same(arrived: Any, sent: Any) -> None:
    """Same class, batch size, device, names, lock, keys in order, and every tensor bitwise."""
    assert type(arrived) is type(sent)
    assert arrived.batch_size == sent.batch_size
    assert arrived.device == sent.device
    assert arrived.names == sent.names
    assert arrived.is_locked == sent.is_locked
    assert list(arrived.keys()) == list(sent.keys())
    for key, value in sent.items():
        if isinstance(value, torch.Tensor):
            assert arrived[key].dtype == value.dtype, key
            assert torch.equal(arrived[key], value), key
        elif type(value) is TensorDict:
            assert_same(arrived[key], value)
        else:
            assert arrived[key] == sent[key], key


@pytest.mark.parametrize("route", ROUTES)
def test_tensordict_round_trips_with_batch_size_device_nesting_and_entries(route: TensorRoute | None) -> None:
    sent = rollout()
    arrived = round_trip(sent, route)
    assert_same(arrived, sent)
    assert arrived["next"].batch_size == (2, 3)
    assert arrived["env"] == "CartPole-v1"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", [3, INLINE_TENSOR_BYTES], ids=["inlined", "side"])
def test_tensordict_keeps_the_dtype_of_each_tensor(dtype: torch.dtype, size: int) -> None:
    sent = TensorDict({"x": torch.ones(2, size).to(dtype), "y": torch.zeros(2, dtype=dtype)}, batch_size=[2])
    assert_same(round_trip(sent), sent)


def test_tensordict_without_a_device_arrives_without_one() -> None:
    sent = TensorDict({"x": torch.ones(3)}, batch_size=[3])
    assert round_trip(sent).device is None


def test_tensordict_of_zero_size_and_an_empty_one_round_trip() -> None:
    zero = TensorDict({"obs": torch.empty(0, 4), "next": TensorDict({"r": torch.empty(0)}, [0])}, batch_size=[0])
    assert_same(round_trip(zero), zero)
    empty = TensorDict()
    assert_same(round_trip(empty), empty)


@pytest.mark.parametrize("locked", [False, True])
def test_tensordict_keeps_its_lock(locked: bool) -> None:
    sent = rollout()
    if locked:
        sent.lock_()
    arrived = round_trip(sent)
    assert arrived.is_locked is locked
    assert arrived["next"].is_locked is locked


def test_tensordict_keeps_a_nested_lock_under_an_unlocked_parent() -> None:
    sent = TensorDict({"inner": TensorDict({"x": torch.ones(2)}, [2]).lock_()}, batch_size=[2])
    arrived = round_trip(sent)
    assert not arrived.is_locked
    assert arrived["inner"].is_locked


def test_tensordict_keeps_its_dimension_names() -> None:
    sent = TensorDict({"x": torch.ones(2, 3)}, batch_size=[2, 3], names=["env", "time"])
    sent.set("inner", TensorDict({"y": torch.ones(2, 3, 5)}, batch_size=[2, 3, 5]))
    arrived = round_trip(sent)
    assert arrived.names == ["env", "time"]
    assert arrived["inner"].names == ["env", "time", None]


def test_tensordict_travels_inside_other_values() -> None:
    sent = rollout()
    arrived = round_trip([(sent, 1), {"batch": sent}])
    assert_same(arrived[0][0], sent)
    assert_same(arrived[1]["batch"], sent)


def test_tensordict_sends_its_tensors_on_the_tensor_path_never_through_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("pickled")

    monkeypatch.setattr(pickle, "dumps", refuse)
    sent = rollout()
    codec = Codec(strict=True)  # strict: nothing may be pickled
    data, side = codec.encode(sent, route=ROUTE)
    assert len(side) == 1
    assert side[0] is sent["pixels"], "the large tensor goes on the side list as it is, for torch RPC to send"
    assert len(data) < 1024, "its bytes stay out of the message"
    assert torch.equal(codec.decode(data, side)["pixels"], sent["pixels"])


def test_tensordict_sent_by_a_tell_sends_copies_of_its_tensors() -> None:
    sent = rollout()
    data, side = Codec().encode(sent, route=ROUTE, copy_tensors=True)
    sent["pixels"].zero_()
    assert Codec().decode(data, side)["pixels"].sum() > 0


def test_tensordict_non_tensor_entry_the_strict_codec_refuses_is_named() -> None:
    sent = TensorDict(batch_size=[2])
    sent.set_non_tensor("info", {1, 2})  # a set needs pickle
    with pytest.raises(SerializationError, match="strict serialization refuses set values"):
        Codec(strict=True).encode(sent, route=ROUTE)
    assert round_trip(sent, strict=False)["info"] == {1, 2}


def test_tensordict_tensor_with_no_faithful_form_is_refused_naming_its_key() -> None:
    sent = TensorDict({"obs": torch.empty(3, device="meta")}, batch_size=[3])
    with pytest.raises(SerializationError, match=r"^args\[0\]\['obs'\]: a tensor on meta cannot be staged"):
        Codec().encode([(sent,), {}], route=ROUTE, arguments=True)


def test_other_tensordict_kinds_go_as_any_other_value() -> None:
    stacked = tensordict.LazyStackedTensorDict(
        TensorDict({"x": torch.ones(1)}, []), TensorDict({"x": torch.ones(1)}, [])
    )
    with pytest.raises(SerializationError, match="strict serialization refuses LazyStackedTensorDict values"):
        Codec(strict=True).encode(stacked)
    assert torch.equal(round_trip(stacked, strict=False)["x"], torch.ones(2, 1))


def test_collectors_batch_as_a_tensordict_travels_natively() -> None:
    steps, envs = 4, 2
    batch = Batch(
        "rl/collectors/0",
        3,
        torch.randint(0, 255, (steps, envs, 84, 84), dtype=torch.uint8),
        torch.zeros(steps, envs, dtype=torch.int64),
        torch.zeros(steps, envs),
        torch.ones(steps, envs),
        torch.zeros(steps, envs, dtype=torch.bool),
        torch.zeros(steps, envs, dtype=torch.bool),
        torch.randint(0, 255, (steps, envs, 84, 84), dtype=torch.uint8),
    )
    sent = batch.to_tensordict()
    arrived = round_trip(sent)
    assert_same(arrived, sent)
    assert arrived.batch_size == (envs, steps)
    assert arrived["observation"].dtype == torch.uint8


def test_tensordict_arriving_where_tensordict_is_missing_says_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = Codec()
    data, side = codec.encode(rollout(), route=ROUTE)
    monkeypatch.setitem(sys.modules, "tensordict", None)  # as if it were not installed
    with pytest.raises(SerializationError, match="pip install tensordict"):
        codec.decode(data, side)


def test_codec_neither_imports_tensordict_nor_needs_it() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["tensordict"] = None  # not installed
        import torch
        import actorch
        from actorch._base.codec import Codec
        codec = Codec()
        value = [1, (2, "x"), {"t": torch.ones(3)}, {3, 4}, complex(1, 2)]  # a set and a complex are pickled
        assert codec.decode(*codec.encode(value)) == value
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.strip() == "ok", done.stderr


def test_importing_actorch_does_not_import_tensordict() -> None:
    script = "import sys, actorch; print('tensordict' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.strip() == "False", done.stderr


def test_tensordict_arrives_on_the_device_its_tensors_arrived_on() -> None:
    sent = TensorDict({"pixels": torch.rand(2, 64, 65), "next": TensorDict({"r": torch.rand(2, 64, 65)}, [2])}, [2])
    sent = sent.to("cpu")
    codec = Codec()
    data, side = codec.encode(sent, route=ROUTE)
    # As if a device map had delivered them elsewhere (meta stands in for another device here).
    arrived = codec.decode(data, [tensor.to("meta") for tensor in side])
    assert arrived.device == torch.device("meta")
    assert arrived["next"].device == torch.device("meta")
    assert arrived["pixels"].is_meta
