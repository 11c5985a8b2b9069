"""``actorch.run`` options checked before anything starts, and the transport's liveness settings."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from typing import Any

import pytest
import structlog

import actorch
from actorch._launch.eventloop import LEFTOVER_WAIT, run_bounded
from actorch._transport.rpc_setup import RpcOptions


async def answer(system: actorch.ActorSystem) -> int:
    return system.world_size * 42


def test_run_in_one_process_returns_what_main_returned() -> None:
    assert actorch.run(answer, configure_logs=False) == 42


@pytest.mark.parametrize("timeout", [0, -1.0, True, "3"])
def test_run_refuses_a_liveness_timeout_that_is_not_a_positive_number(timeout: Any) -> None:
    with pytest.raises(ValueError, match="liveness_timeout must be a positive number"):
        actorch.run(answer, liveness_timeout=timeout, configure_logs=False)


def test_rpc_options_heartbeat_must_fit_twice_in_the_liveness_timeout() -> None:
    assert RpcOptions(heartbeat_interval=1.0, liveness_timeout=2.0).liveness_timeout == 2.0
    with pytest.raises(ValueError, match="heartbeat_interval must be > 0 and at most half"):
        RpcOptions(heartbeat_interval=1.5, liveness_timeout=2.0)
    with pytest.raises(ValueError, match="heartbeat_interval must be > 0"):
        RpcOptions(heartbeat_interval=0.0)


async def test_run_refuses_to_start_inside_a_running_event_loop() -> None:
    with pytest.raises(RuntimeError, match="cannot be called from a running event loop"):
        actorch.run(answer, configure_logs=False)


@pytest.mark.parametrize(
    ("option", "value"), [("mailbox_size", 0), ("max_message_size", 0), ("stop_grace", -1), ("lookup_timeout", "x")]
)
def test_run_refuses_bad_limits_before_starting_anything(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        actorch.run(answer, configure_logs=False, **{option: value})


def test_run_bounded_returns_the_result_and_closes_its_loop() -> None:
    async def work() -> int:
        return 7

    assert run_bounded(work()) == 7
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def test_run_bounded_abandons_a_task_that_swallows_its_cancellation() -> None:
    async def stubborn() -> None:
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def main() -> str:
        asyncio.get_running_loop().create_task(stubborn(), name="stubborn")
        await asyncio.sleep(0)
        return "done"

    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        assert run_bounded(main()) == "done"
    assert time.monotonic() - started < LEFTOVER_WAIT + 1.0
    stuck = [entry for entry in logs if entry["event"].startswith("tasks ignored cancellation")]
    assert stuck[0]["tasks"] == ["stubborn"]


def test_run_bounded_cancels_leftover_tasks_that_do_end() -> None:
    ended: list[str] = []

    async def polite() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append("polite")

    async def main() -> None:
        asyncio.get_running_loop().create_task(polite())
        await asyncio.sleep(0)

    started = time.monotonic()
    run_bounded(main())
    assert ended == ["polite"]
    assert time.monotonic() - started < 1.0


def test_watchdog_ends_the_process_with_its_code_once_armed() -> None:
    code = (
        "import time\n"
        "from actorch._launch.eventloop import Watchdog\n"
        "dog = Watchdog(0.2)\n"
        "dog.code = 3\n"
        "time.sleep(0.3)\n"
        "print('still here', flush=True)\n"
        "dog.arm('the test armed it')\n"
        "time.sleep(5)\n"
        "print('not reached', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 3
    assert "still here" in done.stdout
    assert "not reached" not in done.stdout
    assert "did not exit within 0.2 s after the test armed it" in done.stderr
