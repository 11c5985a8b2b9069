"""The name service: a system actor on rank 0 and a cache on every node.

The registry maps names to refs. A name is reserved before its actor is built
(so a taken name fails before any side effect) and bound once the actor has
started. Releasing a name evicts it from every node's cache before it returns,
so a stopped actor's name is gone everywhere once ``stop()`` has returned (a
node whose loop a handler has kept busy for ``EVICT_TIMEOUT`` evicts it as
soon as it runs again, before it handles any message sent to it later). The
names of a lost node, reservations included, go at once. Nodes that watch
membership events subscribe: each change is told to their service, numbered so
that a subscriber can tell the changes its snapshot already holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Collection, Mapping
from typing import Any

from actorch._actors.actor import Actor
from actorch._actors.ref import ActorRef
from actorch._actors.system_endpoints import ServiceEndpoints
from actorch._base.errors import NameTakenError
from actorch._base.names import compile_pattern

__all__ = ["NameCache", "Registry"]

EVICT_TIMEOUT = 5.0
"""Seconds a release waits for the nodes to evict its name; a busy node still evicts it later, before anything else."""


class Registry(Actor):
    """Holds every name of the system; hosted on rank 0."""

    max_concurrency = 1 << 30  # waiting lookups must not block registrations

    def __init__(self, services: Mapping[int, ActorRef[Any]]) -> None:
        """Tell names that change to ``services``: refs to every node's service, by rank."""
        self._services = services
        self._refs: dict[str, ActorRef[Any] | None] = {}
        self._reserved: dict[str, int] = {}  # names being spawned, and the rank spawning them
        self._waiters: dict[str, list[asyncio.Future[ActorRef[Any]]]] = {}
        self._lost: set[int] = set()
        self._subscribers: set[int] = set()
        self._seq = 0
        self._evicting: tuple[list[str], asyncio.Future[None]] | None = None  # names released this loop turn
        self._evictions: set[asyncio.Task[None]] = set()

    async def reserve(self, name: str, rank: int) -> None:
        """Hold ``name`` for an actor being built on ``rank``."""
        if name in self._refs:
            holder = self._refs[name]
            where = f"{holder!r}" if holder is not None else "an actor being spawned"
            raise NameTakenError(f"name {name!r} is taken by {where}; spawn on node {rank} refused")
        if rank in self._lost:
            raise NameTakenError(f"cannot reserve {name!r} for node {rank}: the node was lost")
        self._refs[name] = None
        self._reserved[name] = rank

    async def bind(self, name: str, ref: ActorRef[Any]) -> None:
        """Publish ``ref`` under the reserved ``name`` and wake lookups waiting for it."""
        if self._reserved.pop(name, None) is None or ref.rank in self._lost:
            raise NameTakenError(f"name {name!r} is not reserved for {ref!r} (its node may have been lost)")
        self._refs[name] = ref
        for waiter in self._waiters.pop(name, ()):
            if not waiter.done():
                waiter.set_result(ref)
        self._publish("registered", name, ref, None)

    async def release(self, name: str, reason: str = "stopped") -> None:
        """Forget ``name`` and evict it from every node's cache."""
        self._reserved.pop(name, None)
        if self._refs.pop(name, None) is None:
            return
        self._publish("removed", name, None, reason)
        await asyncio.shield(self._evict(name))

    def _evict(self, name: str) -> asyncio.Future[None]:
        """Evict ``name`` with every other name released in this loop turn: one call per node for them all."""
        if self._evicting is None:
            loop = asyncio.get_running_loop()
            self._evicting = ([], loop.create_future())
            loop.call_soon(self._send_evictions)
        names, evicted = self._evicting
        names.append(name)
        return evicted

    def _send_evictions(self) -> None:
        assert self._evicting is not None
        names, evicted = self._evicting
        self._evicting = None
        # An eviction is the registry's own, not part of the release's call: no deadline, no call chain.
        task = asyncio.get_running_loop().create_task(self._evict_everywhere(names), context=contextvars.Context())
        self._evictions.add(task)
        task.add_done_callback(self._evictions.discard)
        task.add_done_callback(functools.partial(_settle, evicted))

    async def subscribe(self, rank: int) -> tuple[int, list[tuple[str, ActorRef[Any]]]]:
        """Tell node ``rank``'s service every later name change; the changes so far and every bound name."""
        self._subscribers.add(rank)
        return self._seq, [(name, ref) for name, ref in sorted(self._refs.items()) if ref is not None]

    async def resolve(self, name: str, wait: bool) -> ActorRef[Any] | None:
        """The ref bound to ``name``; if ``wait``, wait until one is bound."""
        ref = self._refs.get(name)
        if ref is not None or not wait:
            return ref
        waiter: asyncio.Future[ActorRef[Any]] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(name, []).append(waiter)
        try:
            return await waiter
        finally:
            waiters = self._waiters.get(name)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[name]

    async def match(self, pattern: str) -> list[ActorRef[Any]]:
        """Refs whose names match the glob ``pattern``, sorted by name."""
        regex = compile_pattern(pattern)
        return [ref for name, ref in sorted(self._refs.items()) if ref is not None and regex.fullmatch(name)]

    def drop_rank(self, rank: int, reason: str = "node_lost", hold: Collection[str] = ()) -> None:
        """Forget every name of a node that was lost or left, reserved ones too (not an endpoint: its host calls it).

        The names in ``hold`` (actors rank 0 relocates) are removed too, but
        stay reserved, for rank 0, until bound to the new home or released.
        """
        self._lost.add(rank)
        self._subscribers.discard(rank)
        for name in [name for name, holder in self._reserved.items() if holder == rank]:
            del self._reserved[name]
            del self._refs[name]
        gone = [name for name, ref in self._refs.items() if ref is not None and ref.rank == rank]
        for name in gone:
            del self._refs[name]
            self._publish("removed", name, None, reason)
        for name in hold:
            self._refs[name] = None
            self._reserved[name] = 0

    def _publish(self, kind: str, name: str, ref: ActorRef[Any] | None, reason: str | None) -> None:
        self._seq += 1
        for rank in sorted(self._subscribers):  # services are not bounded: a tell to one always goes
            self._services[rank].tell(ServiceEndpoints.name_event, self._seq, kind, name, ref, reason)

    async def _evict_everywhere(self, names: list[str]) -> None:
        """Evict ``names`` from every live node's cache; wait ``EVICT_TIMEOUT`` at most, never giving one up.

        A node whose event loop a handler keeps busy longer than that still
        gets the eviction: the call is left to run, and the node handles it
        before any message that reaches it later.
        """
        calls = [
            service.call(ServiceEndpoints.evict, names)
            for service in list(self._services.values())
            if service.rank not in self._lost
        ]
        evicted = asyncio.gather(*calls, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(evicted), EVICT_TIMEOUT)


def _settle(future: asyncio.Future[None], _: object) -> None:
    if not future.done():
        future.set_result(None)


class NameCache:
    """A node's cache of resolved names, evicted by the registry and on node loss."""

    def __init__(self) -> None:
        self._refs: dict[str, ActorRef[Any]] = {}
        self._evictions = 0

    def __repr__(self) -> str:
        return f"<NameCache names={len(self._refs)}>"

    def get(self, name: str) -> ActorRef[Any] | None:
        """The cached ref of ``name``, if any."""
        return self._refs.get(name)

    def generation(self) -> int:
        """A counter that changes on every eviction (to drop lookups that raced one)."""
        return self._evictions

    def put(self, name: str, ref: ActorRef[Any], generation: int) -> None:
        """Cache ``ref`` unless an eviction happened since ``generation`` was read."""
        if generation == self._evictions:
            self._refs[name] = ref

    def evict(self, names: list[str]) -> None:
        """Forget ``names``."""
        self._evictions += 1
        for name in names:
            self._refs.pop(name, None)

    def evict_rank(self, rank: int) -> None:
        """Forget every name hosted on ``rank``."""
        self._evictions += 1
        for name in [name for name, ref in self._refs.items() if ref.rank == rank]:
            del self._refs[name]
