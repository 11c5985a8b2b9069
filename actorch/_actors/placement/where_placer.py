"""The one placer: which node every spawn goes to, and node processes on demand (``add_nodes``, ``wait_nodes``).

A :class:`Placer` serves one node's ``ActorSystem``. Every spawn reaches it
with one ``Where`` (``on=rank`` and ``gpus=`` are parts of it, see
``where.where_of``). It first sets aside, from what it knows of the nodes
(``NodeInfo``: label, host, resources, owner), those that cannot fit at all
(``fit.refusal``; a ``Where`` that names a rank has that node alone), then,
if the actor holds anything there, asks the rest what they have free (their
service's ``resources``, a ``NodeShare``), tries the first that fits (this
node, then the lowest rank) and moves on if that node's host finds it taken
meanwhile. A group is planned in one go over the same answers: spread (each
member on the node with the fewest members so far) or packed (each node
filled before the next). When nothing fits, ``PlacementError`` names every
node and why, unless the caller asked to wait; then it tries again whenever
a node joins, and every so often for resources given back, until the
caller's deadline. A process of the actor's own is a node added for it
(``add_nodes``, by rank 0 or a host agent, with a ``NodeRequest``) on which
it is the *owner*: the node leaves when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Protocol, TypeVar

from actorch._actors.node_request import NodeRequest
from actorch._actors.node_share import NodeShare
from actorch._actors.placement.fit import EPSILON, LEAVING, LOST, RANK_0, by_node, lacks_free, refusal
from actorch._actors.ref import ActorRef
from actorch._actors.spawn_request import SpawnRequest
from actorch._actors.system_endpoints import ServiceEndpoints
from actorch._actors.where import Where
from actorch._base.config import SystemConfig
from actorch._base.deadline import current_deadline
from actorch._base.errors import NodeLostError, PlacementError, UnsupportedError
from actorch._transport.base import NodeInfo

__all__ = ["Placer", "PlacerHost", "SpawnThere", "all_or_none"]

T = TypeVar("T")

RETRY_FIRST = 0.05
"""Seconds before a spawn waiting for capacity looks again (doubling up to ``RETRY_MOST``), if no node joined."""
RETRY_MOST = 1.0
MEET_WITHIN = 30.0
"""Seconds a node that asked for node processes waits to be told of them, once they have joined."""

SpawnThere = Callable[[int, SpawnRequest], Awaitable[T]]
"""Spawns the request's actor on node ``rank`` (the node raises ``PlacementError`` if what it holds is taken)."""


class PlacerHost(Protocol):
    """What the placer needs of its node's actor host: the nodes as it knows them, refs to their services."""

    rank: int
    config: SystemConfig
    leaving: set[int]  # nodes leaving the system (this one too, once it leaves)

    @property
    def services(self) -> Mapping[int, ActorRef[Any]]:
        """Refs to every node's service, by rank."""

    @property
    def lost(self) -> Mapping[int, str]:
        """The nodes gone for good, with why."""

    @property
    def left(self) -> AbstractSet[int]:
        """The nodes that said they have left."""

    @property
    def log(self) -> Any:
        """The node's logger."""

    def peers(self) -> list[NodeInfo]:
        """Every node of the world, by rank."""

    def peer(self, rank: int) -> NodeInfo:
        """What node ``rank`` says of itself."""

    def knows(self, rank: int) -> bool:
        """Whether this node has met node ``rank``."""

    def on_peer_joined(self, listener: Callable[[NodeInfo], None]) -> None:
        """Call ``listener(info)`` when a node joins."""


class Placer:
    """Finds the node of every spawn and group of one node's system, and adds node processes for it."""

    def __init__(self, host: PlacerHost) -> None:
        """Place the spawns of ``host``'s node (its ``ActorHost``)."""
        self._host = host
        self._changed = asyncio.Event()
        host.on_peer_joined(lambda info: self._changed.set())

    def __repr__(self) -> str:
        return f"<Placer node {self._host.rank}>"

    async def spawn(
        self,
        what: str,
        request: SpawnRequest,
        names: list[str | None],
        owners: list[str],
        spread: bool | None,
        spawn_there: SpawnThere[T],
    ) -> list[T]:
        """Spawn ``request``'s actor once per name: in processes of their own, as a group (``spread`` given), or one.

        Args:
            what: The spawn, as its errors name it (``spawn(Learner, gpus=2, on=1)``).
            request: The spawn, its placement in ``request.where``.
            names: One name per actor (a group's members), or None for an unnamed one.
            owners: One name per actor for its own process, when ``request.where`` asks for one.
            spread: For a group: spread rather than packed; None for one actor.
            spawn_there: Spawns a request on a node, which raises ``PlacementError`` if what it holds is taken.
        """
        requests = [request.named(name) for name in names]
        if request.own:
            return await self.own_processes(requests, owners, spawn_there)
        if spread is None:
            return [await self.place(what, requests[0], spawn_there)]
        return await self.place_group(what, requests, spread, spawn_there)

    # ------------------------------------------------------------------ one actor

    async def place(self, what: str, request: SpawnRequest, spawn_there: SpawnThere[T]) -> T:
        """Spawn on the first node that fits ``request``, waiting for one if its ``Where`` says so."""
        where = request.where
        async with self._bounded(where) as attempts:
            while True:
                refusals, fitting, _ = await self._survey(request)
                for rank in fitting:
                    try:
                        return await spawn_there(rank, request.placed())
                    except PlacementError as exc:
                        why = await self._refusal_now(rank, request)
                        if why is None:
                            raise  # not for want of room: the device check, or the actor's own code, raised it
                        refusals[rank] = why
                        attempts.last = exc
                attempts.last = PlacementError(f"{what}: no node fits; {by_node(refusals)}")
                if not where.wait:
                    raise attempts.last
                await attempts.pause()

    async def place_group(
        self, what: str, requests: Sequence[SpawnRequest], spread: bool, spawn_there: SpawnThere[T]
    ) -> list[T]:
        """Spawn a member per request on nodes that fit, spread or packed, all or none (they differ by name alone)."""
        count, where = len(requests), requests[0].where
        async with self._bounded(where) as attempts:
            while True:
                refusals, fitting, free = await self._survey(requests[0])
                plan = _plan(count, fitting, free, requests[0].needs(), spread)
                if len(plan) == count:
                    return await all_or_none(
                        spawn_there(rank, requests[index].placed()) for index, rank in enumerate(plan)
                    )
                room = f"room for {len(plan)} of {count} members" if plan else "no node fits"
                for rank in fitting:
                    refusals[rank] = f"room for {plan.count(rank)}"
                attempts.last = PlacementError(f"{what}: {room}; {by_node(refusals)}")
                if not where.wait:
                    raise attempts.last
                await attempts.pause()

    # ------------------------------------------------------------------ what nodes have

    async def _survey(self, request: SpawnRequest) -> tuple[dict[int, str], list[int], dict[int, dict[str, float]]]:
        """Why each node that cannot take ``request`` does not, those that can now (best first), what they have free."""
        host = self._host
        self._changed.clear()  # a node that joins from now on wakes a placement that waits
        named = request.where.rank
        refusals: dict[int, str] = {}
        asked: list[NodeInfo] = []
        unavailable = self._unavailable(request)
        for info in host.peers():
            if named is not None and info.rank != named:
                continue  # the exact form: the node named is the one candidate, and the others are no reason
            why = refusal(info, request, unavailable)
            if why is None:
                asked.append(info)
            else:
                refusals[info.rank] = why
        needs = request.needs()
        free: dict[int, dict[str, float]] = {}
        if not needs:  # it holds nothing: what nodes have free does not matter, and asking costs a round trip each
            fitting = [info.rank for info in asked]
        else:
            fitting = []
            answers = await asyncio.gather(*(self._share(info.rank) for info in asked))
            for info, share in zip(asked, answers, strict=True):
                if share is None:
                    refusals[info.rank] = LOST
                    continue
                free[info.rank] = share["free"]
                why = lacks_free(share, needs)
                if why is None:
                    fitting.append(info.rank)
                else:
                    refusals[info.rank] = why
        own = host.rank
        fitting.sort(key=lambda rank: (rank != own, rank))
        return refusals, fitting, free

    def _unavailable(self, request: SpawnRequest) -> dict[int, str]:
        """The nodes that take no actor of ``request`` now, and why: lost, leaving, or rank 0 for a relocatable one."""
        host = self._host
        unavailable = dict.fromkeys(host.left | host.leaving, LEAVING)
        unavailable.update(dict.fromkeys(host.lost, LOST))
        if request.relocatable:
            unavailable.setdefault(0, RANK_0)
        return unavailable

    async def _share(self, rank: int) -> NodeShare | None:
        """What node ``rank`` has free and who holds what; None if it is lost."""
        try:
            found: NodeShare = await self._host.services[rank].call(ServiceEndpoints.resources)
        except NodeLostError:
            return None
        return found

    async def _refusal_now(self, rank: int, request: SpawnRequest) -> str | None:
        """Why node ``rank`` refuses ``request`` now, asked again; None if it has room (the refusal was not its)."""
        needs = request.needs()
        if not needs:
            return None  # it holds nothing there: room was not why
        share = await self._share(rank)
        return LOST if share is None else lacks_free(share, needs)

    def _bounded(self, where: Where) -> _Attempts:
        limit = None if not where.wait else self._host.config.lookup_timeout
        return _Attempts(self._changed, limit)

    # ------------------------------------------------------------------ processes of their own

    async def own_processes(
        self, requests: Sequence[SpawnRequest], owners: list[str], spawn_there: SpawnThere[T]
    ) -> list[T]:
        """Start a node process per request, then spawn each actor in its own; all or none.

        A node whose actor could not be spawned leaves the system again.
        """
        where = requests[0].where
        asked = NodeRequest(len(requests), where.label, env=where.env or {}, host=where.host, owners=tuple(owners))
        infos = await self.add_nodes(asked)

        async def spawn_one(index: int, rank: int) -> T:
            try:
                return await spawn_there(rank, requests[index])
            except BaseException:
                await asyncio.shield(self._dismiss(rank))
                raise

        return await all_or_none(spawn_one(index, info.rank) for index, info in enumerate(infos))

    async def _dismiss(self, rank: int) -> None:
        """Have node ``rank`` (a process started for an actor that did not come) leave the system."""
        try:
            async with asyncio.timeout(self._host.config.stop_grace + 5.0):
                await self._host.services[rank].call(ServiceEndpoints.leave)
        except Exception as exc:  # noqa: BLE001 - its pool ends it when its owner does not come
            self._host.log.warning("an actor's own process did not leave", peer=rank, error=repr(exc))

    # ------------------------------------------------------------------ node processes

    async def add_nodes(self, request: NodeRequest) -> list[NodeInfo]:
        """Have rank 0, or the host agent of ``request.host``, start the node processes asked; them, once they serve."""
        rank = 0 if request.host is None else self.pool_of(request.host)
        ranks: list[int] = await self._host.services[rank].call(ServiceEndpoints.add_nodes, request)
        return await self._met(ranks)

    async def _met(self, ranks: list[int]) -> list[NodeInfo]:
        """Nodes ``ranks`` as this node knows them, once it does (rank 0 tells the others as it admits them)."""
        host = self._host
        async with asyncio.timeout(MEET_WITHIN):
            while True:
                self._changed.clear()  # cleared first: a node met after the look below still wakes the wait
                if all(host.knows(rank) for rank in ranks):
                    return [host.peer(rank) for rank in ranks]
                await self._changed.wait()

    def pool_of(self, host: str) -> int:
        """The rank of the live host agent of ``host`` (its host name or label).

        Raises:
            UnsupportedError: No node on that host starts processes; the message lists the agents there are.
        """
        lost = self._host.lost
        pools = [info for info in self._host.peers() if info.pool and info.rank not in lost]
        found = [info.rank for info in pools if info.label == host] or [
            info.rank for info in pools if info.host == host
        ]
        if found:
            return found[0]
        known = ", ".join(f"node {info.rank} ({info.label or info.host})" for info in pools) or "none"
        raise UnsupportedError(
            f"no host agent on {host!r} (start one there with `actorch serve --pool`); host agents: {known}"
        )

    async def wait_nodes(
        self,
        count: int,
        label: str | None,
        timeout: float | None,  # noqa: ASYNC109 - wait_nodes names its bound, as torchelastic's rendezvous does
    ) -> list[NodeInfo]:
        """Wait until ``count`` live nodes (with ``label``) are in the system; them, by rank."""
        loop = asyncio.get_running_loop()
        enclosing = current_deadline()
        if timeout is not None:
            limit = loop.time() + timeout
        else:
            limit = enclosing if enclosing is not None else loop.time() + self._host.config.lookup_timeout
        found: list[NodeInfo] = []
        try:
            while True:
                self._changed.clear()
                found = self.live_nodes(label)
                if len(found) >= count:
                    return found
                if loop.time() >= limit:
                    raise _too_few(count, label, found)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(limit):
                        await self._changed.wait()
        except asyncio.CancelledError:
            if enclosing is not None and loop.time() >= enclosing:
                raise _too_few(count, label, found) from None
            raise

    def live_nodes(self, label: str | None = None) -> list[NodeInfo]:
        """The nodes neither lost nor leaving (with ``label``), by rank."""
        host = self._host
        gone = set(host.lost) | host.left | host.leaving
        return [info for info in host.peers() if info.rank not in gone and (label is None or info.label == label)]


class _Attempts:
    """The bound of a placement that may wait: its deadline, how long to pause, the last refusal."""

    def __init__(self, changed: asyncio.Event, limit: float | None) -> None:
        self._changed = changed
        self._limit = limit
        self._pause = RETRY_FIRST
        self._scope: asyncio.Timeout | None = None
        self._enclosing: float | None = None
        self.last: PlacementError | None = None

    async def __aenter__(self) -> _Attempts:
        self._enclosing = current_deadline()  # read now: once expired, a scope is no longer seen
        if self._limit is not None and self._enclosing is None:
            self._scope = asyncio.timeout(self._limit)
            await self._scope.__aenter__()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        try:
            if self._scope is not None:
                await self._scope.__aexit__(kind, error, tb)
        except TimeoutError:
            raise self._expired() from None
        enclosing = self._enclosing
        if isinstance(error, asyncio.CancelledError) and enclosing is not None and self.last is not None:
            expired = asyncio.get_running_loop().time() >= enclosing
            if expired:
                raise self._expired() from None

    def _expired(self) -> PlacementError:
        return PlacementError(f"{self.last} (waited for capacity until the deadline)")

    async def pause(self) -> None:
        """Wait until a node joins, or a while (longer each time): resources given back are not announced."""
        try:
            async with asyncio.timeout(self._pause):
                await self._changed.wait()
        except TimeoutError:
            self._pause = min(self._pause * 2, RETRY_MOST)


def _too_few(count: int, label: str | None, found: Sequence[NodeInfo]) -> TimeoutError:
    with_label = "" if label is None else f" labelled {label!r}"
    return TimeoutError(f"wait_nodes({count}): {len(found)} node{'s' * (len(found) != 1)}{with_label} in time")


def _plan(
    count: int,
    fitting: Sequence[int],
    free: Mapping[int, Mapping[str, float]],
    needs: Mapping[str, float],
    spread: bool,
) -> list[int]:
    """The node of each of ``count`` members, as far as room goes: spread (fewest first) or packed (in order)."""
    left = {rank: dict(free.get(rank, {})) for rank in fitting}
    members = dict.fromkeys(fitting, 0)
    plan: list[int] = []
    for _ in range(count):
        room = [
            rank for rank in fitting if all(left[rank].get(name, 0.0) + EPSILON >= need for name, need in needs.items())
        ]
        if not room:
            break
        rank = min(room, key=lambda candidate: members[candidate]) if spread else room[0]
        for name, need in needs.items():
            left[rank][name] = left[rank].get(name, 0.0) - need
        members[rank] += 1
        plan.append(rank)
    return plan


async def all_or_none(spawns: Any) -> list[Any]:
    """Run every spawn at once; if any fails, stop those that started and raise the first failure."""
    outcomes = await asyncio.gather(*spawns, return_exceptions=True)
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if not failures:
        return list(outcomes)
    started = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    await asyncio.gather(*(ref.stop() for ref in started), return_exceptions=True)
    raise failures[0]
