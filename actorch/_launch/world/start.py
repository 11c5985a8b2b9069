"""``actorch.start``: a system started and driven from an event loop that is already running (a notebook).

``run`` owns its process: it makes the event loop, runs ``main`` in it and
ends the process's system when ``main`` ends. A Jupyter kernel, or an async
program, already runs a loop of its own: ``start`` launches the same system
from inside it (the same local worker processes, on torch RPC) and hands back
the ``ActorSystem``, which stays up between cells until ``system.shutdown()``.
Rank 0's node runs in the caller's loop as a task, the blocking start-up steps
run in threads, and the workers are reaped without blocking the loop.

The workers are tied to this process as ``run``'s are: they watch rank 0 and
end when its process ends, even killed; and when the interpreter exits with
the system still up, an exit hook kills them first.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, Unpack

from actorch._actors.system import ActorSystem, hand_over
from actorch._base.errors import UnsupportedError
from actorch._launch.options.system_options import OptionKeywords, SystemOptions, options_of
from actorch._launch.services.status import check_status_port
from actorch._launch.world.lead import lead
from actorch._launch.world.local import elastic_token, launch_traits, local_world
from actorch._launch.world.run import _make_snapshot_directory, _plan, _requested_world_size
from actorch._launch.world.startup import TORCHRUN_VARS, Plan
from actorch._launch.world.workers import JOIN_TIMEOUT, kill_workers
from actorch._transport.base import NodeTraits, Transport
from actorch._transport.kinds import at_exit, running

__all__ = ["Opening", "start", "wake_for_interrupts"]

REAP_POLL = 0.05
"""Seconds between two looks at whether the local workers have exited, while the loop goes on."""
KERNEL_WAKE = 0.1
"""Seconds between two wake-ups of a Jupyter kernel's loop while a system runs in it (see ``wake_for_interrupts``)."""


class Opening:
    """What ``actorch.start`` and ``actorch.connect`` return: await it, or enter it with ``async with``.

    ``system = await actorch.start(...)`` gives the ``ActorSystem``, to end
    with ``await system.shutdown()``; ``async with actorch.start(...) as
    system:`` gives the same and shuts it down on leaving the block, also when
    the block raises or is cancelled. Either way it opens once. If the task
    that awaits the opening is cancelled (a notebook cell interrupted while
    the system starts), what was opened is shut down before the cancellation
    goes on.
    """

    def __init__(self, what: str, opener: Callable[[], Coroutine[Any, Any, ActorSystem]]) -> None:
        self._what = what
        self._opener: Callable[[], Coroutine[Any, Any, ActorSystem]] | None = opener
        self._system: ActorSystem | None = None

    def __repr__(self) -> str:
        state = "unopened" if self._opener is not None else "opened" if self._system is not None else "failed"
        return f"<Opening {self._what} {state}>"

    def __await__(self) -> Generator[Any, None, ActorSystem]:
        return self._open().__await__()

    async def __aenter__(self) -> ActorSystem:
        return await self._open()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._system is not None:
            await self._system.shutdown()

    async def _open(self) -> ActorSystem:
        opener, self._opener = self._opener, None
        if opener is None:
            raise RuntimeError(f"{self._what} was awaited or entered already: it opens once")
        opening = asyncio.ensure_future(opener())
        try:
            self._system = await asyncio.shield(opening)
        except asyncio.CancelledError:
            await _close_once_open(opening)
            raise
        return self._system


async def _close_once_open(opening: asyncio.Future[ActorSystem]) -> None:
    """Let an interrupted opening finish, then shut down what it opened (a further cancel leaves it to go on)."""
    closing = asyncio.ensure_future(_finish_then_shut(opening))
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(closing)


async def _finish_then_shut(opening: asyncio.Future[ActorSystem]) -> None:
    await asyncio.wait([opening])
    if not opening.cancelled() and opening.exception() is None:
        await opening.result().shutdown()


def wake_for_interrupts() -> asyncio.Task[None] | None:
    """In a Jupyter kernel, wake its loop every ``KERNEL_WAKE`` seconds, so that interrupts reach waiting cells.

    ipykernel cancels a cell that awaits when the kernel is interrupted, but
    its loop sees the cancellation only when it next wakes
    (ipython/ipykernel#881); a cell waiting on a call to a busy actor would
    not stop. Elsewhere: None, nothing runs. Cancel the task to stop it.
    """
    if "ipykernel" not in sys.modules:
        return None
    return asyncio.get_running_loop().create_task(_wake_forever(), name="actorch-kernel-wake")


async def _wake_forever() -> None:
    while True:  # noqa: ASYNC110 - waking the loop is the point: nothing is waited for
        await asyncio.sleep(KERNEL_WAKE)


def start(
    world_size: int | None = None,
    *,
    options: SystemOptions | None = None,
    **keywords: Unpack[OptionKeywords],
) -> Opening:
    """Start an actor system from a running event loop (a notebook, an async program); this process is rank 0.

    ``system = await actorch.start(world_size=3)`` starts ranks 1 and 2 as
    local processes, as ``run`` does, and returns rank 0's ``ActorSystem``
    once every node has joined; nothing blocks the loop meanwhile. The system
    runs between cells until ``await system.shutdown()``, which stops every
    actor everywhere (``on_stop`` runs) and waits, bounded, for the workers
    to exit. ``async with actorch.start(...) as system:`` shuts it down on
    leaving the block. One system at a time runs in a process.

    Actors spawned on other nodes must be importable there: define them in a
    module (a ``.py`` file beside the notebook), not in a notebook cell. A
    class defined in a cell can be spawned on rank 0 only. ``setup`` too must
    be importable.

    Args:
        world_size: Number of processes, this one included; None or 1 runs
            every node in this process.
        options: Options built beforehand; None: the defaults.
        **keywords: Options, as keywords: any field of ``SystemOptions``, as
            ``run`` takes them; over ``options``' when both are given.
            ``tune_gc`` is off unless asked for: the process is yours, and
            ``gc.freeze()`` would keep everything it holds now for good.

    Returns:
        An ``Opening``: await it for the system, or use it in ``async with``.
        Bad options raise here, before anything starts.

    Raises:
        TypeError: An unknown option, or a ``setup`` that is not a function of the rank.
        ValueError: A bad option, or ``elastic`` with device maps.
        RuntimeError: (when awaited) This process already runs a system, or
            a worker failed to start.
        UnsupportedError: Under torchrun, whose world ``run`` joins instead.
        OSError: The ``snapshots`` directory cannot be made.
    """
    chosen = options_of("start", options, keywords)
    if chosen.trace is not None:
        raise ValueError(
            "start() has no main to trace: trace a block of your program with `async with system.trace(PATH)`"
        )
    plan = _plan(chosen, tune_gc=False)
    if all(var in os.environ for var in TORCHRUN_VARS):
        raise UnsupportedError("actorch.start() launches local processes; under torchrun, call actorch.run(main)")
    if plan.status is not None:
        check_status_port(*plan.status)  # a taken port fails here, before any worker starts
    _make_snapshot_directory("start", plan)
    world_size, _ = _requested_world_size(world_size)
    token = elastic_token(world_size, plan, under_torchrun=False) if chosen.elastic else None
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size must be a positive int, not {world_size!r}")
    size = world_size or 1
    traits = launch_traits(chosen.resources, size)
    what = f"actorch.start(world_size={size})"
    return Opening(what, lambda: _open(plan, size, chosen.host, chosen.port, token, traits))


class _Driven:
    """A system this process started with ``start``: the task that leads it, its workers, and how it ends."""

    current: _Driven | None = None
    """The system this process runs now, if any (torch RPC is one per process)."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.workers: list[Any] = []  # the local worker processes, once started
        self.opened: asyncio.Future[ActorSystem] = loop.create_future()
        self._release = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        state = "ending" if self._release.is_set() else "open" if self.opened.done() else "starting"
        return f"<_Driven {state} workers={len(self.workers)}>"

    def lead(self, transport: Transport, plan: Plan) -> None:
        """Run rank 0's node as a task of the running loop until ``shutdown``."""
        self._task = asyncio.get_running_loop().create_task(self._lead(transport, plan), name="actorch-rank0")

    async def _lead(self, transport: Transport, plan: Plan) -> None:
        failed_to_open: BaseException | None = None
        try:
            await lead(self._serve_driver, transport, plan, self.workers)
        except BaseException as exc:
            if self.opened.done():
                raise
            failed_to_open = exc
        finally:
            await _reap(self.workers, kill=failed_to_open is not None)
            if _Driven.current is self:
                _Driven.current = None
        if failed_to_open is None:
            return
        if isinstance(failed_to_open, asyncio.CancelledError):
            self.opened.cancel()
        else:
            self.opened.set_exception(failed_to_open)

    async def _serve_driver(self, system: ActorSystem) -> None:
        """``main`` of the system: hand the system to the driver, then wait until it asks to end."""
        hand_over(system, self.shutdown)
        self.opened.set_result(system)
        waking = wake_for_interrupts()
        try:
            await self._release.wait()
        finally:
            if waking is not None:
                waking.cancel()

    async def shutdown(self) -> None:
        """End the system: every actor stops, the workers exit (the loop runs on meanwhile)."""
        self._release.set()
        assert self._task is not None
        await asyncio.shield(self._task)

    def kill_workers(self) -> None:
        """Kill the workers still alive (the interpreter exits with the system up)."""
        if any(worker.is_alive() for worker in self.workers):
            kill_workers(self.workers)


async def _open(
    plan: Plan, world_size: int, host: str, port: int, token: str | None, traits: list[NodeTraits]
) -> ActorSystem:
    if _Driven.current is not None or running():
        raise RuntimeError(
            "this process already runs an actor system: shut it down (await system.shutdown()) before starting another"
        )
    driven = _Driven.current = _Driven()  # from here on, another start() in this process is refused
    try:
        transport, driven.workers = local_world(world_size, host, plan, port, traits, token)
    except BaseException:
        _Driven.current = None
        raise
    driven.lead(transport, plan)
    return await driven.opened


async def _reap(workers: list[Any], *, kill: bool) -> None:
    """Wait for the local workers to exit (``JOIN_TIMEOUT`` at most, then kill them), without blocking the loop."""
    if kill:
        kill_workers(workers)
    loop = asyncio.get_running_loop()
    limit = loop.time() + JOIN_TIMEOUT
    while any(worker.is_alive() for worker in workers):  # is_alive() reaps one that has exited
        if loop.time() >= limit:
            kill_workers(workers)
            return
        await asyncio.sleep(REAP_POLL)


def _kill_at_exit() -> None:
    """End what a system left up at the interpreter's exit: the local workers, then torch RPC."""
    driven = _Driven.current
    if driven is not None:
        driven.kill_workers()
        at_exit()


atexit.register(_kill_at_exit)  # runs before multiprocessing's own hook, which would wait for them
