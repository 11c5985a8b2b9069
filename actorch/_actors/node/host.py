"""``ActorHost``: one node, the lives of its actors, and the node's part in the system.

The host holds the node and an ``ActorLifecycle`` (see ``lifecycle``), which
builds, starts, restarts and stops the node's actors. It also holds what the
node keeps of the system: its name cache, its membership events, refs to
every node's service and to the registry, which nodes leave, and how the node
is told the system ends. ``ActorSystem`` (the user's handle), the node service,
the placer, the relocator, the node's pool and the launcher all go through its
public methods: the nodes as this node knows them (``peers``, ``lost``...),
its logger and loop, its end (``depart``, ``close``) and what it is doing now
(``calls_waiting``, ``answer_off_loop``...). None of them reaches through to
the engine's ``Node`` it holds (``tests/project/test_layers.py`` holds that);
the parts it builds with that node (its lifecycle, its process groups) are
given it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from time import perf_counter_ns
from typing import Any, TypeVar

from actorch._actors.actor import class_path
from actorch._actors.events import EventHub
from actorch._actors.node.lifecycle import ActorLifecycle, Bind, handled_by_endpoints
from actorch._actors.node.processes import NodePool
from actorch._actors.node.service import NodeService
from actorch._actors.node_share import NodeShare
from actorch._actors.placement.gpus import GpuShare
from actorch._actors.placement.holdings import node_share
from actorch._actors.process_groups import ProcessGroups
from actorch._actors.ref import ActorRef, make_ref
from actorch._actors.registry import NameCache, Registry
from actorch._actors.relocation.relocator import Relocator
from actorch._actors.relocation.snapshots import SnapshotStore
from actorch._actors.restart import ActorExit
from actorch._actors.spawn_request import SpawnRequest
from actorch._base.config import SystemConfig
from actorch._base.errors import UnsupportedError
from actorch._engine.caller import Caller
from actorch._engine.calls import RemoteCall
from actorch._engine.cell import Cell
from actorch._engine.node import Node
from actorch._engine.system_ids import REGISTRY_ID, RELOCATOR_ID, SERVICE_ID, SYSTEM_IDS
from actorch._engine.timeline import Timeline
from actorch._engine.tracing import TraceSettings
from actorch._transport.base import NodeInfo, Transport
from actorch._transport.capabilities import is_elastic
from actorch._transport.membership import facts_of

__all__ = ["ActorHost"]

LEAVE_CALL_TIMEOUT = 5.0
"""Seconds a leaving node waits for each other node to hear that it leaves, and that it has left."""


S = TypeVar("S")


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
    """This node, the lives of its actors (``lifecycle``), and the node's share of the system."""

    def __init__(self, transport: Transport, config: SystemConfig, bind: Bind) -> None:
        self.node = Node(transport, config, asyncio.get_running_loop())
        self.rank = self.node.rank
        self.config = config
        self.registry: ActorRef[Registry] = make_ref(self.node.caller, 0, REGISTRY_ID, None, class_path(Registry))
        self.leaving: set[int] = set()  # nodes leaving the system (this one too, once it leaves): no spawns there
        self.lifecycle = ActorLifecycle(self.node, config, bind, self.registry, self.leaving)
        self._rank0: tuple[Registry, Relocator] | None = None  # on rank 0, once built: its registry and relocator
        self.cache = NameCache()
        self.events = EventHub()
        self.process_groups = ProcessGroups(self.node)
        self.pool = NodePool(self)
        self.services = ServiceRefs(self.node.caller)
        # Its own too: the registry evicts released names on every node it holds, and in an elastic world (every
        # local launch's) this node is never one that joins. Without it rank 0 kept a stopped actor's name cached.
        self.services.meet(self.rank)
        for rank in range(self.node.world_size):  # a static world's; an elastic one's come as they join
            self.services.meet(rank)
        self.exit_code: int | None = None  # a worker's, once rank 0 said the system ends
        self.timeline: Timeline | None = None  # the timeline this node records for the system (its system.trace)
        self._ended = asyncio.Event()  # a worker's system ended (rank 0 said so, or was lost)
        self._born = self.node.loop.time()
        self._leave: asyncio.Task[None] | None = None
        self._gone: dict[int, asyncio.Future[None]] = {}  # peers someone waits to see gone
        self.node.on_peer_lost(self._on_peer_lost)
        self.node.on_peer_joined(self._on_peer_joined)

    def __repr__(self) -> str:
        return f"<ActorHost node {self.rank} actors={len(self.node.cells())}>"

    async def start_services(self) -> None:
        """Host this node's service, and on rank 0 the registry and the relocator."""
        build = self.lifecycle.build
        await build(SpawnRequest(class_path(NodeService), (self,)), system_id=SERVICE_ID)
        if self.rank == 0:
            await build(SpawnRequest(class_path(Registry), (self.services,)), system_id=REGISTRY_ID)
            await build(SpawnRequest(class_path(Relocator), (self, self._snapshots())), system_id=RELOCATOR_ID)
            self._rank0 = (self._built(REGISTRY_ID, Registry), self._built(RELOCATOR_ID, Relocator))

    def _snapshots(self) -> SnapshotStore | None:
        """Rank 0's snapshot directory, for its relocator, if the system has one (``OSError`` if unusable)."""
        directory, node = self.config.snapshots, self.node
        return (
            None
            if directory is None
            else SnapshotStore(directory, self.config.snapshots_kept, node.caller.codec, node.log)
        )

    def _built(self, actor_id: int, cls: type[S]) -> S:
        """The instance of system actor ``actor_id`` this host just built (system actors are never restarted)."""
        cell = self.node.cell(actor_id)
        instance = None if cell is None else cell.instance
        if not isinstance(instance, cls):
            raise RuntimeError(f"system actor {actor_id} on node {self.rank} is not a {cls.__name__}: {instance!r}")
        return instance

    # ------------------------------------------------------------------ the nodes, as this node knows them

    @property
    def world_size(self) -> int:
        """How many nodes the world has now (it changes as nodes join and leave an elastic world)."""
        return self.node.world_size

    def peers(self) -> list[NodeInfo]:
        """Every node of the world, by rank (those that left are forgotten; lost ones stay)."""
        return self.node.peers()

    def ranks(self) -> list[int]:
        """The ranks of every node of the world, by rank (lost ones too, not those that left)."""
        return self.node.ranks()

    def peer(self, rank: int) -> NodeInfo:
        """What node ``rank`` says of itself (host, devices, resources...); ``KeyError`` if this node never met it."""
        return self.node.transport.peer(rank)

    def knows(self, rank: int) -> bool:
        """Whether this node has met node ``rank`` (one that joins is met once rank 0 has told this node)."""
        return self.node.transport.knows(rank)

    @property
    def lost(self) -> Mapping[int, str]:
        """The nodes gone for good (lost, or left after saying so), with why; it grows as they go."""
        return self.node.lost

    @property
    def left(self) -> AbstractSet[int]:
        """The nodes that said they have left the system."""
        return self.node.left

    def on_peer_joined(self, listener: Callable[[NodeInfo], None]) -> None:
        """Call ``listener(info)`` when a node joins the world."""
        self.node.on_peer_joined(listener)

    def on_peer_lost(self, listener: Callable[[int, str], None]) -> None:
        """Call ``listener(rank, why)`` when a peer node is lost."""
        self.node.on_peer_lost(listener)

    # ------------------------------------------------------------------ the node's logger, loop and caller

    @property
    def log(self) -> Any:
        """This node's logger, bound to its rank (what it logs at info and above goes to the run's record too)."""
        return self.node.log

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this node runs on."""
        return self.node.loop

    @property
    def caller(self) -> Caller:
        """What this node's refs send through, and the context refs in what it decodes are rebuilt in."""
        return self.node.caller

    # ------------------------------------------------------------------ actors, as the node service asks

    async def build(
        self, request: SpawnRequest, *, origin: tuple[int, int] | None = None, kept: tuple[Any] | None = None
    ) -> ActorRef[Any]:
        """Build and start the actor ``request`` asks for here (``ActorLifecycle.build``)."""
        return await self.lifecycle.build(request, origin=origin, kept=kept)

    async def stop_actor(self, actor_id: int, exit_: ActorExit) -> None:
        """Stop local actor ``actor_id`` if it is still here."""
        await self.lifecycle.stop_actor(actor_id, exit_)

    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """How local actor ``actor_id`` ended, once it has."""
        return await self.lifecycle.wait_stopped(actor_id)

    # ------------------------------------------------------------------ resources

    def gpu_share(self) -> GpuShare:
        """This node's GPUs and the actors holding them."""
        return self.lifecycle.gpus.share()

    def resource_share(self) -> NodeShare:
        """What this node has free and who holds what (``placement.holdings.node_share``)."""
        return node_share(self.lifecycle.holdings, self.lifecycle.gpus.share())

    # ------------------------------------------------------------------ what the node does now

    def statistics(self) -> dict[str, Any]:
        """This node's counters: calls and tells sent and received, messages refused, bytes (``Node.statistics``)."""
        return self.node.statistics()

    @property
    def tracing(self) -> bool:
        """Whether this node records its part of a timeline now."""
        return self.node.trace is not None

    def calls_waiting(self) -> list[RemoteCall[Any]]:
        """The calls this node sent and has not heard back from, the oldest first (any thread may ask: a copy)."""
        return sorted(
            (call for call in list(self.node.caller.pending.values()) if call.sent_at), key=lambda c: c.sent_at
        )

    def busy_actors(self) -> list[Cell]:
        """The cells of this node's user actors that run a handler now."""
        return [cell for cell in self.node.cells() if cell.actor_id > SYSTEM_IDS and cell.running]

    def loop_behind(self) -> float:
        """Seconds this node's event loop is late for its last probe (0 while it keeps up); any thread may ask."""
        return self.node.loop_lag.behind()

    def answer_off_loop(self, question: str) -> dict[str, Any]:
        """Answer ``question`` of this node from any thread, its loop blocked or not (``Node.answer_off_loop``)."""
        return self.node.answer_off_loop(question)

    def ask_off_loop(self, rank: int, question: str, timeout: float) -> Any:
        """Ask node ``rank``'s threads ``question`` within ``timeout`` seconds; blocking, so call it off the loop."""
        return self.node.transport.ask_off_loop(rank, question, timeout)

    def write_record(self, event: str, **fields: Any) -> None:
        """Write ``event`` with ``fields`` to this node's run record, if it keeps one."""
        if self.node.record is not None:
            self.node.record.write(event, **fields)

    # ------------------------------------------------------------------ status

    def start_trace(self, settings: TraceSettings) -> None:
        """Record this node's part of a timeline from now on (``ActorSystem.trace``)."""
        self.node.start_trace(settings)

    def stop_trace(self) -> dict[str, Any] | None:
        """Stop recording this node's part of a timeline; what it recorded, or None if none ran."""
        return self.node.stop_trace()

    def status(self) -> dict[str, Any]:
        """This node and its actors as plain data: counters, queue depths, per-endpoint handler times.

        For ``actorch status`` and the metrics exporter; read-only, and cheap
        enough to ask for every second.
        """
        node = self.node
        info = node.transport.peer(self.rank)
        actors = []
        now = perf_counter_ns()
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
                    "handled": handled_by_endpoints(cell),  # as a run's record counts it: its hooks apart
                    "hooks": self.lifecycle.hooks_run(cell.actor_id),
                    "endpoints": endpoints,
                    **cell.waits(now),  # handlers (endpoint, seconds, key, caller), queued_seconds, queued_callers
                }
            )
        return {
            **facts_of(info),  # rank, host, pid, devices, label, resources, owner, parent, pool
            **self.resource_share(),
            "uptime": node.loop.time() - self._born,
            "statistics": node.statistics(),
            "loop": node.loop_lag.snapshot(),
            "actors": actors,
        }

    # ------------------------------------------------------------------ the system around

    def evict_names(self, names: list[str]) -> None:
        """Drop ``names`` from this node's cache (the registry released them)."""
        self.cache.evict(names)

    def name_event(self, seq: int, kind: str, name: str, ref: ActorRef[Any] | None, reason: str | None) -> None:
        """Hand the registry's change number ``seq`` to this node's event subscribers."""
        self.events.name_event(seq, kind, name, ref, reason)

    async def stop_all(self, exit_: ActorExit | None = None) -> None:
        """Stop every user actor of this node, the system is ending; whoever waits hears so.

        With ``exit_`` (the node leaves a system that goes on), their names are released as they stop.
        """
        cells = [cell for cell in self.node.cells() if cell.actor_id > SYSTEM_IDS]
        ending = exit_ or ActorExit("shutdown")
        stop = self.lifecycle.stop
        await asyncio.gather(*(stop(cell, ending, release_name=exit_ is not None) for cell in cells))
        await self.process_groups.close()
        self.lifecycle.supervisor.close()
        self.events.close()

    async def end(self, *, failed: bool) -> None:
        """Rank 0 ends the system: stop every user actor here; this worker then exits (code 1 if ``failed``)."""
        self.exit_code = 1 if failed else 0
        self.node.departing = True
        await self.stop_all()

    async def wait_ended(self) -> None:
        """Wait until this worker's system has ended: rank 0 said so, or was lost."""
        await self._ended.wait()

    @property
    def departing(self) -> bool:
        """Whether this node is ending or has left: peers it loses from now on are expected."""
        return self.node.departing

    def depart(self) -> None:
        """Say that this node is ending: peers it loses from now on are expected (logged at debug level)."""
        self.node.departing = True

    @property
    def closed(self) -> bool:
        """Whether this node is closed (or cut off): it sends nothing more."""
        return self.node.closed

    async def close(self) -> None:
        """Close this node: fail every pending call, cancel running handlers and leave the transport."""
        await self.node.close()

    def cut_off(self) -> None:
        """Stop sending, as if this node's process had died (for in-process test worlds)."""
        self.node.cut_off()

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
        """On rank 0, drop every name of node ``rank`` from the registry, but those of actors it relocates.

        Not through calls: the relocator reserves the names of the actors it
        moves, and the registry drops the rest, as this node hears of the
        loss, so that no lookup in between finds a relocating actor gone.
        """
        if self._rank0 is not None and not self.node.closed:
            registry, relocator = self._rank0
            moving = relocator.node_lost(rank) if reason == "node_lost" else []
            registry.drop_rank(rank, reason, hold=moving)

    def _on_peer_joined(self, info: NodeInfo) -> None:
        self.services.meet(info.rank)
        self.events.node_joined(info)

    # ------------------------------------------------------------------ leaving

    def check_leave(self, rank: object) -> None:
        """Raise if node ``rank`` may not leave: ``UnsupportedError`` for a static system, ``ValueError`` for rank 0."""
        if not is_elastic(self.node.transport) and not self._added(rank):
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
                gone = rank in node.lost or rank in node.left  # it left (or died) meanwhile: it need not hear
                say = node.log.debug if gone else node.log.warning
                say("node did not hear that this one leaves", peer=rank, error=repr(exc))

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
