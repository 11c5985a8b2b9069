"""Supervision: fatal errors, restart policies, kept state, and watching an actor stop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import structlog
from actors import Counter

import actorch
from actorch.testing import LocalWorld, local_world


class Corrupted(Exception):
    """The actor's state cannot be trusted any more."""


class FragileCounter(Counter):
    """A counter that can be corrupted (a fatal error) and notes each stop; four handlers run at once."""

    fatal_errors = (Corrupted,)
    max_concurrency = 4

    async def corrupt(self) -> None:
        raise Corrupted("the counter is corrupt")

    async def corrupt_later(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        raise Corrupted("the counter went corrupt")

    async def mistake(self) -> None:
        raise ValueError("an ordinary error")

    async def hang(self) -> None:
        await asyncio.Event().wait()

    async def on_stop(self) -> None:
        STOPS.append(self.value)


STOPS: list[int] = []


class Keeper(FragileCounter):
    """Keeps its value across restarts."""

    async def snapshot(self) -> int:
        return self.value

    def restore(self, state: int) -> None:
        self.value = state


class Flaky(FragileCounter):
    """Its on_start fails the first ``failures`` times after the first start."""

    starts = 0

    def __init__(self, failures: int = 1) -> None:
        super().__init__()
        self.failures = failures

    async def on_start(self) -> None:
        type(self).starts += 1
        if 1 < type(self).starts <= 1 + self.failures:
            raise RuntimeError(f"start {type(self).starts} failed")


class LateStarter(actorch.Actor):
    """Its first ``failures`` starts raise (a service it needs is not up yet)."""

    starts = 0

    def __init__(self, failures: int) -> None:
        self.failures = failures

    async def on_start(self) -> None:
        type(self).starts += 1
        if type(self).starts <= self.failures:
            raise ConnectionError(f"start {type(self).starts}: not up yet")

    async def started_after(self) -> int:
        return type(self).starts


class Batcher(actorch.Actor):
    fatal_errors = (Corrupted,)

    @actorch.batched(max_batch=2, max_wait=0.01)
    async def double(self, items: list[int]) -> list[int]:
        if -1 in items:
            raise Corrupted("a negative item")
        return [2 * item for item in items]


FAST = actorch.Restart(max_restarts=3, backoff=0.0)


@pytest.fixture(autouse=True)
def _reset() -> None:
    STOPS.clear()
    Flaky.starts = 0
    LateStarter.starts = 0


async def wait_for(predicate: Any, seconds: float = 2.0) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():  # noqa: ASYNC110 - polls runtime state that has no event
            await asyncio.sleep(0.005)


def cell_of(world: LocalWorld, ref: actorch.ActorRef[Any]) -> Any:
    return world._hosts[ref.rank].node.cell(ref._actor_id)


# ---------------------------------------------------------------------- without a policy


async def test_a_fatal_error_without_a_policy_stops_the_actor_for_good(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, args=(5,), name="counters/fatal", on=on)
    with pytest.raises(Corrupted, match="corrupt") as caught:
        await ref.call(FragileCounter.corrupt)
    assert isinstance(caught.value, actorch.RemoteError)  # the failing call gets its own error
    exit_ = await ref.wait_stopped()
    assert exit_ == actorch.ActorExit("failed", "Corrupted: the counter is corrupt", 0)
    assert exit_.failed
    with pytest.raises(actorch.ActorStoppedError):
        await ref.call(FragileCounter.get)
    assert await world[0].lookup_all("counters/*") == []
    assert STOPS == [5]  # on_stop ran once


async def test_an_ordinary_error_does_not_fail_the_actor(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, on=on, restart=FAST)
    with pytest.raises(ValueError, match="ordinary"):
        await ref.call(FragileCounter.mistake)
    assert await ref.call(FragileCounter.add, 2) == 2
    assert cell_of(world, ref).restarts == 0


# ---------------------------------------------------------------------- restarts


async def test_a_failed_actor_restarts_under_the_same_ref_and_name(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, args=(10,), name="counters/r", on=on, restart=FAST)
    assert await ref.call(FragileCounter.add, 5) == 15
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(Corrupted):
            await ref.call(FragileCounter.corrupt)
        await wait_for(lambda: cell_of(world, ref).restarts == 1 and not cell_of(world, ref).paused)
    assert await ref.call(FragileCounter.get) == 10  # a new instance, built from the spawn's arguments
    assert await world[1].lookup("counters/r") == ref
    assert STOPS == [15]
    events = [entry["event"] for entry in logs]
    assert "actor failed" in events
    assert "actor restarted" in events
    failed = next(entry for entry in logs if entry["event"] == "actor failed")
    assert failed["error"] == "Corrupted: the counter is corrupt"
    assert "Corrupted" in failed["exception"]
    assert "cell.py" not in failed["exception"], "the runtime's frames that ran the handler are left out"


async def test_calls_in_flight_at_the_failure_get_actor_stopped(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, on=on, restart=actorch.Restart(backoff=0.2))
    hanging = [asyncio.ensure_future(ref.call(FragileCounter.hang)) for _ in range(3)]
    failing = asyncio.ensure_future(ref.call(FragileCounter.corrupt_later, 0.1))
    await asyncio.sleep(0.02)
    queued = asyncio.ensure_future(ref.call(FragileCounter.add, 1))  # 4 run at most: this one waits
    with pytest.raises(Corrupted):
        await failing
    for call in [*hanging, queued]:
        with pytest.raises(actorch.ActorStoppedError, match="failed"):
            await call


async def test_calls_made_while_the_actor_restarts_reach_the_new_instance(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, args=(100,), on=on, restart=actorch.Restart(backoff=0.2))
    with pytest.raises(Corrupted):
        await ref.call(FragileCounter.corrupt)
    started = time.monotonic()
    assert await asyncio.gather(*(ref.call(FragileCounter.add, 1) for _ in range(5))) == [101, 102, 103, 104, 105]
    assert time.monotonic() - started >= 0.15  # they waited out the backoff
    ref.tell(FragileCounter.add, 10)
    assert await ref.call(FragileCounter.get) == 115


async def test_snapshot_and_restore_keep_state_across_a_restart(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Keeper, on=on, restart=FAST)
    await ref.call(Keeper.add, 42)
    with pytest.raises(Corrupted):
        await ref.call(Keeper.corrupt)
    await wait_for(lambda: cell_of(world, ref).restarts == 1)
    assert await ref.call(Keeper.get) == 42


async def test_a_failing_snapshot_lets_the_actor_restart_fresh(world: LocalWorld) -> None:
    class_ = Keeper
    ref = await world[0].spawn(class_, on=1, restart=FAST)
    await ref.call(Keeper.add, 3)
    cell = cell_of(world, ref)

    async def broken() -> int:
        raise OSError("disk full")

    cell.instance.snapshot = broken
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(Corrupted):
            await ref.call(Keeper.corrupt)
        await wait_for(lambda: cell.restarts == 1)
    assert await ref.call(Keeper.get) == 0
    assert any(entry["event"].startswith("snapshot failed") for entry in logs)


async def test_restarts_beyond_the_policy_stop_the_actor(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, on=on, restart=actorch.Restart(max_restarts=2, backoff=0.0))
    for expected in (1, 2):
        with pytest.raises(Corrupted):
            await ref.call(FragileCounter.corrupt)
        await wait_for(
            lambda expected=expected: cell_of(world, ref) is None or cell_of(world, ref).restarts == expected
        )
    with pytest.raises(Corrupted):
        await ref.call(FragileCounter.corrupt)
    exit_ = await ref.wait_stopped()
    assert (exit_.reason, exit_.restarts) == ("failed", 2)
    with pytest.raises(actorch.ActorStoppedError):
        await ref.call(FragileCounter.get)


async def test_failures_older_than_the_window_do_not_count(world: LocalWorld) -> None:
    ref = await world[0].spawn(FragileCounter, on=1, restart=actorch.Restart(max_restarts=1, within=0.1, backoff=0.0))
    for restarts in (1, 2, 3):
        with pytest.raises(Corrupted):
            await ref.call(FragileCounter.corrupt)
        await wait_for(lambda restarts=restarts: cell_of(world, ref).restarts == restarts)
        await asyncio.sleep(0.15)
    assert await ref.call(FragileCounter.add) == 1


async def test_backoff_grows_with_each_failure_counted() -> None:
    policy = actorch.Restart(backoff=0.1, factor=3.0, max_backoff=0.5)
    assert [policy.delay(n) for n in (1, 2, 3)] == [pytest.approx(0.1), pytest.approx(0.3), 0.5]


async def test_an_on_start_that_fails_during_a_restart_counts_as_a_failure(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Flaky, args=(2,), on=on, restart=actorch.Restart(max_restarts=3, backoff=0.0))
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(Corrupted):
            await ref.call(Flaky.corrupt)
        assert await ref.call(Flaky.add, 7) == 7  # it waited through two failed starts
    assert cell_of(world, ref).restarts == 1
    assert [entry["event"] for entry in logs].count("restart failed") == 2


async def test_an_on_start_that_keeps_failing_stops_the_actor(world: LocalWorld) -> None:
    ref = await world[0].spawn(Flaky, args=(10,), on=1, restart=actorch.Restart(max_restarts=2, backoff=0.0))
    with pytest.raises(Corrupted):
        await ref.call(Flaky.corrupt)
    exit_ = await ref.wait_stopped()
    assert exit_.reason == "failed"
    assert exit_.error is not None
    assert "RuntimeError: start" in exit_.error


async def test_a_first_start_that_fails_is_tried_again_under_a_policy(world: LocalWorld, on: int) -> None:
    with structlog.testing.capture_logs() as logs:
        ref = await world[0].spawn(
            LateStarter, args=(2,), name="late", on=on, restart=actorch.Restart(max_restarts=2, backoff=0.01)
        )
    assert await ref.call(LateStarter.started_after) == 3
    assert await world[1].lookup("late") == ref
    assert [entry["event"] for entry in logs].count("actor failed to start; starting it again") == 2


async def test_a_first_start_that_keeps_failing_fails_the_spawn_and_frees_the_name(world: LocalWorld, on: int) -> None:
    hosted = world[on].statistics()["actors"]
    with pytest.raises(ConnectionError, match="start 2: not up yet"):
        await world[0].spawn(LateStarter, args=(5,), name="late", on=on, restart=actorch.Restart(max_restarts=1))
    assert LateStarter.starts == 2
    assert await world[0].lookup_all("late") == []
    assert world[on].statistics()["actors"] == hosted


async def test_a_batched_endpoint_that_raises_a_fatal_error_fails_the_actor(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(Batcher, on=on, restart=FAST)
    results = await asyncio.gather(ref.call(Batcher.double, 1), ref.call(Batcher.double, -1), return_exceptions=True)
    assert all(isinstance(result, Corrupted) for result in results)
    await wait_for(lambda: cell_of(world, ref).restarts == 1)
    assert await ref.call(Batcher.double, 4) == 8


async def test_stopping_an_actor_while_it_restarts_stops_it(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, on=on, restart=actorch.Restart(backoff=5.0))
    with pytest.raises(Corrupted):
        await ref.call(FragileCounter.corrupt)
    waiting = asyncio.ensure_future(ref.call(FragileCounter.get))
    await asyncio.sleep(0.02)
    started = time.monotonic()
    await ref.stop()
    assert time.monotonic() - started < 1.5
    with pytest.raises(actorch.ActorStoppedError):
        await waiting
    assert (await ref.wait_stopped()).reason == "stopped"
    assert STOPS == [0]  # on_stop ran once, for the failed instance


# ---------------------------------------------------------------------- watching


async def test_wait_stopped_returns_when_the_actor_is_stopped(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, on=on, name="watched")
    watcher = asyncio.ensure_future(ref.wait_stopped())
    await asyncio.sleep(0.02)
    assert not watcher.done()
    await ref.stop()
    assert await watcher == actorch.ActorExit("stopped")
    assert await ref.wait_stopped() == actorch.ActorExit("stopped")  # late watchers hear it too
    await world[0].spawn(FragileCounter, on=on, name="watched")  # the name was free when the watcher woke


async def test_wait_stopped_waits_through_restarts(world: LocalWorld) -> None:
    ref = await world[0].spawn(FragileCounter, on=2, restart=FAST)
    watcher = asyncio.ensure_future(ref.wait_stopped())
    with pytest.raises(Corrupted):
        await ref.call(FragileCounter.corrupt)
    await wait_for(lambda: cell_of(world, ref).restarts == 1)
    assert not watcher.done()
    await ref.stop()
    assert await watcher == actorch.ActorExit("stopped", None, 1)


async def test_wait_stopped_reports_a_lost_node(world: LocalWorld) -> None:
    ref = await world[0].spawn(FragileCounter, on=2)
    watcher = asyncio.ensure_future(ref.wait_stopped())
    await asyncio.sleep(0.02)
    world.kill(2)
    exit_ = await watcher
    assert exit_.reason == "node_lost"
    assert exit_.failed
    assert "node 2" in (exit_.error or "")


async def test_wait_stopped_reports_shutdown() -> None:
    async with local_world(2) as world:
        ref = await world[0].spawn(FragileCounter, on=1)
        watcher = asyncio.ensure_future(ref.wait_stopped())
        await asyncio.sleep(0.02)
        await world._hosts[1].stop_all()
        assert await watcher == actorch.ActorExit("shutdown")


async def test_wait_stopped_respects_the_callers_deadline(world: LocalWorld, on: int) -> None:
    ref = await world[0].spawn(FragileCounter, on=on)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await ref.wait_stopped()
    assert await ref.call(FragileCounter.add) == 1


async def test_wait_stopped_on_a_node_service_is_refused(world: LocalWorld) -> None:
    with pytest.raises(actorch.EndpointError, match="system service"):
        await world._hosts[0].services[1].wait_stopped()


# ---------------------------------------------------------------------- stopping with inline calls


async def test_a_same_node_call_running_when_its_actor_stops_gets_actor_stopped(world: LocalWorld) -> None:
    ref = await world[0].spawn(FragileCounter, on=0)
    hanging = asyncio.ensure_future(ref.call(FragileCounter.hang))  # runs inline, in this caller's task
    await asyncio.sleep(0.02)
    started = time.monotonic()
    await ref.stop()
    assert time.monotonic() - started < 1.5  # stop_grace is 0.5 s in this world
    with pytest.raises(actorch.ActorStoppedError, match="stopped while handling 'hang'"):
        await hanging
    assert not hanging.cancelled()


# ---------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_restarts": -1},
        {"max_restarts": 1.5},
        {"within": 0},
        {"backoff": -0.1},
        {"max_backoff": float("inf")},
        {"factor": 0.5},
        {"factor": True},
    ],
)
def test_restart_refuses_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        actorch.Restart(**kwargs)


async def test_spawn_refuses_a_restart_that_is_not_a_policy(world: LocalWorld) -> None:
    with pytest.raises(TypeError, match="restart must be"):
        await world[0].spawn(FragileCounter, restart=3)  # type: ignore[arg-type]


def test_fatal_errors_must_be_a_tuple_of_exception_classes() -> None:
    with pytest.raises(TypeError, match="fatal_errors"):

        class Wrong(actorch.Actor):
            fatal_errors = (ValueError, "oops")  # type: ignore[assignment]


def test_actor_exit_says_whether_the_actor_failed() -> None:
    assert actorch.ActorExit("node_lost").failed
    assert not actorch.ActorExit("stopped").failed
    assert not actorch.ActorExit("shutdown").failed


class TimesOutOnStop(actorch.Actor):
    async def on_stop(self) -> None:
        raise TimeoutError("its own timeout, not the runtime's")


async def test_an_on_stop_raising_timeout_error_itself_is_logged_as_a_failure(world: LocalWorld) -> None:
    ref = await world[0].spawn(TimesOutOnStop, on=1)
    with structlog.testing.capture_logs() as logs:
        await ref.stop()
    assert [entry["event"] for entry in logs if entry["event"].startswith("on_stop")] == ["on_stop failed"]
