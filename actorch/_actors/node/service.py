"""``NodeService``: the system actor every node hosts (id 1), doing what other nodes ask of this one.

It is the node's actor host seen from the network: the host gives itself to the
service as a :class:`ServiceBackend`, which is all the service knows of it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from actorch._actors.actor import Actor
from actorch._actors.node_request import NodeRequest
from actorch._actors.node_share import NodeShare
from actorch._actors.placement.gpus import GpuShare
from actorch._actors.ref import ActorRef
from actorch._actors.restart import ActorExit
from actorch._actors.spawn_request import SpawnRequest
from actorch._actors.system_endpoints import ServiceEndpoints
from actorch._engine.tracing import TraceSettings

__all__ = ["NodeService", "PoolBackend", "ServiceBackend"]


class PoolBackend(Protocol):
    """What the node service needs of its node's pool of processes (``processes.NodePool``)."""

    async def add(self, request: NodeRequest) -> list[int]:
        """Start the node processes ``request`` asks for on this host; their ranks, once they serve."""

    async def build_owner(self, build: Callable[[], Awaitable[ActorRef[Any]]]) -> ActorRef[Any]:
        """Build the actor whose own process this node is."""

    async def follow_owner(self, actor_id: int) -> None:
        """Once ``actor_id`` was stopped: if this node is its own process, leave and never return."""


class ServiceBackend(Protocol):
    """What the node service needs of its node's actor host."""

    rank: int
    pool: PoolBackend

    async def build(
        self, request: SpawnRequest, *, origin: tuple[int, int] | None = None, kept: tuple[Any] | None = None
    ) -> ActorRef[Any]:
        """Build and start the actor ``request`` asks for here, holding what it asks.

        ``origin`` and ``kept``: a relocatable actor moved here, and its last snapshot.
        """

    def gpu_share(self) -> GpuShare:
        """This node's GPUs and the actors holding them."""

    def resource_share(self) -> NodeShare:
        """What this node has free and who holds what."""

    async def stop_actor(self, actor_id: int, exit_: ActorExit) -> None:
        """Stop a local actor, if it is still here."""

    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """How a local actor ended, once it has."""

    def evict_names(self, names: list[str]) -> None:
        """Drop names from this node's cache."""

    def name_event(self, seq: int, kind: str, name: str, ref: ActorRef[Any] | None, reason: str | None) -> None:
        """Hand a registry change to this node's event subscribers."""

    async def end(self, *, failed: bool) -> None:
        """The system ends: stop every user actor of this node."""

    def status(self) -> dict[str, Any]:
        """This node and its actors as plain data."""

    def start_trace(self, settings: TraceSettings) -> None:
        """Record this node's part of a timeline from now on."""

    def stop_trace(self) -> dict[str, Any] | None:
        """Stop recording; what was recorded, or None if nothing was."""

    def begin_leave(self) -> None:
        """Start leaving the system (once); the process exits when it has left."""

    def peer_leaving(self, rank: int) -> None:
        """Node ``rank`` is leaving: spawn nothing there."""

    def peer_left(self, rank: int) -> None:
        """Node ``rank`` has left: its names and actors are gone."""


class NodeService(Actor, ServiceEndpoints):
    """Spawns, stops and watches actors on this node, evicts names, and takes part in leaving and shutdown."""

    max_concurrency = 1 << 30  # spawns, stops and watches may wait on user code

    def __init__(self, backend: ServiceBackend) -> None:
        self._backend = backend

    async def spawn(
        self, request: SpawnRequest, origin: tuple[int, int] | None = None, kept: tuple[Any] | None = None
    ) -> ActorRef[Any]:
        """Build the actor ``request`` asks for here and run its ``on_start``.

        It runs on the device the request names, or on the first of the GPUs
        it is lent, and holds what its ``Where`` asks (``PlacementError`` if
        that is not free). With ``Where(process="own")`` this node is the
        actor's own process, which leaves the system when it stops. ``origin``
        is given when rank 0's relocator moves a relocatable actor here: where
        it was first started, and ``kept`` its last snapshot (restored before
        ``on_start``), if it saved one.
        """
        build = functools.partial(self._backend.build, request, origin=origin, kept=kept)
        return await (self._backend.pool.build_owner(build) if request.own else build())

    async def resources(self) -> NodeShare:
        """What this node has free and who holds what (its GPUs counted in): the placer asks it of each node."""
        return self._backend.resource_share()

    async def add_nodes(self, request: NodeRequest) -> list[int]:
        """Start the node processes ``request`` asks for on this node's host; their ranks, once they serve.

        A process started for an actor (``request.owners``) leaves when that actor stops.
        """
        return await self._backend.pool.add(request)

    async def gpus(self) -> tuple[tuple[str, ...], dict[str, str]]:
        """This node's GPUs, and those actors hold with the actor holding each (``resources`` counts them)."""
        share = self._backend.gpu_share()
        return share.devices, dict(share.holders)

    async def stop_actor(self, actor_id: int, from_elsewhere: bool = False) -> None:
        """Stop a local actor: drain it, run ``on_stop``, release its name.

        If this node is the actor's own process, the node then leaves the
        system; asked ``from_elsewhere`` (another node), this call is then
        not answered: it ends once the node is gone.
        """
        await self._backend.stop_actor(actor_id, ActorExit("stopped"))
        if from_elsewhere:
            await self._backend.pool.follow_owner(actor_id)

    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """Wait until a local actor has stopped; how it ended."""
        return await self._backend.wait_stopped(actor_id)

    async def evict(self, names: list[str]) -> None:
        """Drop ``names`` from this node's name cache."""
        self._backend.evict_names(names)

    async def name_event(self, seq: int, kind: str, name: str, ref: ActorRef[Any] | None, reason: str | None) -> None:
        """The registry's change number ``seq`` to the names (told to subscribed nodes)."""
        self._backend.name_event(seq, kind, name, ref, reason)

    async def status(self) -> dict[str, Any]:
        """This node and its actors: counters, queue depths, handler times per endpoint (read-only)."""
        return self._backend.status()

    async def trace_start(self, sample: float, max_events: int) -> None:
        """Record this node's calls, tells, handler runs and mailbox waits for a timeline (``ActorSystem.trace``)."""
        self._backend.start_trace(TraceSettings(sample, max_events))

    async def trace_clock(self) -> int:
        """This node's clock now (``perf_counter_ns``), for the node that merges a timeline."""
        return time.perf_counter_ns()

    async def trace_stop(self) -> dict[str, Any] | None:
        """Stop recording: this node's part of the timeline (see ``NodeTrace.finish``), or None if none ran."""
        return self._backend.stop_trace()

    async def leave(self) -> None:
        """Leave the system: announce it, stop every actor here (names go), tell the others, exit 0.

        Returns once the leave has begun.
        """
        self._backend.begin_leave()

    async def peer_leaving(self, rank: int) -> None:
        """Node ``rank`` is leaving: nothing more is spawned there."""
        self._backend.peer_leaving(rank)

    async def peer_left(self, rank: int) -> None:
        """Node ``rank`` has left: forget its names, tell this node's event subscribers."""
        self._backend.peer_left(rank)

    async def ping(self) -> None:
        """Answer at once: this node's event loop runs (rank 0 asks a node that is slow to shut down)."""

    async def shutdown(self, failed: bool = False) -> None:
        """Stop every user actor of this node: the system is ending, rank 0 leaves next.

        ``failed`` says that ``main`` raised: this node's process then exits with code 1.
        """
        await self._backend.end(failed=failed)
