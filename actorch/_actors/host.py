"""An actor's life on its node: built and started, its hooks run, stopped once.

These functions are methods of :class:`~actorch._actors.system.ActorSystem` (it binds
them in its class body), kept here so that the system's public face reads on
its own.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._actors.actor import Actor, class_path, endpoints_of
from actorch._actors.ref import ActorRef
from actorch._actors.registry import Registry
from actorch._actors.restart import ActorExit, Restart
from actorch._actors.service import NodeService
from actorch._engine.message import CallContext, current_call

if TYPE_CHECKING:
    from actorch._actors.system import ActorSystem
    from actorch._engine.cell import Cell

__all__ = ["build", "run_hook", "start_instance", "stop_cell", "stop_local_actors"]

A = TypeVar("A", bound=Actor)


async def build(
    self: ActorSystem,
    cls: type[A],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name: str | None,
    restart: Restart | None = None,
    *,
    system_id: int | None = None,
) -> ActorRef[A]:
    """Build an actor of ``cls`` on this node and start it (again after a failed start, if ``restart`` allows)."""
    node = self._node
    unborn = cls.__new__(cls)  # holds the cell's place until an instance has started
    cell = node.add_actor(unborn, endpoints_of(cls), name=name, max_concurrency=cls.max_concurrency, actor_id=system_id)
    ref: ActorRef[A] = ActorRef._create(node, node.rank, cell.actor_id, name, class_path(cls))
    unborn._actorch_ref = ref
    unborn._actorch_system = self
    failures = 0
    try:
        while True:
            try:
                await self._start_instance(cell, cls, args, kwargs, None)
                break
            except Exception as exc:
                failures += 1
                if restart is None or failures > restart.max_restarts:
                    raise
                node.log.error(
                    "actor failed to start; starting it again", actor=cell.label, error=repr(exc), attempt=failures
                )
            await asyncio.sleep(restart.delay(failures))
    except BaseException:
        node.remove_actor(cell)
        raise
    if restart is not None:
        self._supervisor.adopt(cell.actor_id, cls, args, kwargs, restart)
    return ref


async def start_instance(
    self: ActorSystem,
    cell: Cell,
    cls: type[Actor],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    kept: tuple[Any] | None,
) -> None:
    """Build, restore (``kept`` holds a snapshot) and start a new instance of ``cls`` in ``cell``.

    The cell keeps its id, ref and name; if anything raises, it keeps its
    previous instance.
    """
    old = cell.instance
    instance = cls.__new__(cls)
    instance._actorch_ref = old._actorch_ref  # type: ignore[attr-defined]
    instance._actorch_system = self
    instance.__init__(*args, **kwargs)  # type: ignore[misc]
    cell.instance = instance
    try:
        if kept is not None:
            await self._run_hook(cell, "restore", kept[0], raise_errors=True)
        await self._run_hook(cell, "on_start", raise_errors=True)
    except BaseException:
        cell.instance = old
        raise


async def run_hook(
    self: ActorSystem, cell: Cell, hook: str, *args: Any, raise_errors: bool = False, limit: float | None = None
) -> Any:
    """Run one of the actor's hooks (plain or async) as a message of the actor; its result.

    Nothing else starts meanwhile, and calls that come back to the actor from
    it are re-entrant. After ``limit`` seconds the hook is cancelled.
    """
    key = self._node.new_key()
    context = current_call.get()
    chain = context.child_chain() if context is not None else ()
    cell.enter(key)
    token = current_call.set(CallContext(cell, key, chain, hook))
    scope = asyncio.timeout(limit)
    try:
        result = getattr(cell.instance, hook)(*args)
        if inspect.isawaitable(result):
            async with scope:
                result = await result
    except Exception as exc:
        if raise_errors:
            raise
        if isinstance(exc, TimeoutError) and scope.expired():
            self._node.log.error(f"{hook} did not finish in {limit:g} s and was cancelled", actor=cell.label)
        else:
            self._node.log.exception(f"{hook} failed", actor=cell.label, error=repr(exc))
        return None
    else:
        return result
    finally:
        current_call.reset(token)
        if hook == "on_stop":
            cell.stopped_hook = True
        cell.leave(key)
        cell.wake()


async def stop_cell(self: ActorSystem, cell: Cell, exit_: ActorExit, *, release_name: bool = True) -> None:
    """Stop a local actor once: drain it, run ``on_stop``, release its name, record how it ended."""
    running = self._stopping.get(cell.actor_id)
    if running is not None:
        await asyncio.shield(running)
        return
    done = self._stopping[cell.actor_id] = asyncio.get_running_loop().create_future()
    try:
        grace = self.config.stop_grace
        await self._node.drain(cell, grace)
        if not cell.stopped_hook:
            await self._run_hook(cell, "on_stop", limit=grace)
        self._node.remove_actor(cell)
        if release_name and cell.name is not None:
            await self._release_quietly(cell.name, exit_.reason)
        self._supervisor.ended(cell.actor_id, replace(exit_, restarts=cell.restarts))
    finally:
        del self._stopping[cell.actor_id]
        done.set_result(None)


async def stop_local_actors(self: ActorSystem) -> None:
    """Stop every user actor of this node, the system is ending; whoever waits hears so."""
    cells = [cell for cell in self._node.cells() if not isinstance(cell.instance, (NodeService, Registry))]
    shutdown = ActorExit("shutdown")
    await asyncio.gather(*(self._stop_cell(cell, shutdown, release_name=False) for cell in cells))
    self._supervisor.close()
    self._events.close()
