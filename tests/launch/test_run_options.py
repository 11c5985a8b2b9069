"""run()'s options for node set-up and flow: checked before anything starts, and run in one process too."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest

import actorch
from actorch.testing import local_world


async def rank_and_marker(system: actorch.ActorSystem) -> tuple[int, str | None]:
    return system.rank, os.environ.get("ACTORCH_RUN_OPTIONS_TEST")


def mark(rank: int) -> None:
    os.environ["ACTORCH_RUN_OPTIONS_TEST"] = f"node {rank}"


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "1 GiB"])
def test_run_refuses_a_send_budget_that_is_not_a_positive_int(value: Any) -> None:
    with pytest.raises(ValueError, match="send_budget must be an int >= 1, not"):
        actorch.run(rank_and_marker, world_size=2, send_budget=value, configure_logs=False)


class Sink(actorch.Actor):
    async def take(self, data: bytes) -> int:
        return len(data)


async def test_an_in_process_tell_over_the_send_budget_in_one_turn_raises_mailbox_full() -> None:
    async with local_world(2, send_budget=1000) as world:
        sink = await world[0].spawn(Sink, on=1)
        sink.tell(Sink.take, b"x" * 600)
        sink.tell(Sink.take, b"x" * 600)  # the first's bytes wait for this turn's bundle: 1,2xx > 1,000 next
        with pytest.raises(actorch.MailboxFullError, match=r"toward node 1 have not reached it \(send_budget 1,000;"):
            sink.tell(Sink.take, b"x" * 600)
        assert await sink.call(Sink.take, b"y") == 1  # a call waits for the bundle to leave, then goes


def test_run_refuses_a_setup_that_is_not_a_function() -> None:
    with pytest.raises(TypeError, match="setup must be a function of the node's rank"):
        actorch.run(rank_and_marker, world_size=2, setup="seed", configure_logs=False)  # type: ignore[arg-type]


ran: list[str] = []


def plain_main(system: actorch.ActorSystem) -> None:
    ran.append("plain_main")


class PlainCall:
    def __call__(self, system: actorch.ActorSystem) -> None:
        ran.append("PlainCall")


class AsyncCall:
    async def __call__(self, system: actorch.ActorSystem, suffix: str = "") -> str:
        return f"AsyncCall on node {system.rank}{suffix}"


async def tagged(system: actorch.ActorSystem, tag: str) -> str:
    return f"{tag} on node {system.rank}"


MAIN_MUST_BE = "run(main): main must be an async function that takes the system (async def main(system): ...), not "


class Untouchable:
    def __init__(self, system: actorch.ActorSystem) -> None:
        ran.append("Untouchable")


@pytest.mark.parametrize(
    ("main", "given"),
    [
        (plain_main, "the plain function 'plain_main': declare it async def"),
        (Untouchable, "the class 'Untouchable': pass an async function that takes the system"),
        ("main", "'main' (str)"),
    ],
    ids=["plain def", "class", "not callable"],
)
def test_run_refuses_a_main_that_cannot_give_an_awaitable_before_anything_starts(main: Any, given: str) -> None:
    with pytest.raises(TypeError) as refused:
        actorch.run(main, world_size=2, configure_logs=False)
    assert str(refused.value) == MAIN_MUST_BE + given
    assert ran == []


@pytest.mark.parametrize(
    ("main", "returned"),
    [
        (lambda system: tagged(system, "lambda"), "lambda on node 0"),
        (functools.partial(lambda system, tag: tagged(system, tag.upper()), tag="partial"), "PARTIAL on node 0"),
    ],
    ids=["lambda", "partial of a lambda"],
)
def test_run_takes_a_lambda_that_returns_a_coroutine_as_main(main: Any, returned: str) -> None:
    assert actorch.run(main, configure_logs=False) == returned


def test_run_refuses_what_a_lambda_or_a_plain_call_returned_when_it_is_not_awaitable() -> None:
    lam = lambda system: ran.append("lambda")  # noqa: E731 - a lambda is what is tested
    for main, name in ((lam, "lambda"), (PlainCall(), "PlainCall")):
        with pytest.raises(TypeError) as refused:
            actorch.run(main, configure_logs=False)
        assert str(refused.value) == f"{MAIN_MUST_BE}{main!r}, which returned NoneType, not an awaitable", name
    assert ran == ["lambda", "PlainCall"]  # called, once the system was up, and refused for what they returned
    ran.clear()


@pytest.mark.parametrize(
    ("main", "returned"),
    [
        (functools.partial(tagged, tag="partial"), "partial on node 0"),
        (AsyncCall(), "AsyncCall on node 0"),
        (functools.partial(AsyncCall(), suffix="!"), "AsyncCall on node 0!"),
    ],
    ids=["partial", "async __call__", "partial of an async __call__"],
)
def test_run_takes_a_partial_or_an_object_with_an_async_call_as_main(main: Any, returned: str) -> None:
    assert actorch.run(main, configure_logs=False) == returned


@pytest.mark.parametrize("value", ["loud", 10, ""])
def test_run_refuses_a_log_level_that_is_not_a_level_naming_the_levels(value: Any) -> None:
    with pytest.raises(ValueError, match="must be one of") as refused:
        actorch.run(rank_and_marker, world_size=2, log_level=value, configure_logs=False)
    assert str(refused.value) == (
        "log_level must be one of 'debug', 'info', 'warning', 'error', 'critical' (in any case), "
        f"or None for $ACTORCH_LOG_LEVEL (else 'warning'), not {value!r}"
    )


def test_run_in_one_process_runs_setup_before_main(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACTORCH_RUN_OPTIONS_TEST", raising=False)
    assert actorch.run(rank_and_marker, setup=mark, configure_logs=False) == (0, "node 0")


def test_run_in_one_process_raises_what_setup_raised() -> None:
    def broken(rank: int) -> None:
        raise OSError(f"no GPU on node {rank}")

    with pytest.raises(OSError, match="no GPU on node 0"):
        actorch.run(rank_and_marker, setup=broken, configure_logs=False)
