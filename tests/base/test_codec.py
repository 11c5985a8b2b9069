"""The wire codec: msgpack bytes plus a side list of tensors, pickle fallback, strict mode."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from actorch import SerializationError, serializable
from actorch._base import codec as _codec
from actorch._base.channels.route import TensorRoute
from actorch._base.codec import OWN_CODES, Codec, current_context, register_extension, register_side_type


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Native:
    """A class registered as a codec extension by the tests below."""

    def __init__(self, value: int) -> None:
        self.value = value


class Twice:
    """Registered twice with the same decoder."""


class Tagged:
    """Pickled; it records the decoding context it was rebuilt under."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_tagged, ())


def _rebuild_tagged() -> object:
    return ("rebuilt under", current_context())


NATIVE_CODE = 120
register_extension(Native, NATIVE_CODE, lambda obj: obj.value, lambda data, context: (Native(data), context))


def round_trip(value: Any, codec: Codec | None = None) -> Any:
    codec = codec or Codec()
    data, tensors = codec.encode(value)
    assert isinstance(data, bytes)
    return codec.decode(data, tensors)


NESTED = {
    "ints": [0, -1, 2**40, -(2**63)],
    "floats": [0.5, float("inf")],
    "text": "héllo wörld ✓",
    "raw": b"\x00\xff",
    "flags": [True, False, None],
    "deep": {"a": {"b": {"c": [[], {}]}}},
    7: "int key",
}


@pytest.mark.smoke
def test_codec_round_trips_nested_values() -> None:
    assert round_trip(NESTED) == NESTED


def test_codec_preserves_tuples_at_any_depth() -> None:
    value = {"pair": (1, (2, 3)), "list": [(4,), ()], "top": ((),)}
    decoded = round_trip(value)
    assert decoded == value
    assert type(decoded["pair"]) is tuple
    assert type(decoded["pair"][1]) is tuple
    assert type(decoded["list"]) is list
    assert type(decoded["list"][0]) is tuple
    assert decoded["top"] == ((),)


def test_codec_round_trips_a_bare_tuple() -> None:
    assert round_trip((1, "a", None)) == (1, "a", None)


@pytest.mark.smoke
def test_codec_puts_tensors_in_the_side_list_in_order() -> None:
    first, second = torch.zeros(3), torch.ones(2, 2)
    data, tensors = Codec().encode({"a": first, "b": [second]})
    assert len(tensors) == 2
    assert tensors[0] is first
    assert tensors[1] is second
    decoded = Codec().decode(data, tensors)
    assert decoded["a"] is first
    assert decoded["b"][0] is second


def test_codec_keeps_tensor_bytes_out_of_the_encoded_bytes() -> None:
    tensor = torch.arange(100_000, dtype=torch.float32) * 3.25
    data, tensors = Codec().encode([tensor])
    assert len(data) < 64
    assert tensor.numpy().tobytes()[:4096] not in data
    assert tensors == [tensor]


def test_codec_round_trips_a_tensor_among_other_values() -> None:
    tensor = torch.randn(4, 5)
    decoded = round_trip(("meta", {"t": tensor, "n": 3}))
    assert decoded[0] == "meta"
    assert decoded[1]["n"] == 3
    assert torch.equal(decoded[1]["t"], tensor)


def test_codec_copy_tensors_sends_independent_copies() -> None:
    tensor = torch.zeros(4)
    data, tensors = Codec().encode([tensor], copy_tensors=True)
    assert tensors[0] is not tensor
    assert tensors[0].data_ptr() != tensor.data_ptr()
    tensor.add_(1)
    decoded = Codec().decode(data, tensors)
    assert torch.equal(decoded[0], torch.zeros(4))


def test_codec_copy_tensors_detaches_from_autograd() -> None:
    tensor = torch.ones(2, requires_grad=True)
    _, tensors = Codec().encode([tensor], copy_tensors=True)
    assert not tensors[0].requires_grad


@pytest.mark.parametrize(
    "value",
    [{1, 2, 3}, frozenset({"a"}), Point(1, 2.5), 2**70, complex(1, 2)],
    ids=["set", "frozenset", "dataclass", "huge int", "complex"],
)
def test_codec_falls_back_to_pickle_for_values_msgpack_cannot_carry(value: Any) -> None:
    decoded = round_trip({"v": value})
    assert decoded == {"v": value}
    assert type(decoded["v"]) is type(value)


def test_codec_decodes_pickled_values_under_the_given_context() -> None:
    codec = Codec()
    data, tensors = codec.encode([Tagged()])
    assert codec.decode(data, tensors, context="node 3") == [("rebuilt under", "node 3")]
    assert current_context() is None


@pytest.mark.parametrize("value", [{1, 2}, Point(1, 2.0), [1, {"deep": {3}}]], ids=["set", "dataclass", "nested set"])
def test_strict_codec_refuses_to_encode_a_value_needing_pickle(value: Any) -> None:
    with pytest.raises(SerializationError, match="strict"):
        Codec(strict=True).encode(value)


def test_strict_codec_names_the_refused_type() -> None:
    with pytest.raises(SerializationError, match="set"):
        Codec(strict=True).encode({"a": {1}})


@pytest.mark.parametrize("wide", [2**64, -(2**63) - 1, 10**30])
def test_strict_codec_says_an_int_wider_than_64_bits_is_too_wide_not_that_ints_are_refused(wide: int) -> None:
    with pytest.raises(SerializationError) as refused:
        Codec(strict=True).encode({"big": wide})
    message = str(refused.value)
    assert f"cannot send the int {wide}: it is wider than 64 bits" in message
    assert "from -2**63 to 2**64 - 1; send it as a str" in message
    assert "refuses int values" not in message
    for edge in (2**64 - 1, -(2**63)):
        assert Codec(strict=True).decode(*Codec(strict=True).encode(edge)) == edge
    assert Codec().decode(*Codec().encode(wide)) == wide, "pickled when not strict"


def test_strict_codec_refuses_to_decode_pickled_data() -> None:
    data, tensors = Codec().encode({"v": {1, 2}})
    with pytest.raises(SerializationError, match="strict"):
        Codec(strict=True).decode(data, tensors)


def test_strict_codec_still_carries_plain_values_tuples_and_tensors() -> None:
    tensor = torch.ones(3)
    decoded = round_trip((1, "a", [tensor]), Codec(strict=True))
    assert decoded[:2] == (1, "a")
    assert torch.equal(decoded[2][0], tensor)


def test_codec_reports_an_unpicklable_value_as_serialization_error() -> None:
    with pytest.raises(SerializationError, match="function"):
        Codec().encode({"f": lambda: 1})


def test_codec_reports_an_unpicklable_value_nested_in_a_tuple() -> None:
    with pytest.raises(SerializationError):
        Codec().encode((1, [lambda: 1]))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # an array of 2 with only one item
        b"\xd4\x63\x00",  # extension code 99, never registered
        b"\xd6\x00\x05\x00\x00\x00",  # tensor 5 of an empty tensor list
        b"\xd4\x02\x00",  # a pickle that is not one
    ],
    ids=["empty", "reserved byte", "truncated", "unknown extension", "missing tensor", "bad pickle"],
)
def test_codec_reports_malformed_bytes_as_serialization_error(data: bytes) -> None:
    with pytest.raises(SerializationError):
        Codec().decode(data, [])


def test_registered_extension_travels_natively_even_in_strict_mode() -> None:
    codec = Codec(strict=True)
    data, tensors = codec.encode({"n": Native(41)})
    value, context = codec.decode(data, tensors, context="ctx")["n"]
    assert isinstance(value, Native)
    assert value.value == 41
    assert context == "ctx"


def test_register_extension_accepts_the_same_registration_twice() -> None:
    def decode(data: Any, context: Any) -> Twice:
        return Twice()

    register_extension(Twice, 121, lambda obj: None, decode)
    register_extension(Twice, 121, lambda obj: None, decode)
    assert isinstance(round_trip(Twice()), Twice)


@pytest.mark.parametrize("code", [-1, 0, 2, 15, 128, 1000])
def test_register_extension_refuses_a_code_outside_the_user_range(code: int) -> None:
    with pytest.raises(ValueError, match=rf"extension code must be in 32\.\.127, not {code}$"):
        register_extension(Native, code, lambda obj: 0, lambda data, context: None)


@pytest.mark.parametrize(("code", "holder"), [(16, "actorch._actors.ref.ActorRef"), (28, "actorch")])
def test_register_extension_refuses_a_code_reserved_for_actorch(code: int, holder: str) -> None:
    with pytest.raises(ValueError, match=rf"^extension code {code} is reserved for {holder}: use 32\.\.127$"):
        register_extension(Native, code, lambda obj: 0, lambda data, context: None)


def test_own_codes_are_unique_in_actorchs_range_and_each_class_registered_with_its_own() -> None:
    import actorch  # noqa: F401, PLC0415 - registers every class of actorch's

    assert len(set(OWN_CODES.values())) == len(OWN_CODES)
    assert all(16 <= code < 32 for code in OWN_CODES.values())
    registered = {code: cls.__qualname__ for cls, (code, _) in _codec._encoders.items()}  # public ones say "actorch"
    assert {name: registered.get(code) for name, code in OWN_CODES.items()} == {
        name: name.rpartition(".")[2] for name in OWN_CODES
    }


def test_an_own_class_cannot_take_another_code_and_a_users_class_needs_one() -> None:
    from actorch._actors.relocation.spec import RelocationSpec  # noqa: PLC0415

    with pytest.raises(ValueError, match=r"RelocationSpec has extension code 30 \(OWN_CODES\), not 40$"):
        register_extension(RelocationSpec, 40, lambda obj: 0, lambda data, context: None)
    with pytest.raises(ValueError, match="needs an extension code: only actorch's own classes may omit it"):
        serializable()(Carried)


def test_register_extension_refuses_a_code_taken_by_another_decoder() -> None:
    with pytest.raises(ValueError, match="taken"):
        register_extension(Native, NATIVE_CODE, lambda obj: 0, lambda data, context: None)


def test_encode_leaves_a_tensor_off_the_cpu_as_it_is_without_a_route():
    codec = Codec()
    off_cpu = torch.empty(3, device="meta")
    _, tensors = codec.encode([off_cpu])
    assert tensors[0] is off_cpu


@serializable(100)
@dataclasses.dataclass(frozen=True)
class Carried:
    """Travels natively, tensors included."""

    name: str
    tensor: torch.Tensor
    extra: tuple[int, ...] = ()
    label: str = dataclasses.field(default="x", kw_only=True)
    derived: int = dataclasses.field(default=0, init=False)


class SideThing:
    """Rides the side list like a tensor (as torch RRefs do)."""


register_side_type(SideThing)


def test_serializable_dataclass_round_trips_in_strict_mode_with_its_tensors() -> None:
    codec = Codec(strict=True)
    value = Carried("a", torch.arange(3), (1, 2), label="y")
    data, tensors = codec.encode([value])
    assert len(tensors) == 1
    assert tensors[0] is value.tensor
    (back,) = codec.decode(data, tensors)
    assert type(back) is Carried
    assert (back.name, back.extra, back.label) == ("a", (1, 2), "y")
    assert back.tensor is value.tensor


def test_serializable_refuses_a_class_that_is_not_a_dataclass() -> None:
    with pytest.raises(TypeError, match="needs a dataclass"):
        serializable(101)(Native)


def test_serializable_refuses_a_code_taken_by_another_class() -> None:
    @dataclasses.dataclass
    class Other:
        x: int

    with pytest.raises(ValueError, match="taken"):
        serializable(100)(Other)


def test_serializable_without_its_code_is_refused_at_decoration_naming_the_fix() -> None:
    with pytest.raises(TypeError) as refused:

        @serializable  # type: ignore[arg-type]  # the mistake a user makes
        @dataclasses.dataclass
        class Point:
            x: int
            y: int

    assert str(refused.value) == (
        "@serializable needs an extension code: write @actorch.serializable(32) above class "
        "test_serializable_without_its_code_is_refused_at_decoration_naming_the_fix.<locals>.Point "
        "(32 to 127, one per class)"
    )


def test_serializable_accepts_the_same_class_again() -> None:
    assert serializable(100)(Carried) is Carried


def test_side_type_rides_the_side_list_untouched_also_in_strict_mode() -> None:
    codec = Codec(strict=True)
    thing = SideThing()
    data, side = codec.encode({"thing": thing, "t": torch.ones(1)}, copy_tensors=True)
    assert side[0] is thing
    back = codec.decode(data, side)
    assert back["thing"] is thing


def test_register_side_type_twice_registers_once() -> None:
    register_side_type(SideThing)
    assert _codec._side_types.count(SideThing) == 1


def test_serializable_lets_a_redefined_class_take_over_its_code() -> None:
    def define() -> type:
        @dataclasses.dataclass
        class Reloaded:
            x: int

        return Reloaded

    first = serializable(102)(define())
    second = serializable(102)(define())
    assert first is not second
    codec = Codec(strict=True)
    data, side = codec.encode(second(1))
    assert type(codec.decode(data, side)) is second


# ---------------------------------------------------------------------- small tensors inside the bytes

ROUTE = TensorRoute(1)  # bound for another process: small CPU tensors ride inside the bytes


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(4),
        torch.arange(6).reshape(2, 3).t(),  # not contiguous
        torch.randn(8)[2:5],  # a view with an offset
        torch.tensor(3.5),  # no dimensions
        torch.zeros(0, 3),  # no elements
        torch.tensor([True, False]),
        torch.randn(3, dtype=torch.bfloat16),
        torch.randn(2, dtype=torch.complex64),
        torch.randint(-100, 100, (2, 2, 2), dtype=torch.int8),
    ],
    ids=lambda tensor: f"{tensor.dtype}-{tuple(tensor.shape)}",
)
def test_codec_carries_a_small_tensor_bound_for_another_process_inside_its_bytes(tensor: torch.Tensor) -> None:
    codec = Codec()
    data, tensors = codec.encode(["state", tensor], route=ROUTE)
    assert tensors == []
    _, received = codec.decode(data, tensors)
    assert received.dtype == tensor.dtype
    assert received.shape == tensor.shape
    assert torch.equal(received, tensor)


def test_codec_gives_an_inlined_tensor_memory_of_its_own_and_leaves_both_resizable() -> None:
    sent = torch.zeros(4)
    codec = Codec()
    data, tensors = codec.encode([sent], route=ROUTE)
    sent.add_(1)  # the sender may change its tensor at once: the bytes hold a copy
    [received] = codec.decode(data, tensors)
    assert torch.equal(received, torch.zeros(4))
    received.resize_(10)
    sent.resize_(10)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.zeros(_codec.INLINE_TENSOR_BYTES // 4 + 1),  # over the size
        torch.zeros(4, requires_grad=True),  # distributed autograd records torch RPC's path
        torch.nn.Parameter(torch.zeros(4), requires_grad=False),  # a subclass keeps its class
        torch.zeros(4, dtype=torch.float8_e4m3fn),  # a dtype outside the plain ones
    ],
    ids=["large", "requires-grad", "parameter", "float8"],
)
def test_codec_keeps_torch_rpcs_tensor_path_for_tensors_it_cannot_inline(tensor: torch.Tensor) -> None:
    _, tensors = Codec().encode([tensor], route=ROUTE)
    assert len(tensors) == 1
    assert tensors[0] is tensor


def test_codec_inlines_nothing_without_a_route() -> None:
    tensor = torch.zeros(4)
    _, tensors = Codec().encode([tensor])
    assert tensors[0] is tensor  # the same process: the very object arrives


def test_codec_refuses_an_inlined_tensor_whose_data_does_not_fit_its_shape() -> None:
    codec = Codec()
    data, tensors = codec.encode([torch.zeros(3)], route=ROUTE)
    four = data.replace((3).to_bytes(8, "little"), (4).to_bytes(8, "little"), 1)  # the shape says 4, 3 came
    with pytest.raises(SerializationError, match=r"shape \(4,\) came with 12 bytes"):
        codec.decode(four, tensors)
