"""``current_deadline``: the earliest deadline among asyncio, anyio and inherited scopes."""

# ruff: noqa: ASYNC100 - the scopes here are opened for the deadline they set, not to time anything out

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import anyio
import pytest

from actorch._base.deadline import (
    DeadlineLoop,
    PastDeadlineError,
    current_deadline,
    deadline_of,
    inherited_deadline,
    within,
)


def remaining() -> float:
    deadline = current_deadline()
    assert deadline is not None
    return deadline - asyncio.get_running_loop().time()


async def test_current_deadline_is_none_without_any_scope() -> None:
    assert current_deadline() is None


async def test_current_deadline_follows_asyncio_timeout() -> None:
    async with asyncio.timeout(10):
        assert remaining() == pytest.approx(10, abs=0.5)


async def test_current_deadline_follows_asyncio_timeout_at() -> None:
    loop = asyncio.get_running_loop()
    when = loop.time() + 7
    async with asyncio.timeout_at(when):
        assert current_deadline() == pytest.approx(when, abs=1e-6)


async def test_current_deadline_ignores_asyncio_timeout_none() -> None:
    async with asyncio.timeout(None):
        assert current_deadline() is None


async def test_current_deadline_follows_asyncio_timeout_rescheduled() -> None:
    async with asyncio.timeout(10) as scope:
        scope.reschedule(asyncio.get_running_loop().time() + 3)
        assert remaining() == pytest.approx(3, abs=0.5)


async def test_current_deadline_follows_anyio_fail_after() -> None:
    with anyio.fail_after(5):
        assert remaining() == pytest.approx(5, abs=0.5)


async def test_current_deadline_follows_anyio_move_on_after() -> None:
    with anyio.move_on_after(4):
        assert remaining() == pytest.approx(4, abs=0.5)


async def test_current_deadline_is_the_earliest_of_nested_asyncio_timeouts() -> None:
    async with asyncio.timeout(2), asyncio.timeout(10):
        assert remaining() == pytest.approx(2, abs=0.5)


async def test_current_deadline_takes_an_inner_anyio_scope_when_it_is_earlier() -> None:
    async with asyncio.timeout(10):
        with anyio.fail_after(2):
            assert remaining() == pytest.approx(2, abs=0.5)


async def test_current_deadline_takes_an_outer_anyio_scope_when_it_is_earlier() -> None:
    with anyio.fail_after(2):
        async with asyncio.timeout(10):
            assert remaining() == pytest.approx(2, abs=0.5)


async def test_current_deadline_takes_an_inner_asyncio_timeout_when_it_is_earlier() -> None:
    with anyio.fail_after(10):
        async with asyncio.timeout(1):
            assert remaining() == pytest.approx(1, abs=0.5)


async def test_current_deadline_is_none_again_after_the_scope_exits() -> None:
    async with asyncio.timeout(10):
        pass
    with anyio.fail_after(10):
        pass
    assert current_deadline() is None


async def test_current_deadline_ignores_the_timeouts_of_other_tasks() -> None:
    started = asyncio.Event()

    async def other() -> None:
        async with asyncio.timeout(1):
            started.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(other())
    try:
        await started.wait()
        assert current_deadline() is None
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_current_deadline_includes_an_inherited_deadline() -> None:
    loop = asyncio.get_running_loop()
    token = inherited_deadline.set(loop.time() + 3)
    try:
        assert remaining() == pytest.approx(3, abs=0.5)
        async with asyncio.timeout(1):
            assert remaining() == pytest.approx(1, abs=0.5)
        async with asyncio.timeout(10):
            assert remaining() == pytest.approx(3, abs=0.5)
    finally:
        inherited_deadline.reset(token)


async def test_current_deadline_outside_a_task_is_the_inherited_one() -> None:
    loop = asyncio.get_running_loop()
    seen: asyncio.Future[object] = loop.create_future()
    token = inherited_deadline.set(123.0)
    try:
        loop.call_soon(lambda: seen.set_result(current_deadline()))
    finally:
        inherited_deadline.reset(token)
    async with asyncio.timeout(5):
        assert await seen == 123.0


async def test_within_cancels_a_handler_past_its_deadline_and_says_so() -> None:
    loop = asyncio.get_running_loop()
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(PastDeadlineError):
        await within(slow(), loop.time() + 0.01)
    assert cancelled.is_set()


async def test_within_passes_a_handlers_own_timeout_error_and_result_through() -> None:
    loop = asyncio.get_running_loop()

    async def own_timeout() -> None:
        raise TimeoutError("mine")

    async def answer() -> int:
        return 42

    with pytest.raises(TimeoutError, match="mine") as info:
        await within(own_timeout(), loop.time() + 5)
    assert not isinstance(info.value, PastDeadlineError)
    assert await within(answer(), loop.time() + 5) == 42


async def test_the_tests_run_on_the_loop_that_files_timeouts_by_task() -> None:
    assert type(asyncio.get_running_loop()) is DeadlineLoop  # as actorch.run's nodes do (conftest)


async def _asyncio_scopes_as_a_call_reads_them() -> list[float | None]:
    """What current_deadline reads through asyncio.timeout scopes: entered, nested, moved, left, and another task's."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    seen: list[float | None] = [current_deadline()]
    sleepers = [asyncio.ensure_future(asyncio.sleep(30)) for _ in range(50)]  # timers that are not scopes
    async with asyncio.timeout_at(now + 20) as outer:
        seen.append(current_deadline())
        async with asyncio.timeout_at(now + 5):
            seen.append(current_deadline())
        seen.append(current_deadline())
        outer.reschedule(now + 8)
        seen.append(current_deadline())

        async def other() -> float | None:
            async with asyncio.timeout_at(now + 1):
                return deadline_of(task, math.inf)  # this task's scope, read from another one

        task = asyncio.current_task()
        assert task is not None
        seen.append(await asyncio.create_task(other()))
    seen.append(current_deadline())
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)
    seen.append(current_deadline())  # a scope that expired is gone too (asyncio leaves its timer uncancelled)
    for sleeper in sleepers:
        sleeper.cancel()
    return [None if value is None else round(value - now, 6) for value in seen]


@pytest.mark.parametrize("loop_factory", [DeadlineLoop, asyncio.SelectorEventLoop], ids=["filed", "scanned"])
def test_asyncio_scopes_read_the_same_on_the_filing_loop_and_any_other(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        seen = runner.run(_asyncio_scopes_as_a_call_reads_them())
    assert seen == [None, 20, 5, 20, 8, 8, None, None]


async def test_the_loop_files_only_timeout_timers_and_forgets_a_task_once_it_ends() -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, DeadlineLoop)

    async def scoped(rounds: int) -> int:
        for _ in range(rounds):
            async with asyncio.timeout(30):
                await asyncio.sleep(0)  # a sleep(0) arms no timer; sleep(x) would, and is not filed
            await asyncio.sleep(0.001)
        task = asyncio.current_task()
        assert task is not None
        kept = len(loop.timeouts_by_task[task])
        assert current_deadline() is None
        assert loop.timeouts_by_task[task] == []  # a read that found every scope left empties the list
        return kept

    task = asyncio.create_task(scoped(200))
    assert await task <= 2  # scopes left are dropped as new ones are filed: a long-lived task does not pile up
    await asyncio.sleep(0)  # the task's done callback runs
    assert task not in loop.timeouts_by_task
    assert loop.timeouts_by_task == {}
