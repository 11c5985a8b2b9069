"""Fuzzing a live actor with endpoint names and arguments: every bad call gets a named error, and it keeps serving.

The world runs in a thread of its own, so hypothesis can drive it from plain
test functions: each example is one call (or tell) from node 0 to an actor on
node 1, over the codec in strict mode, and once all examples have run the actor
must still answer exactly as before.
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorch
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
