"""Fuzzing a live actor with endpoint names and arguments, and the codec's decoder with bytes.

Every bad call gets a named error, and the actor keeps serving. The world runs
in a thread of its own, so hypothesis can drive it from plain test functions:
each example is one call (or tell) from node 0 to an actor on node 1, over the
codec in strict mode, and once all examples have run the actor must still
answer exactly as before.

The decoder is fed random bytes and mutated encodings of drawn values (tensors
of every kind among them, TensorDicts): nothing but ``SerializationError`` comes out, and
sizes declared beyond the bytes are refused before anything is allocated.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from tensor_cases import payloads

import actorch
from actorch import SerializationError
from actorch._base import codec as _codec
from actorch._base.channels.route import TensorRoute
from actorch._base.codec import Codec
from actorch.testing import LocalWorld, local_world


class Target(actorch.Actor):
    """An actor with a few endpoints of different shapes, counting what it handled."""

    def __init__(self) -> None:
        self.handled = 0

    async def add(self, a: int, b: int = 0) -> int:
        self.handled += 1
        return a + b

    async def echo(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.handled += 1
        return [list(args), kwargs]

    async def norm(self, t: torch.Tensor) -> float:
        self.handled += 1
        return float(t.float().norm())

    @actorch.batched(max_batch=4, max_wait=0.001)
    async def square(self, items: list[int]) -> list[int]:
        self.handled += len(items)
        return [i * i for i in items]

    async def count(self) -> int:
        return self.handled

    def snapshot(self) -> str:  # a plain hook, which spawn lets through: not an endpoint
        return "no"

    async def _private(self) -> str:
        return "no"


class LiveWorld:
    """A two-node in-process world running in its own thread's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready: Future[tuple[LocalWorld, actorch.ActorRef[Target]]] = Future()
        self.done = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self.thread.start()
        self.world, self.ref = self.ready.result(timeout=30)

    async def _main(self) -> None:
        self.done = asyncio.Event()
        async with local_world(2, strict=True, stop_grace=0.5) as world:
            ref = await world[0].spawn(Target, on=1, name="fuzz/target")
            self.ready.set_result((world, ref))
            await self.done.wait()

    def run(self, coroutine: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.done.set)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture(scope="module")
def live() -> Iterator[LiveWorld]:
    world = LiveWorld()
    yield world
    world.close()


NAMES = st.one_of(
    st.sampled_from(["add", "echo", "norm", "square", "count", "snapshot", "_private", "__init__", "__class__", ""]),
    st.text(max_size=30),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
TENSORS = st.builds(
    lambda shape, dtype: torch.zeros(shape, dtype=dtype),
    st.lists(st.integers(0, 3), max_size=3),
    st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float16]),
)
UNSENDABLE = st.sampled_from([object(), threading.Lock(), {1, 2}, complex(1, 2), lambda: 1, range(3)])
VALUES = st.recursive(
    st.one_of(SCALARS, TENSORS),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10,
)
ARGS = st.lists(st.one_of(VALUES, UNSENDABLE), max_size=4)
KWARGS = st.dictionaries(st.text(max_size=10), st.one_of(VALUES, UNSENDABLE), max_size=3)


async def outcome_of(awaitable: Any) -> Any:
    """The result, or the exception raised (a handler's error arrives as a ``RemoteError``)."""
    try:
        return await awaitable
    except Exception as exc:  # the test inspects what was raised
        return exc


async def call(ref: actorch.ActorRef[Target], name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    async with asyncio.timeout(5):
        return await ref.call(name, *args, **kwargs)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, args=ARGS, kwargs=KWARGS)
def test_fuzzed_calls_get_named_errors(live: LiveWorld, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    outcome = live.run(outcome_of(call(live.ref, name, args, kwargs)))
    if isinstance(outcome, BaseException):
        assert not isinstance(outcome, TimeoutError), f"{name!r}{args!r}{kwargs!r} timed out: a call hung"
        assert isinstance(outcome, actorch.ActorchError), f"{type(outcome).__name__} is not an actorch error"
        assert str(outcome), f"{type(outcome).__name__} without a message"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, args=ARGS, kwargs=KWARGS)
def test_fuzzed_tells_are_refused_or_sent(live: LiveWorld, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    async def tell() -> None:
        live.ref.tell(name, *args, **kwargs)

    outcome = live.run(outcome_of(tell()))
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, actorch.ActorchError), f"{type(outcome).__name__} is not an actorch error"
        assert str(outcome)


def test_actor_answers_correctly_after_the_fuzzing(live: LiveWorld) -> None:
    async def check() -> list[Any]:
        before = await live.ref.call(Target.count)
        results = [
            await live.ref.call(Target.add, 2, b=3),
            await live.ref.call(Target.echo, 1, "x", k=[1.5]),
            await live.ref.call(Target.norm, torch.tensor([3.0, 4.0])),
            await asyncio.gather(*(live.ref.call(Target.square, i) for i in range(3))),
        ]
        after = await live.ref.call(Target.count)
        found = await live.world[0].lookup("fuzz/target")
        return [*results, after - before, found == live.ref]

    add, echo, norm, squares, handled, found = live.run(check())
    assert add == 5
    assert echo == [[1, "x"], {"k": [1.5]}]
    assert math.isclose(norm, 5.0)
    assert squares == [0, 1, 4]
    assert handled == 6
    assert found


# ---------------------------------------------------------------------- the codec's decoder
#
# Bytes from another process reach Codec.decode: whatever they hold, it returns
# a value or raises SerializationError, and allocates no more than the bytes
# justify. The messages are written by hand here (tests do not import msgpack).

DECODE_SIDE = [torch.ones(2), torch.arange(3)]
"""A side list for the fuzzed messages to point into (or past)."""


def ext(code: int, payload: bytes) -> bytes:
    """A msgpack extension value: ``code`` and ``payload``."""
    size = len(payload)
    if size < 1 << 8:
        return b"\xc7" + bytes((size, code)) + payload
    if size < 1 << 16:
        return b"\xc8" + size.to_bytes(2, "big") + bytes((code,)) + payload
    return b"\xc9" + size.to_bytes(4, "big") + bytes((code,)) + payload


def nested_tuples(depth: int) -> bytes:
    """``depth`` tuples, each holding the next, around an empty list, as the codec writes them."""
    data = b"\x90"
    for _ in range(depth):
        data = ext(_codec._TUPLE, data)
    return data


def decoded_or_refused(codec: Codec, data: bytes, side: list[Any]) -> None:
    """Decode ``data``; a SerializationError with a message is the only way out besides a value."""
    try:
        codec.decode(data, side)
    except SerializationError as exc:
        message = str(exc)
    else:
        return
    assert message


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), strict=st.booleans())
def test_codec_decodes_random_bytes_to_a_value_or_serialization_error(data: bytes, strict: bool) -> None:
    decoded_or_refused(Codec(strict=strict), data, DECODE_SIDE)


MUTATIONS = st.sampled_from(["flip", "truncate", "insert", "overwrite", "duplicate"])


def mutate(data: bytes, mutations: list[tuple[str, int, bytes]]) -> bytes:
    """``data`` with each mutation applied in turn."""
    mutated = bytearray(data)
    for mutation, where, noise in mutations:
        at = where % (len(mutated) + 1)
        if mutation == "flip" and at < len(mutated):
            mutated[at] ^= noise[0]
        elif mutation == "truncate":
            del mutated[at:]
        elif mutation == "insert":
            mutated[at:at] = noise
        elif mutation == "overwrite":
            mutated[at : at + len(noise)] = noise
        else:
            mutated[at:at] = mutated[at : at + len(noise) * 4]
    return bytes(mutated)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    payload=payloads(),
    extra=VALUES,
    mutations=st.lists(st.tuples(MUTATIONS, st.integers(0, 1 << 16), st.binary(min_size=1, max_size=9)), max_size=3),
    keep=st.integers(0, 4),
)
@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated:UserWarning")
@pytest.mark.filterwarnings("ignore:Sparse (CSR|CSC|BSR|BSC) tensor support is in beta state:UserWarning")
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")
def test_codec_decodes_mutated_messages_to_a_value_or_serialization_error(
    payload: list[torch.Tensor], extra: Any, mutations: list[tuple[str, int, bytes]], keep: int
) -> None:
    codec = Codec(strict=True)
    try:
        data, side = codec.encode([(1, "x", payload), {"extra": extra}], route=TensorRoute(1), arguments=True)
    except SerializationError:
        reject()  # not a message to begin with (an int wider than 64 bits)
    decoded_or_refused(codec, mutate(data, mutations), side[:keep] if keep < len(side) else side)


@settings(max_examples=300, deadline=None)
@given(
    mutations=st.lists(st.tuples(MUTATIONS, st.integers(0, 1 << 12), st.binary(min_size=1, max_size=9)), max_size=3),
    keep=st.integers(0, 2),
    strict=st.booleans(),
)
def test_codec_decodes_mutated_tensordicts_to_a_value_or_serialization_error(
    mutations: list[tuple[str, int, bytes]], keep: int, strict: bool
) -> None:
    tensordict = pytest.importorskip("tensordict")
    td = tensordict.TensorDict(
        {
            "observation": torch.arange(12, dtype=torch.uint8).view(2, 6),
            "pixels": torch.rand(2, 65, 64),  # past what is inlined: on the side list
            "next": tensordict.TensorDict({"reward": torch.ones(2, 1)}, batch_size=[2], names=["env"]),
        },
        batch_size=[2],
        device="cpu",
    )
    td.set_non_tensor("env", "CartPole-v1")
    codec = Codec(strict=strict)
    data, side = codec.encode([td.lock_(), td["next"]], route=TensorRoute(1))
    decoded_or_refused(codec, mutate(data, mutations), side[:keep])


@pytest.mark.parametrize(
    "fields",
    [
        [[-1], None, None, False, []],  # a negative batch size
        [[2], None, None, False, [["x", 0, torch.ones(3)]]],  # a tensor that does not fit the batch size
        [[2], None, None, False, [[7, 0, torch.ones(2)]]],  # a key that is not a string
        [[2], None, None, False, [["x", 0, 5]]],  # an entry that is not a tensor
        [[2], None, None, False, [["x", 9, torch.ones(2)]]],  # no such kind of entry
        [[2], "nowhere", None, False, []],  # no such device
        [[2], None, ["a", "b"], False, []],  # names that do not fit the batch size
        [[2], None, None, False],  # a field missing
        ["2", None, None, False, []],  # a batch size that is not a list
        [[2], None, None, False, {"x": 1}],  # entries that are not a list
    ],
    ids=["negative", "shape", "key", "not-tensor", "kind", "device", "names", "short", "batch", "entries"],
)
def test_codec_refuses_a_malformed_tensordict(fields: list[Any]) -> None:
    pytest.importorskip("tensordict")
    codec = Codec()
    body, side = codec.encode(fields)  # the layout as a plain list, its tensors on the side list
    with pytest.raises(SerializationError, match="TensorDict arrived malformed"):
        codec.decode(ext(_codec._TENSORDICT, body), side)


@pytest.mark.parametrize(
    "data",
    [
        b"\xdd\xff\xff\xff\xff",  # an array of 4 billion items, in 5 bytes
        b"\xdf\xff\xff\xff\xff",  # a map of 4 billion pairs
        b"\xc6\xff\xff\xff\xff",  # 4 GiB of bytes
        b"\xdb\xff\xff\xff\xffabc",  # a 4 GiB string
        b"\xc9\xff\xff\xff\xff\x05",  # a 4 GiB extension (an inlined tensor)
    ],
    ids=["array", "map", "bin", "str", "ext"],
)
def test_codec_refuses_a_size_declared_beyond_the_bytes(data: bytes) -> None:
    with pytest.raises(SerializationError):
        Codec().decode(data, [])


@pytest.mark.parametrize(
    "shape",
    [(1 << 40,), (1 << 31, 1 << 31), (1 << 64) - 1, (3, (1 << 64) - 1, (1 << 64) - 1)],
    ids=["1T-elements", "2G-by-2G", "minus-one", "two-negatives"],
)
def test_codec_refuses_an_inlined_tensor_larger_than_its_data_before_allocating_it(
    shape: tuple[int, ...] | int, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = shape if isinstance(shape, tuple) else (shape,)
    header = bytes((1, len(sizes))) + b"".join(size.to_bytes(8, "little") for size in sizes)  # float64
    allocated: list[Any] = []
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: allocated.append(args))
    with pytest.raises(SerializationError, match=r"an inlined tensor of shape .* came with 16 bytes of data"):
        Codec().decode(ext(_codec._INLINE, header + bytes(16)), [])
    assert allocated == []


@pytest.mark.parametrize(
    "payload", [b"", b"\x01", b"\x63\x00", b"\x00\x03\x01"], ids=["empty", "no-rank", "dtype", "short"]
)
def test_codec_refuses_an_inlined_tensor_with_a_malformed_header(payload: bytes) -> None:
    with pytest.raises(SerializationError, match="inlined tensor came with a malformed header"):
        Codec().decode(ext(_codec._INLINE, payload), [])


@pytest.mark.parametrize(
    "parts",
    [
        [0, [2, 2], False, torch.tensor([[0, 5], [0, 1]]), torch.tensor([1.0, 2.0])],  # an index out of range
        [0, [2, 2], True, torch.tensor([[0, 0], [1, 1]]), torch.tensor([1.0, 2.0])],  # "coalesced", duplicated
        [1, [2, 2], torch.tensor([0, 1, 9]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0])],  # rows past the end
        [0, [2, 2], False, torch.tensor([[0], [1]])],  # a part missing
        [16, torch.tensor([1, 2], dtype=torch.uint8), "scale", 0],  # a scale that is not a number
        [17, torch.ones(2, 3, dtype=torch.int8), torch.ones(2, dtype=torch.float64), torch.zeros(2), 7],  # an axis
        [17, torch.ones(2, 3, dtype=torch.int8), torch.ones(5, dtype=torch.float64), torch.zeros(5), 0],  # scales
        [99, 1, 2],  # no such kind
    ],
    ids=[
        "coo-index",
        "coo-not-coalesced",
        "csr-rows",
        "coo-short",
        "quantized-scale",
        "per-channel-axis",
        "per-channel-scales",
        "kind",
    ],
)
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning")
def test_codec_refuses_malformed_tensor_parts(parts: list[Any]) -> None:
    codec = Codec()
    body, side = codec.encode(parts)  # the parts as a plain list, their tensors on the side list
    with pytest.raises(SerializationError, match="tensor arrived malformed"):
        codec.decode(ext(_codec._PARTS, body), side)


def test_codec_round_trips_tuples_nested_to_the_limit() -> None:
    value: Any = []
    for _ in range(_codec.MAX_NESTING):
        value = (value,)
    codec = Codec()
    assert codec.decode(*codec.encode(value)) == value


def test_codec_refuses_to_encode_tuples_nested_past_the_limit() -> None:
    value: Any = []
    for _ in range(_codec.MAX_NESTING + 1):
        value = (value,)
    with pytest.raises(SerializationError, match=f"more than {_codec.MAX_NESTING} deep"):
        Codec().encode(value)


@pytest.mark.parametrize("depth", [_codec.MAX_NESTING + 1, 200, 5000])
def test_codec_refuses_to_decode_tuples_nested_past_the_limit(depth: int) -> None:
    # 200 levels overflowed the decoding thread's C stack and killed the process.
    assert Codec().decode(nested_tuples(_codec.MAX_NESTING), []) is not None
    with pytest.raises(SerializationError, match=f"more than {_codec.MAX_NESTING} deep"):
        Codec().decode(nested_tuples(depth), [])


def test_codec_reports_bytes_after_the_value_even_when_the_value_cannot_be_printed() -> None:
    # msgpack's error holds what it decoded before the extra bytes: a tensor whose repr raises, here.
    codec = Codec()
    body, side = codec.encode(
        [17, torch.ones(1, 2, dtype=torch.uint8), torch.ones(1, dtype=torch.float64), torch.tensor([256]), 0]
    )
    with pytest.raises(SerializationError, match="ExtraData"):
        codec.decode(ext(_codec._PARTS, body) + b"\x00", side)
