"""``ActorLifecycle``: one node's actors through their lives, each built, started, restarted and stopped once.

Each node's ``ActorHost`` holds one, beside the node's part in the system. An actor is
built and started (again after a failed start, if its ``Restart`` policy
allows), runs its hooks as messages of its own, is restarted when it fails
(see ``supervisor``) and is stopped once, giving back what it held and its name.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Set
from dataclasses import replace
from time import perf_counter_ns
from typing import Any, TypeVar

import torch

from actorch._actors.actor import Actor, class_path, endpoints_of, has_state_hooks, place
from actorch._actors.node.supervisor import Supervisor
from actorch._actors.placement.gpus import GpuPool, check_device
from actorch._actors.placement.holdings import Holdings
from actorch._actors.ref import ActorRef, resolve_class
from actorch._actors.registry import Registry
from actorch._actors.relocation.relocatables import Relocatables
from actorch._actors.relocation.spec import RelocationSpec, check_home
from actorch._actors.restart import ActorExit
from actorch._actors.spawn_request import SpawnRequest
from actorch._base.config import SystemConfig
from actorch._base.devices import accelerator, on_device, parse_device
from actorch._base.errors import ActorStoppedError, PlacementError, describe
from actorch._engine.cell import CANCEL_WAIT, Cell
from actorch._engine.message import CallContext, current_call
from actorch._engine.node import Node
from actorch._engine.system_ids import SYSTEM_IDS
from actorch._engine.wire import handler_traceback

__all__ = ["ActorLifecycle", "Bind"]

A = TypeVar("A", bound=Actor)

Bind = Callable[[Actor, ActorRef[Any]], None]
"""Gives a new actor instance its ref and its node's system (``ActorSystem`` provides it)."""


class ActorLifecycle:
    """Builds, starts, restarts and stops the actors of one node."""

    def __init__(
        self, node: Node, config: SystemConfig, bind: Bind, registry: ActorRef[Registry], leaving: Set[int]
    ) -> None:
        """Hold the actors of ``node``; ``registry`` frees their names, ``leaving`` (the host's) refuses builds."""
        self.node = node
        self.rank = node.rank
        self.config = config
        self.supervisor = Supervisor(self.rank)
        self.gpus = GpuPool(self.rank, lambda: self.node.transport.peer(self.rank).devices)
        self.holdings = Holdings(self.rank, lambda: self.node.transport.peer(self.rank).resources)
        self.relocatables = Relocatables(node.caller, self.rank)
        self._registry = registry
        self._leaving = leaving  # nodes leaving the system (this one too, once it leaves): no spawns there
        self._bind = bind
        self._stopping: dict[int, asyncio.Future[None]] = {}
        self._on_stop_ran: set[int] = set()  # actors whose current instance ran on_stop already
        self._hooks_run: dict[int, dict[str, int]] = {}  # by actor: its hooks run (on_start...), each how often
        node.on_actor_failed(self._on_failure)

    # ------------------------------------------------------------------ building

    async def build(
        self,
        request: SpawnRequest,
        *,
        system_id: int | None = None,
        origin: tuple[int, int] | None = None,
        kept: tuple[Any] | None = None,
    ) -> ActorRef[Any]:
        """Build the actor ``request`` asks for on this node and start it (again after a failed start, if allowed).

        The request's device overrides the class's; it must be one this node
        has. GPUs it asks for are lent to the actor (free ones of this node)
        until it stops, the first as its device; other resources its ``Where``
        asks (``cpus=1``) are held for it as long; ``PlacementError`` if they
        are not free. A relocatable actor (``Restart(relocate=True)``) is
        adopted by rank 0's relocator once it started, with the request; one
        that moved here has its ``origin``, and ``kept`` holds its last
        snapshot, restored before ``on_start``. A named one built afresh in a
        system with a snapshot directory starts from its last snapshot there.
        """
        cls = self._class_of(request)
        name, restart = request.name, request.restart
        node = self.node
        if self.rank in self._leaving and system_id is None:
            raise PlacementError(f"cannot spawn {cls.__qualname__} on node {self.rank}: it is leaving the system")
        relocatable = request.relocatable
        if relocatable:
            check_home(cls.__qualname__, self.rank)
            if origin is None and kept is None and self.config.snapshots is not None:
                kept = await self.relocatables.resume(request)
        gpus, needs = request.lent(), request.held()
        lent = self.gpus.pick(gpus, f"spawn({cls.__qualname__}, gpus={gpus})") if gpus else ()
        held = self.holdings.pick(needs, f"spawn({cls.__qualname__})") if needs else {}
        device = request.device
        chosen = torch.device(lent[0]) if lent else cls.device if device is None else parse_device(device)
        placed = self.check_device(cls, chosen)
        unborn = cls.__new__(cls)  # holds the cell's place until an instance has started
        cell = node.add_actor(
            unborn,
            endpoints_of(cls),
            name=name,
            max_concurrency=cls.max_concurrency,
            actor_id=system_id,
            device=placed,
        )
        # No await since pick: no other spawn can have taken these GPUs or resources meanwhile.
        holder = name or f"{cls.__qualname__}#{cell.actor_id} on node {self.rank}"  # ids repeat across nodes
        self.gpus.hold(lent, cell.actor_id, holder)
        self.holdings.hold(cell.actor_id, held, holder)
        if relocatable:
            self.relocatables.take(cell.actor_id, origin)
        ref: ActorRef[Any] = self.relocatables.ref(cell.actor_id, name, cls)
        self._bind(unborn, ref)
        try:
            await self._start_first(cell, cls, request, kept)
        except BaseException as exc:
            unstarted = self.relocatables.drop(cell.actor_id) if origin is None else None
            self._remove(cell)
            if unstarted is not None:  # rank 0 may hold what its on_start saved
                await asyncio.shield(self.relocatables.forget(unstarted, ActorExit("failed", describe(exc))))
            raise
        if restart is not None:
            self.supervisor.adopt(cell.actor_id, cls, request.args, request.kwargs, restart)
        if relocatable and origin is None:
            origin = self.relocatables.origin(cell.actor_id)
            try:
                await self.relocatables.adopt(RelocationSpec(origin, request))
            except BaseException:
                unadopted = ActorExit("failed", "rank 0 did not adopt it")
                await asyncio.shield(self.stop(cell, unadopted, release_name=False))
                raise
        return ref

    def _class_of(self, request: SpawnRequest) -> type[Actor]:
        """The class ``request`` builds, imported here; ``ImportError`` naming this node if it cannot be."""
        cls = resolve_class(request.path)
        if cls is None:
            raise ImportError(f"cannot import actor class {request.path!r} on node {self.rank}")
        return cls

    async def _start_first(self, cell: Cell, cls: type[Actor], request: SpawnRequest, kept: tuple[Any] | None) -> None:
        """Start the first instance of ``cell``'s actor; again after a failed start, while its policy allows."""
        restart = request.restart
        failures = 0
        while True:
            try:
                await self.start_instance(cell, cls, request.args, request.kwargs, kept)
                return
            except Exception as exc:
                failures += 1
                if restart is None or failures > restart.max_restarts:
                    raise
                self.node.log.error(
                    "actor failed to start; starting it again", actor=cell.label, error=repr(exc), attempt=failures
                )
            await asyncio.sleep(restart.delay(failures))

    def _remove(self, cell: Cell) -> None:
        """Stop hosting ``cell``'s actor and take back the GPUs and resources it held."""
        self.node.remove_actor(cell)
        self.gpus.release(cell.actor_id)
        self.holdings.release(cell.actor_id)
        self.relocatables.drop(cell.actor_id)

    def check_device(self, cls: type[Actor], device: torch.device) -> torch.device:
        """``device`` if this node has it (the CPU always); else ``PlacementError`` naming what it has."""
        if device.type != "cpu":
            check_device(cls.__qualname__, str(device), self.rank, self.node.transport.peer(self.rank).devices)
        return device

    async def start_instance(
        self, cell: Cell, cls: type[Actor], args: tuple[Any, ...], kwargs: dict[str, Any], kept: tuple[Any] | None
    ) -> None:
        """Build, restore (``kept`` holds a snapshot) and start a new instance of ``cls`` in ``cell``.

        The cell keeps its id, ref and name; if anything raises, it keeps its
        previous instance.
        """
        old = cell.instance
        instance = cls.__new__(cls)
        self._bind(instance, self.relocatables.ref(cell.actor_id, cell.name, cls))
        place(instance, cell.device)
        instance.__init__(*args, **kwargs)  # type: ignore[misc]
        cell.instance = instance
        try:
            if kept is not None:
                await self.run_hook(cell, "restore", kept[0], raise_errors=True)
            await self.run_hook(cell, "on_start", raise_errors=True)
        except BaseException:
            cell.instance = old
            raise
        if cell.actor_id > SYSTEM_IDS:  # the runtime's own actors start on every node, every run
            self.node.log.debug("actor started", actor=cell.label, cls=class_path(cls), device=str(cell.device))

    async def run_hook(
        self, cell: Cell, hook: str, *args: Any, raise_errors: bool = False, limit: float | None = None
    ) -> Any:
        """Run one of the actor's hooks (plain or async) as a message of the actor; its result.

        Nothing else starts meanwhile, and calls that come back to the actor from
        it are re-entrant. After ``limit`` seconds the hook is cancelled.
        """
        key = self.node.new_key()
        context = current_call.get()
        chain = context.child_chain() if context is not None else ()
        running = CallContext(cell.label, key, chain, hook, cell.device, self.rank)
        running.started, running.task = perf_counter_ns(), asyncio.current_task()
        cell.enter(key, running)
        token = current_call.set(running)
        # Actor's own no-op hooks return at once: no timer for them (outside actorch.run's
        # loop, every armed timer is one more that each call made meanwhile looks through).
        own = getattr(type(cell.instance), hook, None) is not getattr(Actor, hook, None)
        scope = asyncio.timeout(limit if own else None)
        try:
            if cell.device is not None:
                accelerator().make_current(cell.device)
            result = getattr(cell.instance, hook)(*args)
            if inspect.isawaitable(result):
                async with scope:
                    result = await on_device(result, cell.device)
        except Exception as exc:
            if raise_errors:
                raise
            if isinstance(exc, TimeoutError) and scope.expired():
                self.node.log.error(f"{hook} did not finish in {limit:g} s and was cancelled", actor=cell.label)
            else:
                self.node.log.exception(f"{hook} failed", actor=cell.label, error=repr(exc))
            return None
        else:
            return result
        finally:
            current_call.reset(token)
            if hook == "on_stop":
                self._on_stop_ran.add(cell.actor_id)
            counts = self._hooks_run.setdefault(cell.actor_id, {})
            counts[hook] = counts.get(hook, 0) + 1
            cell.leave(key)
            cell.wake()

    def hooks_run(self, actor_id: int) -> dict[str, int]:
        """The hooks local actor ``actor_id`` has run (``on_start``, ``on_stop``...), each how many times."""
        return dict(self._hooks_run.get(actor_id, {}))

    # ------------------------------------------------------------------ stopping

    async def stop(self, cell: Cell, exit_: ActorExit, *, release_name: bool = True) -> None:
        """Stop a local actor once: drain it, run ``on_stop``, release its name, record how it ended."""
        running = self._stopping.get(cell.actor_id)
        if running is not None:
            await asyncio.shield(running)
            return
        done = self._stopping[cell.actor_id] = asyncio.get_running_loop().create_future()
        try:
            grace = self.config.stop_grace
            await self._drain(cell, grace)
            if cell.actor_id not in self._on_stop_ran:
                await self.run_hook(cell, "on_stop", limit=grace)
            origin = self.relocatables.drop(cell.actor_id)
            self._remove(cell)
            if release_name and origin is not None:  # before its name goes: it must not move meanwhile
                await self.relocatables.forget(origin, exit_)
            if release_name and cell.name is not None:
                await self.release_name(cell.name, exit_.reason)
            self.supervisor.ended(cell.actor_id, replace(exit_, restarts=cell.restarts))
            stats = final_statistics(cell, self.hooks_run(cell.actor_id))
            self.node.log.debug("actor stopped", actor=cell.label, reason=exit_.reason, statistics=stats)
        finally:
            del self._stopping[cell.actor_id]
            self._on_stop_ran.discard(cell.actor_id)
            self._hooks_run.pop(cell.actor_id, None)
            done.set_result(None)

    @staticmethod
    async def _drain(cell: Cell, grace: float) -> None:
        """Refuse new messages, end streams, let queued and running ones finish, cancel them after ``grace``.

        An actor that stops itself from a handler keeps that handler running.
        """
        cell.refuse_all()
        cell.end_streams()
        context = current_call.get()
        own = 1 if context is not None and cell.is_reentrant(context.child_chain()) else 0
        if not cell.paused and (cell.running > own or cell.queue):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await cell.wait_idle(own)
        cell.fail_queued(lambda endpoint: ActorStoppedError(f"{cell.label} stopped before handling {endpoint!r}"))
        tasks = cell.cancel_running(keep=asyncio.current_task())
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_WAIT)

    async def stop_actor(self, actor_id: int, exit_: ActorExit) -> None:
        """Stop local actor ``actor_id`` if it is still here."""
        cell = self.node.cell(actor_id)
        if cell is not None:
            await self.stop(cell, exit_)

    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """How local actor ``actor_id`` ended, once it has."""
        known = self.supervisor.exit_of(actor_id)
        if known is not None:
            return known
        if self.node.cell(actor_id) is None and actor_id not in self._stopping:
            return ActorExit("stopped", f"node {self.rank} hosts no actor #{actor_id} any more")
        return await self.supervisor.wait_ended(actor_id)

    async def release_name(self, name: str, reason: str = "stopped") -> None:
        """Free ``name`` in the registry; a failure is logged, not raised (what failed before matters more)."""
        try:
            await self._registry.call(Registry.release, name, reason)
        except Exception as exc:  # noqa: BLE001 - what failed before matters more
            self.node.log.warning("could not release name", name=name, error=repr(exc))

    # ------------------------------------------------------------------ failures

    def _on_failure(self, cell: Cell, error: BaseException, cancelled: list[asyncio.Task[Any]]) -> None:
        cell.track(self.node.loop.create_task(self._recover(cell, error, cancelled)))

    async def _recover(self, cell: Cell, error: BaseException, cancelled: list[asyncio.Task[Any]]) -> None:
        """Restart a failed actor by its policy, or stop it for good."""
        log = self.node.log
        grace = self.config.stop_grace
        cause = describe(error)
        log.error(
            "actor failed",
            actor=cell.label,
            error=cause,
            restarts=cell.restarts,
            exception=handler_traceback(error),  # structlog's key for a traceback: renderers show it as one
        )
        if cancelled:
            await asyncio.wait(cancelled, timeout=CANCEL_WAIT)
        spec = self.supervisor.spec(cell.actor_id)
        kept: tuple[Any] | None = None
        if spec is not None and has_state_hooks(spec.cls):
            try:
                kept = (await self.run_hook(cell, "snapshot", raise_errors=True, limit=grace),)
            except Exception as exc:  # noqa: BLE001 - the restart goes on from a fresh instance
                log.warning("snapshot failed; the new instance starts fresh", actor=cell.label, error=describe(exc))
        await self.run_hook(cell, "on_stop", limit=grace)
        while True:
            if spec is None:
                await self._give_up(cell, cause, "it has no restart policy")
                return
            failures = self.supervisor.count_failure(cell.actor_id, spec.restart)
            if failures > spec.restart.max_restarts:
                await self._give_up(cell, cause, f"{failures - 1} restarts were used up")
                return
            await asyncio.sleep(spec.restart.delay(failures))
            try:
                await self.start_instance(cell, spec.cls, spec.args, spec.kwargs, kept)
            except Exception as exc:  # noqa: BLE001 - a failed restart is one more failure
                cause = describe(exc)
                log.error("restart failed", actor=cell.label, error=cause, attempt=failures)
                continue
            self._on_stop_ran.discard(cell.actor_id)
            cell.resume(restarted=True)
            log.info("actor restarted", actor=cell.label, restarts=cell.restarts, after=failures)
            return

    async def _give_up(self, cell: Cell, cause: str, why: str) -> None:
        self.node.log.error("actor stopped after failing", actor=cell.label, error=cause, why=why)
        await self.stop(cell, ActorExit("failed", cause))


def handled_by_endpoints(cell: Cell) -> int:
    """Messages an actor's endpoints handled (calls, tells, streams; each call of a batch once), its hooks apart.

    What ``handled`` means wherever it is shown (``actorch status``, a run's
    record): the cell's own count also holds its lifecycle hooks, and counts
    a batch run as one message.
    """
    return sum(stats.calls for stats in cell.metrics.values())


def final_statistics(cell: Cell, hooks: dict[str, int]) -> dict[str, Any]:
    """What a run record keeps of a stopped actor: its counts, the ``hooks`` it ran, per endpoint its calls and errors.

    And each endpoint's mean handler time.
    """
    endpoints = {
        endpoint: {"calls": stats.calls, "errors": stats.errors, "mean_s": stats.total_ns / stats.calls / 1e9}
        for endpoint, stats in cell.metrics.items()
        if stats.calls
    }
    return {**cell.statistics(), "handled": handled_by_endpoints(cell), "hooks": hooks, "endpoints": endpoints}
