"""``actorch.run`` options checked before anything starts, and the transport's liveness settings."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import structlog

import actorch
from actorch._launch.world import run as run_module
from actorch._launch.world.eventloop import LEFTOVER_WAIT, run_bounded
from actorch._launch.world.interrupts import INTERRUPT_EXIT_CODE, TERMINATE_EXIT_CODE, InterruptWatcher


async def answer(system: actorch.ActorSystem) -> int:
    return system.world_size * 42


def test_run_in_one_process_returns_what_main_returned() -> None:
    assert actorch.run(answer, configure_logs=False) == 42


@pytest.mark.parametrize(("rank", "warned"), [(0, 1), (1, 0)])
def test_run_under_torchrun_takes_torchruns_world_over_world_size_and_rank_0_says_so(
    monkeypatch: pytest.MonkeyPatch, rank: int, warned: int
) -> None:
    for key, value in {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ACTORCH_WORLD_SIZE", raising=False)
    joined: list[Any] = []
    monkeypatch.setattr(run_module, "node_transport", lambda world, plan: joined.append(world))
    monkeypatch.setattr(run_module, "_serve", lambda world, plan: joined.append(world))
    monkeypatch.setattr(run_module, "lead", lambda main, transport, plan: None)
    monkeypatch.setattr(run_module, "run_bounded", lambda lead, interrupts: "led")
    with structlog.testing.capture_logs() as logs:
        assert actorch.run(answer, world_size=3, configure_logs=False) == "led"
    assert joined[0].world_size == 2
    ignored = "run(world_size=3) is ignored: torchrun started 2 processes, and the launcher's count is the system's"
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == [ignored] * warned


@pytest.mark.parametrize("timeout", [0, -1.0, True, "3"])
def test_run_refuses_a_liveness_timeout_that_is_not_a_positive_number(timeout: Any) -> None:
    with pytest.raises(ValueError, match="liveness_timeout must be a positive number"):
        actorch.run(answer, liveness_timeout=timeout, configure_logs=False)


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
        "from actorch._launch.world.eventloop import Watchdog\n"
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


def test_run_bounded_restores_the_previous_wakeup_fd_and_sigint_handler() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    seen: list[int] = []

    async def work() -> None:
        current = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(current)
        seen.append(current)

    before = signal.set_wakeup_fd(ours.fileno())
    try:
        run_bounded(work())
        assert signal.set_wakeup_fd(before) == ours.fileno(), "the previous wakeup fd was not given back"
    finally:
        signal.set_wakeup_fd(before)
        ours.close()
        theirs.close()
    assert seen[0] not in (-1, ours.fileno()), "the interrupt watcher did not own the wakeup fd while running"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert InterruptWatcher.current is None


def test_run_bounded_outside_the_main_thread_leaves_signals_alone() -> None:
    seen: list[object] = []

    async def work() -> str:
        seen.append(signal.getsignal(signal.SIGINT))
        return "done"

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(run_bounded, work()).result(timeout=30) == "done"
    assert seen == [signal.default_int_handler]
    assert InterruptWatcher.current is None


def run_interrupted(body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` as the end of a script that imports what it needs; SIGINT behaves as in a terminal."""
    code = (
        "import asyncio, os, signal, threading, time\n"
        "import torch\n"
        "from actorch._launch.world.eventloop import run_bounded\n"
        "from actorch._launch.world.interrupts import InterruptPolicy\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "def ctrl_c(after):\n"
        "    threading.Timer(after, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "def cleaned():\n"
        "    return 'cleaned up'\n"
    ) + body
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.timeout(90)
def test_interrupt_watcher_ends_a_process_whose_main_thread_is_stuck_in_torch() -> None:
    done = run_interrupted(
        "async def main():\n"
        "    ctrl_c(0.3)\n"
        "    torch.futures.Future().wait()\n"
        "run_bounded(main(), interrupts=InterruptPolicy(respond_within=0.5, on_force=cleaned))\n"
        "print('not reached', flush=True)\n"
    )
    assert done.returncode == INTERRUPT_EXIT_CODE, done.stderr
    assert "Ctrl-C did not reach main within 0.5 s" in done.stderr
    assert "; cleaned up; process" in done.stderr, "on_force runs before the exit"
    assert "not reached" not in done.stdout


@pytest.mark.timeout(90)
def test_interrupt_watcher_ends_a_run_stuck_in_torch_on_sigterm_with_its_exit_code() -> None:
    done = run_interrupted(
        "async def main():\n"
        "    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "    torch.futures.Future().wait()\n"
        "run_bounded(main(), interrupts=InterruptPolicy(respond_within=0.5, terminate=True))\n"
    )
    assert done.returncode == TERMINATE_EXIT_CODE, done.stderr
    assert "SIGTERM did not reach main within 0.5 s" in done.stderr


@pytest.mark.timeout(90)
def test_interrupt_watcher_ends_a_process_at_once_on_a_second_ctrl_c() -> None:
    done = run_interrupted(
        "async def main():\n"
        "    ctrl_c(0.3)\n"
        "    ctrl_c(1.0)\n"
        "    try:\n"
        "        await asyncio.sleep(600)\n"
        "    except asyncio.CancelledError:\n"
        "        print('cancelled', flush=True)\n"
        "        await asyncio.sleep(600)\n"  # a clean-up that would take far too long
        "run_bounded(main(), interrupts=InterruptPolicy(respond_within=60, finish_within=60))\n"
    )
    assert done.returncode == INTERRUPT_EXIT_CODE, done.stderr
    assert "cancelled" in done.stdout, "the first Ctrl-C cancels main"
    assert "actorch: a second Ctrl-C; process" in done.stderr


@pytest.mark.timeout(90)
def test_interrupt_watcher_ends_a_shutdown_that_overruns_its_bound() -> None:
    done = run_interrupted(
        "async def main():\n"
        "    ctrl_c(0.3)\n"
        "    try:\n"
        "        await asyncio.sleep(600)\n"
        "    finally:\n"
        "        torch.futures.Future().wait()\n"  # the clean-up itself gets stuck
        "run_bounded(main(), interrupts=InterruptPolicy(respond_within=60, finish_within=0.5))\n"
    )
    assert done.returncode == INTERRUPT_EXIT_CODE, done.stderr
    assert "the shutdown after Ctrl-C did not end within 0.5 s" in done.stderr


@pytest.mark.timeout(90)
def test_run_bounded_still_raises_keyboard_interrupt_after_an_orderly_ctrl_c() -> None:
    done = run_interrupted(
        "async def main():\n"
        "    ctrl_c(0.3)\n"
        "    try:\n"
        "        await asyncio.sleep(600)\n"
        "    finally:\n"
        "        print('cleaned up', flush=True)\n"
        "try:\n"
        "    run_bounded(main(), interrupts=InterruptPolicy(respond_within=5, finish_within=2))\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "time.sleep(2.5)\n"  # past both bounds: the watcher is gone with run_bounded
        "print('still here', flush=True)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cleaned", "up", "interrupted", "still", "here"]
    assert "exits with code" not in done.stderr


@pytest.mark.timeout(90)
def test_interrupt_watcher_does_not_count_a_forked_childs_sigint_as_a_second_ctrl_c() -> None:
    done = run_interrupted(
        "async def main():\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"  # a DataLoader worker, say: it inherits the wakeup fd
        "        signal.signal(signal.SIGINT, lambda *args: None)\n"
        "        time.sleep(2.0)\n"
        "        os._exit(0)\n"
        "    ctrl_c(0.3)\n"
        "    threading.Timer(0.8, os.kill, (child, signal.SIGINT)).start()\n"
        "    try:\n"
        "        await asyncio.sleep(600)\n"
        "    except asyncio.CancelledError:\n"
        "        await asyncio.sleep(1.5)\n"  # still cleaning up when the child gets its SIGINT
        "        raise\n"
        "try:\n"
        "    run_bounded(main(), interrupts=InterruptPolicy(respond_within=30, finish_within=30))\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "interrupted" in done.stdout
    assert "a second Ctrl-C" not in done.stderr
