"""``actorch.start`` and ``actorch.connect`` in one process: options, the ``Opening``, ``shutdown``, cancellation.

A one-node ``start`` runs in-process, in the test's own loop. The multi-process
forms are in ``test_driver_multiprocess`` and ``test_notebook``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from _mp import refused_port
from actors import Counter, Slow, Stopper

import actorch
from actorch._launch.world import connect as connect_module
from actorch.testing import LocalWorld


def test_start_drives_a_one_node_system_from_a_plain_event_loop(tmp_path: Path) -> None:
    async def drive() -> list[Any]:
        assert type(asyncio.get_running_loop()).__name__ != "DeadlineLoop"
        system = await actorch.start(configure_logs=False)
        assert system.rank == 0
        counter = await system.spawn(Counter, args=(1,), name="counter")
        stopper = await system.spawn(Stopper, args=(str(tmp_path / "stopped"),))
        slow = await system.spawn(Slow)
        async with asyncio.timeout(5):  # deadlines read on a plain loop too
            seen = [await counter.call(Counter.add, 2), await (await system.lookup("counter")).call(Counter.add)]
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await slow.call(Slow.slow, "late", 10.0)
        await asyncio.gather(system.shutdown(), system.shutdown())  # the second waits for the first
        await system.shutdown()
        with pytest.raises(actorch.ActorchError):
            await stopper.call(Stopper.where)
        return seen

    with asyncio.Runner() as runner:  # asyncio's own loop, as a notebook's kernel runs
        assert runner.run(drive()) == [3, 4]
    assert (tmp_path / "stopped").read_text().startswith("stopped on node 0")


async def test_start_as_a_context_manager_shuts_down_when_the_block_raises(tmp_path: Path) -> None:
    async def use_then_fail() -> None:
        async with actorch.start(world_size=1, configure_logs=False) as system:
            await system.spawn(Stopper, args=(str(tmp_path / "stopped"),))
            raise ValueError("in the block")

    with pytest.raises(ValueError, match="in the block"):
        await use_then_fail()
    assert (tmp_path / "stopped").exists()
    async with actorch.start(configure_logs=False) as again:  # the process is free for another system
        assert await (await again.spawn(Counter)).call(Counter.add) == 1


async def test_an_opening_opens_once_and_a_process_runs_one_system_at_a_time() -> None:
    opening = actorch.start(configure_logs=False)
    assert "unopened" in repr(opening)
    system = await opening
    try:
        assert "opened" in repr(opening)
        with pytest.raises(RuntimeError, match="opens once"):
            await opening
        with pytest.raises(RuntimeError, match="already runs an actor system"):
            await actorch.start(configure_logs=False)
    finally:
        await system.shutdown()


async def test_start_cancelled_while_it_opens_shuts_down_what_it_opened() -> None:
    setting_up, proceed = asyncio.Event(), asyncio.Event()

    async def setup(rank: int) -> None:  # rank 0's setup runs while the system opens
        setting_up.set()
        await proceed.wait()

    waiting = asyncio.ensure_future(_opened(actorch.start(setup=setup, configure_logs=False)))
    await setting_up.wait()
    waiting.cancel()
    proceed.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    async with actorch.start(configure_logs=False) as system:  # what it opened was shut down
        assert system.rank == 0


async def _opened(opening: Any) -> actorch.ActorSystem:
    return await opening


async def test_a_class_defined_in_a_notebook_cell_is_spawned_on_this_node_only(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    interactive = types.ModuleType("__main__")  # a kernel's __main__: no file that a worker could import
    cell = type("CellCounter", (Counter,), {"__module__": "__main__"})
    interactive.CellCounter = cell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", interactive)
    here = await world[0].spawn(cell)
    assert await here.call(Counter.add) == 1
    with pytest.raises(TypeError, match=r"cannot spawn CellCounter on node 1: .*\(a \.py file beside the notebook\)"):
        await world[0].spawn(cell, on=1)


async def test_shutdown_belongs_to_systems_this_process_drives(world: LocalWorld) -> None:
    with pytest.raises(actorch.UnsupportedError, match="shuts down when main returns"):
        await world[0].shutdown()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"world_size": 0}, ValueError, "world_size must be a positive int"),
        ({"world_size": True}, ValueError, "world_size must be a positive int"),
        ({"world_size": 2, "port": -1}, ValueError, "port must be an int"),
        ({"liveness_timeout": 0}, ValueError, "liveness_timeout must be a positive number"),
        ({"devices": "nowhere"}, ValueError, "devices must be 'stage' or 'strict'"),
        (
            {"elastic": True, "transport": actorch.TorchRpc(device_maps={"cuda:0": "cuda:0"})},
            ValueError,
            "no device maps",
        ),
        ({"setup": 3}, TypeError, "setup must be a function"),
        ({"setup": lambda system: None}, TypeError, "asks for the system"),
    ],
)
def test_start_refuses_bad_options_before_anything_starts(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        actorch.start(configure_logs=False, **kwargs)


def test_run_and_start_make_the_snapshot_directory_or_refuse_it_before_anything_starts(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")

    async def main(system: actorch.ActorSystem) -> bool:
        return (tmp_path / "new" / "snapshots").is_dir()

    refused = r"\(snapshots=.*a-file/dir'\): cannot make the directory: Not a directory; nothing started"
    with pytest.raises(NotADirectoryError, match=f"run{refused}"):
        actorch.run(main, snapshots=blocked / "dir", configure_logs=False)
    with pytest.raises(NotADirectoryError, match=f"start{refused}"):
        actorch.start(snapshots=blocked / "dir", configure_logs=False)
    assert actorch.run(main, snapshots=tmp_path / "new" / "snapshots", configure_logs=False)


def test_start_under_torchrun_points_at_run(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(actorch.UnsupportedError, match=r"under torchrun, call actorch\.run"):
        actorch.start(configure_logs=False)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "connect\\(\\) needs the system's address"),
        ({"address": "nowhere"}, ValueError, "host:port"),
        ({"address": "127.0.0.1:1", "name": ""}, ValueError, "name must be a non-empty str"),
        ({"address": "127.0.0.1:1", "join_timeout": -1}, ValueError, "join_timeout must be a positive number"),
        ({"address": "127.0.0.1:1", "token": 7}, TypeError, "token must be a str"),
    ],
)
def test_connect_refuses_bad_arguments_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    monkeypatch.delenv("ACTORCH_ADDRESS", raising=False)
    with pytest.raises(error, match=match):
        actorch.connect(configure_logs=False, **kwargs)


@pytest.mark.timeout(30)  # well under the default join_timeout of 60 s: a wait for it fails the test
async def test_connect_to_an_address_that_refuses_fails_at_once_naming_it() -> None:
    with refused_port() as port, pytest.raises(actorch.JoinError) as refused:
        await actorch.connect(f"127.0.0.1:{port}", configure_logs=False)
    assert str(refused.value) == (
        f"cannot reach an actorch system at 127.0.0.1:{port}: the connection was refused (nothing listens there)"
    )


@pytest.mark.timeout(30)
async def test_connect_to_an_address_that_does_not_answer_ends_in_a_join_error_after_join_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=8) as silent:  # listens, never accepts nor answers
        port = silent.getsockname()[1]
        with pytest.raises(actorch.JoinError) as unanswered:
            await actorch.connect(f"127.0.0.1:{port}", join_timeout=0.5, configure_logs=False)
    assert str(unanswered.value) == f"cannot reach an actorch system at 127.0.0.1:{port}: nothing answered within 0.5 s"


async def test_connect_refuses_a_process_that_already_runs_a_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect_module, "running", lambda: True)  # as while run() or start() runs
    with pytest.raises(RuntimeError, match="already runs a node"):
        await actorch.connect("127.0.0.1:1", configure_logs=False)
