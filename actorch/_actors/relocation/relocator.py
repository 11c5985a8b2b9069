"""The relocator: rank 0's system actor (id 3), which moves relocatable actors whose node is lost.

A relocatable actor is adopted here once it has started: how to build it
again (a ``RelocationSpec``), where it lives now, and the last snapshot it
saved (``Actor.save_snapshot`` sends it here). Rank 0 runs ``main`` and holds
the registry, so its loss ends the system: it is the one place a snapshot
outlives every node whose loss the system survives, without a shared file
system. The cost is one transfer of the state per save, and rank 0's memory
for the last state of each relocatable actor. For the same reason no
relocatable actor lives on rank 0.

With a snapshot directory (``run(snapshots=DIR)``), the relocator also writes
each snapshot of a named actor there before the save returns (a
``SnapshotStore``), so that it outlives rank 0 too: a node that builds a
named relocatable actor afresh asks ``resume`` for its last one, and a
relocation whose actor saved nothing in this run starts it from there.

When a node is lost, rank 0's host asks the relocator which of its actors
move: their names stay reserved meanwhile (lookups wait; nobody else takes
them). After its policy's backoff (a relocation counts as a restart), each is
built again on the first node ``spec.eligible_nodes`` offers, its last
snapshot restored before its ``on_start``; then its name is bound to the new
home and the refs that asked where it went (``MovableRef``) are told. When no
node can host it, or its policy's restarts are used up, the name is released
and those refs get ``NodeLostError`` saying why.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from actorch._actors.actor import Actor
from actorch._actors.placement.fit import LEAVING, LOST, by_node
from actorch._actors.ref import ActorRef
from actorch._actors.registry import Registry
from actorch._actors.relocation.movable import MovableRef, Origin
from actorch._actors.relocation.snapshots import SnapshotStore
from actorch._actors.relocation.spec import RANK_0, RelocationSpec, eligible_nodes, restores_explicitly
from actorch._actors.restart import EXITS_KEPT, ActorExit, count_failure
from actorch._actors.system_endpoints import RelocatorEndpoints, ServiceEndpoints
from actorch._actors.where import Placed, Where
from actorch._base.config import SystemConfig
from actorch._base.errors import ActorStoppedError, NodeLostError, PlacementError, describe
from actorch._transport.base import NodeInfo

if TYPE_CHECKING:
    from actorch._engine.caller import Caller

__all__ = ["RelocationHost", "Relocator"]


class RelocationHost(Protocol):
    """What the relocator needs of rank 0's actor host: the nodes as it knows them, its refs, its loop and logger."""

    config: SystemConfig
    leaving: set[int]  # nodes leaving the system
    registry: ActorRef[Registry]

    @property
    def services(self) -> Mapping[int, ActorRef[Any]]:
        """Refs to every node's service, by rank."""

    @property
    def lost(self) -> Mapping[int, str]:
        """The nodes gone for good, with why."""

    @property
    def log(self) -> Any:
        """The node's logger."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The node's event loop."""

    @property
    def caller(self) -> Caller:
        """The node's caller: the context refs in a snapshot read from a file are rebuilt in."""

    def peers(self) -> list[NodeInfo]:
        """Every node of the world, by rank."""


@dataclass(eq=False)
class _Relocatable:
    """One relocatable actor as rank 0 knows it."""

    spec: RelocationSpec
    home: Origin  # where it lives now: (rank, actor id)
    state: tuple[Any] | None = None  # the last snapshot it saved, if any
    moving: asyncio.Task[None] | None = None  # while it is being built again elsewhere
    target: int | None = None  # the node it is being built on, while it moves
    moves: int = 0
    failures: deque[float] = field(default_factory=deque)
    changed: asyncio.Future[None] | None = None  # set (and dropped) when home or moving changes

    @property
    def label(self) -> str:
        return self.spec.label(self.home)

    def notify(self) -> None:
        if self.changed is not None and not self.changed.done():
            self.changed.set_result(None)
        self.changed = None

    async def wait_change(self) -> None:
        if self.changed is None:
            self.changed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self.changed)


class _NotMoved(Exception):  # noqa: N818 - an outcome, raised only between the relocator's own methods
    """The actor cannot be relocated; the message says why."""


class Relocator(Actor, RelocatorEndpoints):
    """Rank 0's record of every relocatable actor and its last snapshot; it moves those whose node is lost."""

    max_concurrency = 1 << 30  # refs wait here while their actor moves

    def __init__(self, host: RelocationHost, store: SnapshotStore | None) -> None:
        """Move actors through ``host``; keep named actors' snapshots in ``store`` too, if the system has one."""
        self._host = host
        self._actors: dict[Origin, _Relocatable] = {}
        self._unadopted: dict[Origin, tuple[Any]] = {}  # snapshots saved by on_start, before the adoption
        self._ended: OrderedDict[Origin, ActorExit] = OrderedDict()  # how actors no longer here ended
        self._moves: set[asyncio.Task[None]] = set()
        self._counts = {"relocated": 0, "not_relocated": 0, "snapshots": 0}
        self._store = store

    async def adopt(self, spec: RelocationSpec) -> None:
        """Relocate the actor ``spec`` says when its node is lost (its host calls this once it started)."""
        origin = spec.origin
        state = self._unadopted.pop(origin, None)
        if origin[0] in self._host.lost:
            raise NodeLostError(f"{spec.label(origin)} cannot be relocated: its node was lost as it started")
        self._actors[origin] = _Relocatable(spec, origin, state)

    async def keep(self, origin: Origin, rank: int, state: Any, name: str | None = None) -> None:
        """Keep ``state`` as the last snapshot of the actor ``origin`` (``name``), sent by its instance on ``rank``.

        The instance may be starting (its ``on_start`` saves): on its first
        node before it is adopted, or on the node it is moving to. A named
        actor's snapshot is also written to the snapshot directory, if the
        system has one, before this returns.

        Raises:
            ActorStoppedError: That instance no longer hosts the actor (it moved on, or stopped).
            SerializationError: The state cannot be written to a file (it is kept in memory all the same).
            OSError: The snapshot file cannot be written (it is kept in memory all the same).
        """
        origin = (origin[0], origin[1])
        entry = self._actors.get(origin)
        if entry is None and rank == origin[0] and origin not in self._ended:
            self._unadopted[origin] = (state,)
        elif entry is not None and rank == (entry.home[0] if entry.moving is None else entry.target):
            entry.state = (state,)
        else:
            where = "it stopped" if entry is None else f"it lives on node {entry.home[0]} now"
            raise ActorStoppedError(f"a snapshot from node {rank} is not kept: {where}")
        self._counts["snapshots"] += 1
        if self._store is not None and name is not None:
            await self._store.save(name, state)

    async def resume(self, name: str) -> tuple[Any] | None:
        """The last snapshot of the actor named ``name`` in the snapshot directory, as ``(state,)``; None if none.

        A node asks this as it builds a named relocatable actor afresh. A
        newest file that cannot be read is passed over, with a warning on
        this node naming the actor and the file.
        """
        if self._store is None:
            return None
        return await self._store.load(name, self._host.caller)

    async def latest(self, name: str) -> tuple[int, float, str] | None:
        """The newest snapshot file of the actor named ``name``, unread: ``(serial, saved, path)``; None if none.

        ``saved`` is when it was written, in seconds since the epoch.
        """
        found = None if self._store is None else await self._store.latest(name)
        return None if found is None else (found.serial, found.saved, found.path)

    async def forget(self, origin: Origin, exit_: ActorExit) -> None:
        """The actor ``origin`` stopped for good, as ``exit_`` says: it moves no more."""
        origin = (origin[0], origin[1])
        entry = self._actors.pop(origin, None)
        self._unadopted.pop(origin, None)
        self._end(origin, exit_)
        if entry is not None:
            entry.notify()

    async def home(self, origin: Origin, stale: int) -> Origin | ActorExit:
        """Where the actor ``origin`` lives, once it no longer lives on node ``stale``; how it ended if nowhere.

        Waits while it moves, and while this node has yet to count ``stale``
        lost, up to the system's ``lookup_timeout`` (or the caller's deadline).
        """
        origin = (origin[0], origin[1])
        limit = self._host.config.lookup_timeout
        try:
            async with asyncio.timeout(limit):
                while True:
                    entry = self._actors.get(origin)
                    if entry is None:
                        ended = self._ended.get(origin)
                        why = f"node {stale} was lost and the actor is not relocatable"
                        return ended or ActorExit("node_lost", why)
                    if entry.home[0] != stale and entry.moving is None:
                        return entry.home
                    await entry.wait_change()
        except TimeoutError:
            return ActorExit("node_lost", f"node {stale} was lost and the actor was not relocated within {limit:g} s")

    def node_lost(self, rank: int) -> list[str]:
        """Node ``rank`` was lost: start moving every actor that lived there; the names to keep reserved for them.

        Not an endpoint: rank 0's host calls it as it hears of the loss,
        before the registry drops the node's names.
        """
        names = []
        for origin, entry in self._actors.items():
            if entry.home[0] == rank and entry.moving is None:
                self._start_move(origin, entry, rank)
                if entry.spec.request.name is not None:
                    names.append(entry.spec.request.name)
        return names

    def statistics(self) -> dict[str, int]:
        """Relocatable actors known, moving now, relocated and not relocated so far, snapshots kept and written."""
        moving = sum(1 for entry in self._actors.values() if entry.moving is not None)
        written = 0 if self._store is None else self._store.written
        return {"relocatable": len(self._actors), "moving": moving, **self._counts, "written": written}

    # ------------------------------------------------------------------ moving

    def _start_move(self, origin: Origin, entry: _Relocatable, lost: int) -> None:
        entry.moving = task = self._host.loop.create_task(self._move(origin, entry, lost))
        self._moves.add(task)
        task.add_done_callback(self._moves.discard)
        entry.notify()

    async def _move(self, origin: Origin, entry: _Relocatable, lost: int) -> None:
        """Build the actor again elsewhere, bind its name there; or give it up, releasing the name."""
        spec, log = entry.spec, self._host.log
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            ref = await self._rebuild(entry, lost)
        except _NotMoved as exc:
            why = f"node {lost} was lost, and the actor could not be relocated: {exc}"
            log.error("actor not relocated", actor=entry.label, why=str(exc))
            self._counts["not_relocated"] += 1
            self._actors.pop(origin, None)
            self._end(origin, ActorExit("node_lost", why, entry.moves))
            entry.moving = None
            entry.notify()
            if spec.request.name is not None:
                await self._host.registry.call(Registry.release, spec.request.name, "node_lost")
            return
        if self._actors.get(origin) is not entry:  # it stopped for good before its node was lost: no new life
            log.info("relocated actor had stopped; stopping it again", actor=entry.label)
            await ref.stop()
            if spec.request.name is not None:
                await self._host.registry.call(Registry.release, spec.request.name, "stopped")
            return
        moved_from = entry.label
        entry.home, entry.moving = (ref.rank, ref._actor_id), None
        entry.moves += 1
        self._counts["relocated"] += 1
        if ref.rank in self._host.lost:  # lost again while it started there: move on at once
            self._start_move(origin, entry, ref.rank)
            return
        if spec.request.name is not None:
            try:
                await self._host.registry.call(Registry.bind, spec.request.name, ref)
            except Exception as exc:  # noqa: BLE001 - its refs still find it; the name follows its next move
                log.warning("relocated actor's name not bound", actor=entry.label, error=describe(exc))
        entry.notify()
        log.info(
            "actor relocated",
            actor=moved_from,
            to_node=ref.rank,
            snapshot=entry.state is not None,
            seconds=round(loop.time() - began, 3),
        )

    async def _rebuild(self, entry: _Relocatable, lost: int) -> ActorRef[Any]:
        """After the policy's backoff, build the actor on the best node that takes it, its snapshot restored."""
        spec, restart = entry.spec, entry.spec.request.restart
        assert restart is not None  # a relocatable actor has its policy
        failures = count_failure(entry.failures, restart)
        if failures > restart.max_restarts:
            raise _NotMoved(f"its policy's {failures - 1} restarts were used up")
        await asyncio.sleep(restart.delay(failures))
        await self._settled(spec.request.where)
        store, name = self._store, spec.request.name
        if entry.state is None and store is not None and name is not None and not restores_explicitly(spec.request):
            entry.state = await store.load(name, self._host.caller)  # it started from there, saved nothing since
        refused: dict[int, str] = {}
        while True:
            load: dict[int, int] = {}
            for other in self._actors.values():
                load[other.home[0]] = load.get(other.home[0], 0) + 1
            chosen, unfit = eligible_nodes(spec, self._host.peers(), self._unavailable(), load, self._home_of)
            candidates = [rank for rank in chosen if rank not in refused]
            if not candidates:
                raise _NotMoved(f"no node can host it ({by_node({**unfit, **refused})})")
            rank = entry.target = candidates[0]
            try:
                ref: ActorRef[Any] = await self._host.services[rank].call(
                    ServiceEndpoints.spawn, spec.request, origin=spec.origin, kept=entry.state
                )
            except (PlacementError, NodeLostError) as exc:
                refused[rank] = describe(exc)
            except Exception as exc:  # the actor's own code failed there: it would anywhere
                raise _NotMoved(f"starting it on node {rank} failed: {describe(exc)}") from exc
            else:
                return ref

    async def _settled(self, where: Where) -> None:
        """Wait while an actor ``where`` is near or apart from moves: where it lands decides where this one goes."""
        for ref in (*((where.near,) if where.near is not None else ()), *where.apart):
            entry = self._actors.get(ref.origin) if isinstance(ref, MovableRef) else None
            while entry is not None and entry.moving is not None:
                await entry.wait_change()

    def _home_of(self, ref: Placed) -> int | None:
        """The node ``ref``'s actor lives on now: a relocatable one's as this relocator knows it (None: ended)."""
        if not isinstance(ref, MovableRef):
            return ref.rank
        entry = self._actors.get(ref.origin)
        return None if entry is None else entry.home[0]

    def _unavailable(self) -> dict[int, str]:
        host = self._host
        unavailable = dict.fromkeys(host.leaving, LEAVING)
        unavailable.update(dict.fromkeys(host.lost, LOST))
        unavailable[0] = RANK_0
        return unavailable

    def _end(self, origin: Origin, exit_: ActorExit) -> None:
        self._ended[origin] = exit_
        while len(self._ended) > EXITS_KEPT:
            self._ended.popitem(last=False)
