"""``ActorHost``: one node's actors through their lives, and the node's part in the system.

The host builds actors and starts them, runs their hooks, restarts those that
fail (by their ``Restart`` policy, see ``supervisor``) and stops them, each once.
It also holds what the node keeps of the system: its name cache, its
membership events, refs to every node's service and to the registry, and how
the node is told the system ends. ``ActorSystem`` (the user's handle), the
node service and the launcher all go through its public methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import traceback
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import torch

from actorch._actors.actor import Actor, class_path, endpoints_of, has_state_hooks, place
from actorch._actors.events import EventHub
from actorch._actors.holdings import Holdings, node_share
from actorch._actors.movable import RELOCATOR_ID
from actorch._actors.placement import GpuPool, GpuShare
from actorch._actors.pool import NodePool
from actorch._actors.process_groups import ProcessGroups
from actorch._actors.ref import SERVICE_ID, ActorRef, make_ref
from actorch._actors.registry import REGISTRY_ID, NameCache, Registry
from actorch._actors.relocation import Relocatables, RelocationSpec, check_home
from actorch._actors.relocator import Relocator
from actorch._actors.restart import ActorExit, Restart
from actorch._actors.service import NodeService
from actorch._actors.supervisor import Supervisor
from actorch._base.config import SystemConfig
from actorch._base.devices import accelerator, on_device, parse_device
from actorch._base.errors import ActorStoppedError, PlacementError, UnsupportedError, describe
from actorch._engine.cell import CANCEL_WAIT, Cell
from actorch._engine.message import CallContext, current_call
from actorch._engine.node import SYSTEM_IDS, Node
from actorch._transport.base import NodeInfo, Transport
from actorch._transport.membership import facts_of

__all__ = ["ActorHost", "Bind"]

A = TypeVar("A", bound=Actor)

Bind = Callable[[Actor, ActorRef[Any]], None]
"""Gives a new actor instance its ref and its node's system (``ActorSystem`` provides it)."""

LEAVE_CALL_TIMEOUT = 5.0
"""Seconds a leaving node waits for each other node to hear that it leaves, and that it has left."""


class ServiceRefs(dict[int, ActorRef[NodeService]]):
    """Refs to every node's service, by rank; one is made the first time a rank is asked for."""

    def __init__(self, caller: Any) -> None:
        super().__init__()
        self._caller = caller

    def __missing__(self, rank: int) -> ActorRef[NodeService]:
        ref: ActorRef[NodeService] = make_ref(self._caller, rank, SERVICE_ID, None, class_path(NodeService))
        self[rank] = ref
        return ref

    def meet(self, rank: int) -> None:
        """Hold a ref to node ``rank``'s service from now on (the registry tells every node it holds)."""
        if rank not in self:
            self.__missing__(rank)


class ActorHost:
    """Builds, starts, restarts and stops this node's actors, and keeps the node's share of the system."""

    def __init__(self, transport: Transport, config: SystemConfig, bind: Bind) -> None:
        self.node = Node(transport, config, asyncio.get_running_loop())
        self.rank = self.node.rank
        self.config = config
        self.cache = NameCache()
        self.events = EventHub()
        self.supervisor = Supervisor(self.rank)
        self.process_groups = ProcessGroups(self.node)
        self.gpus = GpuPool(self.rank, lambda: self.node.transport.peer(self.rank).devices)
        self.holdings = Holdings(self.rank, lambda: self.node.transport.peer(self.rank).resources)
        self.pool = NodePool(self)
        caller = self.node.caller
        self.relocatables = Relocatables(caller, self.rank)
        self.services = ServiceRefs(caller)
        for rank in range(self.node.world_size):  # a static world's; an elastic one's come as they join
            self.services.meet(rank)
        self.registry: ActorRef[Registry] = make_ref(caller, 0, REGISTRY_ID, None, class_path(Registry))
        self.leaving: set[int] = set()  # nodes leaving the system (this one too, once it leaves): no spawns there
        self.exit_code: int | None = None  # a worker's, once rank 0 said the system ends
        self._bind = bind
        self._ended = asyncio.Event()  # a worker's system ended (rank 0 said so, or was lost)
        self._stopping: dict[int, asyncio.Future[None]] = {}
        self._on_stop_ran: set[int] = set()  # actors whose current instance ran on_stop already
        self._born = self.node.loop.time()
        self._leave: asyncio.Task[None] | None = None
        self._gone: dict[int, asyncio.Future[None]] = {}  # peers someone waits to see gone
        self.node.on_peer_lost(self._on_peer_lost)
        self.node.on_peer_joined(self._on_peer_joined)
        self.node.on_actor_failed(self._on_failure)

    def __repr__(self) -> str:
        return f"<ActorHost node {self.rank} actors={len(self.node.cells())}>"

    async def start_services(self) -> None:
        """Host this node's service, and on rank 0 the registry and the relocator."""
        await self.build(NodeService, (self,), {}, None, system_id=SERVICE_ID)
        if self.rank == 0:
            await self.build(Registry, (self.services,), {}, None, system_id=REGISTRY_ID)
            await self.build(Relocator, (self,), {}, None, system_id=RELOCATOR_ID)

    # ------------------------------------------------------------------ building

    async def build(
        self,
        cls: type[A],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None,
        restart: Restart | None = None,
        *,
        system_id: int | None = None,
        device: str | None = None,
        gpus: int = 0,
        needs: Mapping[str, float] | None = None,
        origin: tuple[int, int] | None = None,
        kept: tuple[Any] | None = None,
        fits: tuple[str | None, str | None] | None = None,
    ) -> ActorRef[A]:
        """Build an actor of ``cls`` on this node and start it (again after a failed start, if ``restart`` allows).

        ``device`` overrides the class's device; it must be one this node has.
        ``gpus`` lends the actor that many free GPUs of this node until it
        stops, the first as its device; ``needs`` holds other resources for it
        (``{"cpus": 1}``) as long; ``PlacementError`` if they are not free.
        A relocatable actor (``Restart(relocate=True)``) is adopted by rank 0's
        relocator once it started; one that moved here has its ``origin``, and
        ``kept`` holds its last snapshot, restored before ``on_start``; ``fits``
        holds the label and host a node it moves to must have.
        """
        node = self.node
        if self.rank in self.leaving and system_id is None:
            raise PlacementError(f"cannot spawn {cls.__qualname__} on node {self.rank}: it is leaving the system")
        relocatable = restart is not None and restart.relocate
        if relocatable:
            check_home(cls.__qualname__, self.rank)
        lent = self.gpus.pick(gpus, f"spawn({cls.__qualname__}, gpus={gpus})") if gpus else ()
        held = self.holdings.pick(needs, f"spawn({cls.__qualname__})") if needs else {}
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
        holder = name or f"{cls.__qualname__}#{cell.actor_id}"
        self.gpus.hold(lent, cell.actor_id, holder)
        self.holdings.hold(cell.actor_id, held, holder)
        if relocatable:
            self.relocatables.take(cell.actor_id, origin)
        ref: ActorRef[A] = self.relocatables.ref(cell.actor_id, name, cls)
        self._bind(unborn, ref)
        failures = 0
        try:
            while True:
                try:
                    await self.start_instance(cell, cls, args, kwargs, kept)
                    break
                except Exception as exc:
                    failures += 1
                    if restart is None or failures > restart.max_restarts:
                        raise
                    node.log.error(
                        "actor failed to start; starting it again", actor=cell.label, error=repr(exc), attempt=failures
                    )
                await asyncio.sleep(restart.delay(failures))
        except BaseException as exc:
            unstarted = self.relocatables.drop(cell.actor_id) if origin is None else None
            self._remove(cell)
            if unstarted is not None:  # rank 0 may hold what its on_start saved
                await asyncio.shield(self.relocatables.forget(unstarted, ActorExit("failed", describe(exc))))
            raise
        if restart is not None:
            self.supervisor.adopt(cell.actor_id, cls, args, kwargs, restart)
        if relocatable and origin is None:
            assert restart is not None
            origin = self.relocatables.origin(cell.actor_id)
            spec = RelocationSpec(
                origin, class_path(cls), args, kwargs, name, restart, device, gpus, dict(needs or {}), *(fits or ())
            )
            try:
                await self.relocatables.adopt(spec)
            except BaseException:
                unadopted = ActorExit("failed", "rank 0 did not adopt it")
                await asyncio.shield(self.stop(cell, unadopted, release_name=False))
                raise
        return ref

    def _remove(self, cell: Cell) -> None:
        """Stop hosting ``cell``'s actor and take back the GPUs and resources it held."""
        self.node.remove_actor(cell)
        self.gpus.release(cell.actor_id)
        self.holdings.release(cell.actor_id)
        self.relocatables.drop(cell.actor_id)

    def gpu_share(self) -> GpuShare:
        """This node's GPUs and the actors holding them."""
        return self.gpus.share()

    def resource_share(self) -> dict[str, Any]:
        """What this node has free and who holds what (``holdings.node_share``)."""
        return node_share(self.holdings, self.gpus.share())

    def check_device(self, cls: type[Actor], device: torch.device) -> torch.device:
        """``device`` if this node has it (the CPU always); else ``ValueError`` naming what it has."""
        if device.type == "cpu":
            return device
        have = self.node.transport.peer(self.rank).devices
        if str(device) not in have:
            raise ValueError(
                f"cannot place {cls.__qualname__} on {device}: node {self.rank} has "
                f"{', '.join(have) if have else 'no GPU'}"
            )
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
        cell.enter(key)
        token = current_call.set(CallContext(cell.label, key, chain, hook, cell.device))
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
            cell.leave(key)
            cell.wake()

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
        finally:
            del self._stopping[cell.actor_id]
            self._on_stop_ran.discard(cell.actor_id)
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

    async def stop_all(self, exit_: ActorExit | None = None) -> None:
        """Stop every user actor of this node, the system is ending; whoever waits hears so.

        With ``exit_`` (the node leaves a system that goes on), their names are released as they stop.
        """
        cells = [cell for cell in self.node.cells() if cell.actor_id > SYSTEM_IDS]
        ending = exit_ or ActorExit("shutdown")
        await asyncio.gather(*(self.stop(cell, ending, release_name=exit_ is not None) for cell in cells))
        await self.process_groups.close()
        self.supervisor.close()
        self.events.close()

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
            await self.registry.call(Registry.release, name, reason)
        except Exception as exc:  # noqa: BLE001 - what failed before matters more
            self.node.log.warning("could not release name", name=name, error=repr(exc))

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """This node and its actors as plain data: counters, queue depths, per-endpoint handler times.

        For ``actorch status`` and the metrics exporter; read-only, and cheap
        enough to ask for every second.
        """
        node = self.node
        info = node.transport.peer(self.rank)
        actors = []
        for cell in node.cells():
            if cell.actor_id <= SYSTEM_IDS:
                continue
            endpoints = {endpoint: stats.snapshot() for endpoint, stats in sorted(cell.metrics.items())}
            actors.append(
                {
                    "id": cell.actor_id,
                    "name": cell.name,
                    "class": type(cell.instance).__qualname__,
                    "label": cell.label,
                    **cell.statistics(),
                    # What its endpoints handled, as the endpoints count it: the cell's own count also
                    # holds its lifecycle hooks (on_start...), and a batch run there is one message.
                    "handled": sum(stats["calls"] for stats in endpoints.values()),
                    "endpoints": endpoints,
                }
            )
        return {
            **facts_of(info),  # rank, host, pid, devices, label, resources, owner, parent, pool
            **node_share(self.holdings, self.gpus.share()),
            "uptime": node.loop.time() - self._born,
            "statistics": node.statistics(),
            "actors": actors,
        }

    # ------------------------------------------------------------------ the system around

    def evict_names(self, names: list[str]) -> None:
        """Drop ``names`` from this node's cache (the registry released them)."""
        self.cache.evict(names)

    def name_event(self, seq: int, kind: str, name: str, ref: ActorRef[Any] | None, reason: str | None) -> None:
        """Hand the registry's change number ``seq`` to this node's event subscribers."""
        self.events.name_event(seq, kind, name, ref, reason)

    async def end(self, *, failed: bool) -> None:
        """Rank 0 ends the system: stop every user actor here; this worker then exits (code 1 if ``failed``)."""
        self.exit_code = 1 if failed else 0
        self.node.departing = True
        await self.stop_all()

    async def wait_ended(self) -> None:
        """Wait until this worker's system has ended: rank 0 said so, or was lost."""
        await self._ended.wait()

    def _on_peer_lost(self, rank: int, why: str) -> None:
        self.cache.evict_rank(rank)
        left = rank in self.node.left
        if not left:  # one that left was announced as NodeLeft already
            self.events.node_lost(rank, why)
        self._drop_names(rank, "node_left" if left else "node_lost")
        gone = self._gone.pop(rank, None)
        if gone is not None and not gone.done():
            gone.set_result(None)
        if rank == 0 and self.rank != 0:
            self._ended.set()

    def _drop_names(self, rank: int, reason: str) -> None:
        """On rank 0, drop every name of node ``rank`` from the registry, but those of actors it relocates."""
        if self.rank == 0 and not self.node.closed:
            cell = self.node.cell(REGISTRY_ID)
            relocator = self.node.cell(RELOCATOR_ID)
            moving: list[str] = []
            if reason == "node_lost" and relocator is not None and isinstance(relocator.instance, Relocator):
                moving = relocator.instance.node_lost(rank)
            if cell is not None and isinstance(cell.instance, Registry):
                cell.instance.drop_rank(rank, reason, hold=moving)

    def _on_peer_joined(self, info: NodeInfo) -> None:
        self.services.meet(info.rank)
        self.events.node_joined(info)

    # ------------------------------------------------------------------ leaving

    def check_leave(self, rank: object) -> None:
        """Raise if node ``rank`` may not leave: ``UnsupportedError`` for a static system, ``ValueError`` for rank 0."""
        if not self.node.transport.elastic and not self._added(rank):
            raise UnsupportedError("only a node of an elastic system can leave it (run(..., elastic=True))")
        if rank == 0:
            raise ValueError("rank 0 runs main and holds the registry: it cannot leave (return from main instead)")
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise ValueError(f"a node's rank is an int, not {rank!r}")

    def _added(self, rank: object) -> bool:
        """Whether node ``rank`` is a process started on demand (``add_nodes``): it may leave any system."""
        try:
            return self.node.transport.peer(rank).parent is not None  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False

    def begin_leave(self) -> None:
        """Start leaving the system, once; the node's process then exits with code 0.

        Raises:
            UnsupportedError: The system is not elastic.
            ValueError: This is rank 0 (it runs ``main`` and holds the registry).
        """
        self.check_leave(self.rank)
        if self._leave is None and not self._ended.is_set():
            self._leave = self.node.loop.create_task(self._leave_system())

    async def _leave_system(self) -> None:
        """Leave: announce it, stop every actor (``on_stop`` runs, names go), say it has left, end the node."""
        node = self.node
        self.leaving.add(self.rank)
        node.log.info("leaving the system", actors=sum(cell.actor_id > SYSTEM_IDS for cell in node.cells()))
        await self._tell_peers(NodeService.peer_leaving)
        await self.pool.close()
        await self.stop_all(ActorExit("node_left"))
        await self._tell_peers(NodeService.peer_left)
        self.exit_code = 0
        node.departing = True
        self._ended.set()

    async def _tell_peers(self, endpoint: Any) -> None:
        """Call ``endpoint(self.rank)`` of every other live node's service, each within ``LEAVE_CALL_TIMEOUT``."""
        node = self.node

        async def one(rank: int) -> None:
            try:
                async with asyncio.timeout(LEAVE_CALL_TIMEOUT):
                    await self.services[rank].call(endpoint, self.rank)
            except Exception as exc:  # noqa: BLE001 - a peer that does not hear sees this node lost instead
                node.log.warning("node did not hear that this one leaves", peer=rank, error=repr(exc))

        others = [rank for rank in node.ranks() if rank != self.rank and rank not in node.lost]
        await asyncio.gather(*(one(rank) for rank in others if rank not in self.leaving))  # those leaving need not hear

    def peer_leaving(self, rank: int) -> None:
        """Node ``rank`` is leaving: spawn nothing there."""
        self.leaving.add(rank)

    def peer_left(self, rank: int) -> None:
        """Node ``rank`` has left: its calls end in ``ActorStoppedError``, its names go, subscribers hear it."""
        if rank in self.node.left or rank in self.node.lost:
            return
        self.leaving.add(rank)
        self.node.peer_left(rank)
        self.cache.evict_rank(rank)
        self._drop_names(rank, "node_left")
        self.events.node_left(rank, "left the system")

    async def wait_gone(self, rank: int, limit: float) -> None:
        """Wait until node ``rank`` is gone (left, or lost), up to ``limit`` seconds (``TimeoutError``)."""
        if rank in self.node.lost:
            return
        gone = self._gone.get(rank)
        if gone is None:
            gone = self._gone[rank] = self.node.loop.create_future()
        async with asyncio.timeout(limit):
            await asyncio.shield(gone)

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
            traceback="".join(traceback.format_exception(error)),
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
