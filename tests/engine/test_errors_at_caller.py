"""Every error class, provoked through the public API and caught at the caller."""

from __future__ import annotations

import asyncio
import pickle
import re
import time
import traceback

import pytest

import actorch
from actorch._actors.actor import endpoints_of
from actorch._engine import endpoints as endpoints_module
from actorch._engine.endpoints import check_call
from actorch.testing import LocalWorld, local_world


class CustomError(Exception):
    pass


class NeedyError(Exception):
    """Its ``__new__`` insists on its own arguments."""

    def __new__(cls, text: str, code: int) -> NeedyError:
        self = super().__new__(cls, text, code)
        self.code = code
        return self


NON_ASCII = "données invalides — 数据无效 ✗"


class Faulty(actorch.Actor):
    max_concurrency = 4  # so a pending sleep does not hold up other calls

    async def fail_value(self, message: str) -> None:
        raise ValueError(message)

    async def fail_custom(self) -> None:
        raise CustomError("custom failure")

    async def echo(self, value: object, *, twice: bool = False) -> object:
        return [value, value] if twice else value

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def make_set(self) -> set[int]:
        return {1, 2}

    async def fail_group(self) -> None:
        raise actorch.GroupError("1 of 2 failed", [ValueError("inner")], [1, None])

    async def fail_needy(self) -> None:
        raise NeedyError("needs", 3)

    async def _secret(self) -> str:
        return "secret"

    async def relay_custom(self, other: actorch.ActorRef[Faulty]) -> None:
        await other.call(Faulty.fail_custom)

    def _summary(self) -> str:  # a private plain helper: legal on an actor, no endpoint
        return "helper"


class Hooked(actorch.Actor):
    """Plain ``def`` state hooks, which spawn lets through: the runtime calls them, callers cannot."""

    def snapshot(self) -> int:
        return 1

    def restore(self, state: int) -> None:
        pass


class Helpful(actorch.Actor):
    """A public plain ``def`` helper, which spawn refuses."""

    def summary(self) -> str:
        return "helper"

    def total(self) -> int:
        return 0


async def test_handler_exception_arrives_as_remote_error_and_original_class(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    async with asyncio.timeout(5):
        with pytest.raises(actorch.RemoteError) as info:
            await faulty.call(Faulty.fail_value, "bad input")
    assert isinstance(info.value, ValueError)
    assert info.value.type_name == "ValueError"
    assert str(info.value) == "bad input"


async def test_remote_error_keeps_a_non_ascii_message_exactly(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    async with asyncio.timeout(5):
        with pytest.raises(ValueError, match="données") as info:
            await faulty.call(Faulty.fail_value, NON_ASCII)
    assert str(info.value) == NON_ASCII
    assert info.value.message == NON_ASCII  # type: ignore[attr-defined]


async def test_remote_error_carries_the_remote_traceback_text(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    async with asyncio.timeout(5):
        with pytest.raises(actorch.RemoteError) as info:
            await faulty.call(Faulty.fail_value, "with traceback")
    text = info.value.remote_traceback
    assert "raise ValueError(message)" in text
    assert "fail_value" in text
    assert "ValueError: with traceback" in text


async def test_remote_error_prints_the_handler_frames_under_the_local_ones(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, name="errors/printed", on=on)
    async with asyncio.timeout(5):
        with pytest.raises(ValueError, match="printed") as info:
            await faulty.call(Faulty.fail_value, "printed")
    printed = "".join(traceback.format_exception(info.value))
    heading = f"Raised in 'fail_value' of actor 'errors/printed' (Faulty) on node {on}, pid "
    assert printed.index("actorch.RemoteError(ValueError): printed") < printed.index(heading)
    assert printed.index("      raise ValueError(message)") > printed.index(heading)
    assert "cell.py" not in info.value.remote_traceback, "the runtime's frames that ran the handler are left out"


async def test_same_node_handler_error_stays_reachable_as_the_context(world: LocalWorld) -> None:
    faulty = await world[0].spawn(Faulty, on=0)
    async with asyncio.timeout(5):
        with pytest.raises(ValueError, match="kept") as info:
            await faulty.call(Faulty.fail_value, "kept")
    original = info.value.__context__
    assert type(original) is ValueError
    assert str(original) == "kept"
    assert info.value.__suppress_context__ is True, "its traceback is printed once, in the note"
    try:
        raise KeyError("being handled by the caller")
    except KeyError:
        with pytest.raises(ValueError, match="again") as again:
            await faulty.call(Faulty.fail_value, "again")
    assert str(again.value.__context__) == "again", "the handler's error, not the caller's"


async def test_remote_error_passed_on_by_a_handler_keeps_its_class(world: LocalWorld, on: int) -> None:
    relay = await world[0].spawn(Faulty, on=on)
    faulty = await world[0].spawn(Faulty, on=2)
    async with asyncio.timeout(5):
        with pytest.raises(CustomError) as info:
            await relay.call(Faulty.relay_custom, faulty)
    assert info.value.type_name == f"{__name__}.CustomError"  # type: ignore[attr-defined]
    note = info.value.__notes__[0]
    assert note.startswith("Raised in 'relay_custom' of actor Faulty#")
    assert "\n  Raised in 'fail_custom' of actor Faulty#" in note, "the inner hop's note, indented under the outer"
    assert "on node 2, pid" in note


async def test_remote_error_of_a_test_module_class_is_an_instance_of_it(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    async with asyncio.timeout(5):
        with pytest.raises(CustomError) as info:
            await faulty.call(Faulty.fail_custom)
    assert str(info.value) == "custom failure"
    assert isinstance(info.value, actorch.RemoteError)
    assert info.value.type_name == f"{__name__}.CustomError"


async def test_actor_keeps_serving_after_its_handler_raised(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    async with asyncio.timeout(5):
        with pytest.raises(ValueError, match="once"):
            await faulty.call(Faulty.fail_value, "once")
        assert await faulty.call(Faulty.echo, 1) == 1


@pytest.mark.parametrize(
    ("endpoint", "args", "kwargs", "expected"),
    [
        ("missing", (), {}, "no endpoint 'missing'"),
        ("_secret", (), {}, "private"),
        ("__init__", (), {}, "'__init__'"),
        ("__class__", (), {}, "'__class__'"),
        ("on_start", (), {}, "'on_start'"),
        ("echo", (), {}, "bad arguments for 'echo'"),
        ("echo", (1, 2), {}, "bad arguments for 'echo'"),
        ("echo", (1,), {"nope": True}, "bad arguments for 'echo'"),
    ],
    ids=["unknown", "private", "dunder init", "dunder class", "hook", "too few", "too many", "unknown keyword"],
)
async def test_bad_call_raises_endpoint_error_and_the_actor_keeps_serving(
    world: LocalWorld, on: int, endpoint: str, args: tuple[object, ...], kwargs: dict[str, object], expected: str
) -> None:
    faulty = await world[0].spawn(Faulty, name="errors/faulty", on=on)
    async with asyncio.timeout(5):
        with pytest.raises(actorch.EndpointError) as info:
            await faulty.call(endpoint, *args, **kwargs)
        assert await faulty.call(Faulty.echo, 7, twice=True) == [7, 7]
    message = str(info.value)
    assert expected in message
    assert "'errors/faulty'" in message
    assert f"node {on}" in message


async def test_unknown_endpoint_error_lists_the_known_endpoints(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    async with asyncio.timeout(5):
        known = "echo, fail_custom, fail_group, fail_needy, fail_value, make_set, relay_custom, sleep"
        with pytest.raises(actorch.EndpointError, match=known):
            await faulty.call("missing")


async def test_calling_a_plain_def_hook_says_only_async_methods_are_endpoints(world: LocalWorld, on: int) -> None:
    hooked = await world[0].spawn(Hooked, name="errors/plain", on=on)
    expected = (
        rf"^'snapshot' of actor 'errors/plain' \(Hooked\) on node {on} is a plain `def` method of Hooked, and only "
        r"`async def` methods are endpoints: make it `async def snapshot\(...\)`, and run blocking work in it "
        r"with `await asyncio.to_thread\(...\)`"
    )
    async with asyncio.timeout(5):
        with pytest.raises(actorch.EndpointError, match=expected):
            await hooked.call(Hooked.snapshot)  # type: ignore[call-overload]  # mypy sees it too
        with pytest.raises(actorch.EndpointError, match=expected):
            await hooked.call("snapshot")
    with pytest.raises(actorch.EndpointError, match=expected):
        hooked.tell("snapshot")
    assert "snapshot" not in endpoints_of(Hooked)


async def test_spawning_a_class_with_a_public_plain_def_method_names_it_and_the_fixes(world: LocalWorld) -> None:
    expected = (
        r"^cannot spawn Helpful: Helpful.summary, Helpful.total are plain `def` methods, and only `async def` "
        r"methods are endpoints callers can reach: make it `async def summary\(...\)` \(run blocking work in it "
        r"with `await asyncio.to_thread\(...\)`\), or, if only the actor itself calls it, make it private "
        r"\(`_summary`\)$"
    )
    with pytest.raises(TypeError, match=expected):
        await world[0].spawn(Helpful, name="errors/helpful", on=1)
    with pytest.raises(TypeError, match=expected):
        await world[0].spawn_group(Helpful, 2, on=1)
    assert await world[0].lookup_all("errors/**") == []


async def test_endpoint_error_is_also_a_type_error(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    async with asyncio.timeout(5):
        with pytest.raises(TypeError):
            await faulty.call(Faulty.echo)


async def test_bad_tell_raises_endpoint_error_at_once(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    with pytest.raises(actorch.EndpointError, match="no endpoint 'missing'"):
        faulty.tell("missing")
    with pytest.raises(actorch.EndpointError, match="private"):
        faulty.tell("_secret")
    with pytest.raises(actorch.EndpointError, match="bad arguments for 'echo'"):
        faulty.tell(Faulty.echo, 1, 2)


async def test_lookup_of_a_missing_name_raises_not_found_at_the_enclosing_deadline(world: LocalWorld) -> None:
    started = time.monotonic()
    with pytest.raises(actorch.ActorNotFoundError) as info:
        async with asyncio.timeout(0.1):
            await world[1].lookup("nobody/here")
    assert time.monotonic() - started < 1.0
    assert "'nobody/here'" in str(info.value)
    assert "node 1" in str(info.value)


async def test_lookup_of_a_missing_name_raises_not_found_after_the_lookup_timeout() -> None:
    async with local_world(2, lookup_timeout=0.2) as world:
        started = time.monotonic()
        with pytest.raises(actorch.ActorNotFoundError) as info:
            async with asyncio.timeout(5):
                await world[1].lookup("nobody/here")
        elapsed = time.monotonic() - started
    assert 0.15 < elapsed < 1.0
    assert "'nobody/here'" in str(info.value)
    assert "0.2 s" in str(info.value)


async def test_actor_not_found_error_is_also_a_lookup_error(world: LocalWorld) -> None:
    with pytest.raises(LookupError):
        async with asyncio.timeout(0.05):
            await world[0].lookup("nobody")


async def test_spawn_under_a_taken_name_raises_name_taken(world: LocalWorld) -> None:
    first = await world[0].spawn(Faulty, name="taken/x", on=1)
    for caller, on in ((0, 2), (2, 2), (1, 1)):
        with pytest.raises(actorch.NameTakenError) as taken:
            await world[caller].spawn(Faulty, name="taken/x", on=on)
        assert type(taken.value) is actorch.NameTakenError  # the registry's refusal, not an actor's RemoteError
        assert str(taken.value) == (
            f"name 'taken/x' is taken by <ActorRef actor 'taken/x' (Faulty) on node 1>; spawn on node {on} refused"
        )
    async with asyncio.timeout(5):
        assert await world[2].lookup("taken/x") == first
        assert await first.call(Faulty.echo, 1) == 1


@pytest.mark.parametrize(
    ("call", "options", "message"),
    [
        (
            "spawn",
            {"args": 5},
            "spawn(Faulty): args must be a tuple of positional arguments for Faulty.__init__, not 5 (int); "
            "one argument is args=(x,)",
        ),
        (
            "spawn",
            {"args": "abc"},
            "spawn(Faulty): args must be a tuple of positional arguments for Faulty.__init__, not 'abc' (str); "
            "one argument is args=(x,)",
        ),
        (
            "spawn",
            {"kwargs": [1]},
            "spawn(Faulty): kwargs must be a dict of keyword arguments for Faulty.__init__ (str keys), not [1] (list)",
        ),
        (
            "spawn_group",
            {"kwargs": {1: 2}},
            "spawn_group(Faulty): kwargs must be a dict of keyword arguments for Faulty.__init__ (str keys), "
            "not {1: 2} (dict)",
        ),
    ],
)
async def test_spawn_refuses_arguments_that_are_not_a_tuple_and_a_dict_naming_them(
    world: LocalWorld, call: str, options: dict[str, object], message: str
) -> None:
    spawn = world[0].spawn if call == "spawn" else lambda cls, **more: world[0].spawn_group(cls, 2, **more)
    received = world[1].statistics()["calls_received"]
    with pytest.raises(TypeError) as refused:
        await spawn(Faulty, on=1, **options)
    assert str(refused.value) == message
    assert world[1].statistics()["calls_received"] == received  # refused before anything was sent


@pytest.mark.parametrize("name", ["", "a//b", "bad name", "../x", "x" * (actorch.MAX_NAME_LENGTH + 1)])
async def test_spawn_with_an_invalid_name_raises_invalid_name(world: LocalWorld, name: str) -> None:
    with pytest.raises(actorch.InvalidNameError, match="invalid actor name"):
        await world[0].spawn(Faulty, name=name, on=1)
    assert await world[0].lookup_all("**") == []


@pytest.mark.parametrize("name", ["", "a//b", "bad name", "a/*"])
async def test_lookup_with_an_invalid_name_raises_invalid_name(world: LocalWorld, name: str) -> None:
    with pytest.raises(actorch.InvalidNameError):
        async with asyncio.timeout(1):
            await world[1].lookup(name)


async def test_lookup_all_with_an_invalid_pattern_raises_invalid_name(world: LocalWorld) -> None:
    with pytest.raises(actorch.InvalidNameError, match="invalid name pattern"):
        await world[1].lookup_all("a b")


STRICT_REFUSES_SETS = (
    "strict serialization refuses set values; send tensors, numbers, str, bytes, lists, tuples, dicts, "
    "actor refs or @serializable dataclasses"
)


async def test_strict_mode_refuses_a_set_argument_to_a_remote_actor_naming_the_endpoint_and_the_argument() -> None:
    async with local_world(2, strict=True) as world:
        faulty = await world[0].spawn(Faulty, name="strict/faulty", on=1)
        async with asyncio.timeout(5):
            with pytest.raises(actorch.SerializationError) as info:
                await faulty.call(Faulty.echo, {"ids": [3, {1, 2}]})
            assert await faulty.call(Faulty.echo, (1, 2)) == (1, 2)
            with pytest.raises(actorch.SerializationError) as told:
                faulty.tell(Faulty.echo, 1, twice={1})
    assert str(info.value) == (
        f"call to 'echo' of actor 'strict/faulty' (Faulty) on node 1: args[0]['ids'][1]: {STRICT_REFUSES_SETS}"
    )
    assert str(told.value) == (
        f"tell of 'echo' to actor 'strict/faulty' (Faulty) on node 1: kwargs['twice']: {STRICT_REFUSES_SETS}"
    )


async def test_strict_mode_refuses_a_set_result_from_a_remote_actor() -> None:
    async with local_world(2, strict=True) as world:
        faulty = await world[0].spawn(Faulty, name="strict/faulty", on=1)
        async with asyncio.timeout(5):
            with pytest.raises(actorch.SerializationError) as info:
                await faulty.call(Faulty.make_set)
            assert await faulty.call(Faulty.echo, 1) == 1
    assert re.fullmatch(
        rf"the result of 'make_set' on node 1 \(call \d+ from node 0\): value: {re.escape(STRICT_REFUSES_SETS)}",
        str(info.value),
    ), str(info.value)


async def test_an_argument_pickle_cannot_carry_names_the_endpoint_and_where_it_sits(world: LocalWorld) -> None:
    faulty = await world[0].spawn(Faulty, name="pickled/faulty", on=1)
    with pytest.raises(actorch.SerializationError) as info:
        await faulty.call(Faulty.echo, {"env": [1, lambda: 2]})
    assert str(info.value).startswith(
        "call to 'echo' of actor 'pickled/faulty' (Faulty) on node 1: args[0]['env'][1]: cannot serialize function "
        "value: Can't pickle local object"
    ), str(info.value)
    assert isinstance(info.value.__cause__, (pickle.PicklingError, AttributeError))  # pickle's own error, kept


async def test_strict_mode_lets_a_same_node_call_pass_a_set() -> None:
    async with local_world(2, strict=True) as world:
        faulty = await world[1].spawn(Faulty)
        async with asyncio.timeout(5):
            assert await faulty.call(Faulty.echo, {1, 2}) == {1, 2}


async def test_call_to_a_stopped_actor_raises_actor_stopped(world: LocalWorld, on: int) -> None:
    faulty = await world[0].spawn(Faulty, name="stopped/faulty", on=on)
    await faulty.stop()
    async with asyncio.timeout(5):
        with pytest.raises(actorch.ActorStoppedError) as info:
            await faulty.call(Faulty.echo, 1)
    message = str(info.value)
    assert "'echo'" in message
    assert "'stopped/faulty'" in message
    assert f"node {on}" in message


async def test_pending_call_to_a_killed_node_raises_node_lost(world: LocalWorld) -> None:
    faulty = await world[0].spawn(Faulty, name="lost/faulty", on=2)
    pending = asyncio.ensure_future(faulty.call(Faulty.sleep, 10))
    async with asyncio.timeout(5):
        assert await faulty.call(Faulty.echo, "alive") == "alive"
        world.kill(2)
        with pytest.raises(actorch.NodeLostError) as info:
            await pending
    message = str(info.value)
    assert "node 2" in message
    assert "'sleep'" in message
    assert "'lost/faulty'" in message


async def test_new_call_to_a_killed_node_raises_node_lost_at_once(world: LocalWorld) -> None:
    faulty = await world[0].spawn(Faulty, name="lost/faulty", on=2)
    world.kill(2)
    async with asyncio.timeout(1):
        with pytest.raises(actorch.NodeLostError) as info:
            await faulty.call(Faulty.echo, 1)
    message = str(info.value)
    assert "node 2" in message
    assert "'echo'" in message
    assert "'lost/faulty'" in message


async def test_spawn_on_a_killed_node_raises_node_lost(world: LocalWorld) -> None:
    world.kill(2)
    async with asyncio.timeout(1):
        with pytest.raises(actorch.NodeLostError, match="node 2"):
            await world[0].spawn(Faulty, on=2)


@pytest.mark.parametrize("endpoint", ["fail_group", "fail_needy"])
async def test_handler_exception_whose_class_needs_arguments_still_reaches_the_caller(
    world: LocalWorld, on: int, endpoint: str
) -> None:
    faulty = await world[0].spawn(Faulty, on=on)
    async with asyncio.timeout(5):
        with pytest.raises(actorch.RemoteError) as info:
            await faulty.call(endpoint)
    assert info.value.type_name.endswith(("GroupError", "NeedyError"))
    assert await faulty.call(Faulty.echo, 1) == 1


class Shapes(actorch.Actor):
    async def pair(self, x: int, y: int = 1) -> None: ...

    async def many(self, *xs: int) -> None: ...

    async def keyed(self, x: int, *, k: int) -> None: ...

    async def keyed_default(self, x: int, *, k: int = 3) -> None: ...


@pytest.mark.parametrize(
    ("endpoint", "args", "kwargs", "fits"),
    [
        ("pair", (), {}, False),
        ("pair", (1,), {}, True),
        ("pair", (1, 2), {}, True),
        ("pair", (1, 2, 3), {}, False),
        ("pair", (), {"x": 1}, True),
        ("many", (), {}, True),
        ("many", tuple(range(50)), {}, True),
        ("keyed", (1,), {}, False),
        ("keyed", (1,), {"k": 2}, True),
        ("keyed_default", (1,), {}, True),
        ("keyed_default", (1, 2), {}, False),
    ],
)
def test_tell_checks_the_arguments_against_the_signature(
    endpoint: str, args: tuple[object, ...], kwargs: dict[str, object], fits: bool
) -> None:
    endpoints = endpoints_of(Shapes)
    if fits:
        check_call(endpoints, endpoint, args, kwargs, "Shapes")
    else:
        with pytest.raises(actorch.EndpointError, match="bad arguments"):
            check_call(endpoints, endpoint, args, kwargs, "Shapes")


def test_a_tell_check_remembered_from_a_good_call_still_refuses_bad_arguments() -> None:
    endpoints = endpoints_of(Shapes)
    endpoints_module._shapes.clear()
    check_call(endpoints, "pair", (1,), {}, "Shapes")  # remembered: the next good call takes one lookup
    assert endpoints_module._shapes[endpoints["pair"]] == (1, 2)
    for args, kwargs in [((1, 2, 3), {}), ((), {}), ((1,), {"z": 2})]:
        with pytest.raises(actorch.EndpointError, match="bad arguments"):
            check_call(endpoints, "pair", args, kwargs, "Shapes")
    with pytest.raises(actorch.EndpointError, match="no endpoint"):
        check_call(endpoints, "nothing", (), {}, "Shapes")


def test_the_remembered_tell_checks_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoints_module, "_SHAPES_KEPT", 2)
    endpoints = endpoints_of(Shapes)
    endpoints_module._shapes.clear()
    for endpoint in ("pair", "many", "keyed_default"):
        check_call(endpoints, endpoint, (1,), {}, "Shapes")
    assert list(endpoints_module._shapes) == [endpoints["keyed_default"]]  # cleared when full, then kept anew
