"""``NodeService``: the system actor every node hosts (id 1), doing what other nodes ask of this one.

It is the node's actor host seen from the network: the host gives itself to the
service as a :class:`ServiceBackend`, which is all the service knows of it.
"""

from __future__ import annotations

from typing import Any, Protocol

from actorch._actors.actor import Actor
from actorch._actors.placement import GpuShare
from actorch._actors.ref import ActorRef, resolve_class
from actorch._actors.restart import ActorExit, Restart

__all__ = ["NodeService", "ServiceBackend"]


class ServiceBackend(Protocol):
    """What the node service needs of its node's actor host."""

    rank: int

    async def build(
        self,
        cls: type[Actor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None,
        restart: Restart | None,
        *,
        device: str | None = None,
        gpus: int = 0,
        origin: tuple[int, int] | None = None,
        kept: tuple[Any] | None = None,
    ) -> ActorRef[Any]:
        """Build and start an actor here (on ``device``, if given, or holding ``gpus`` free GPUs).

        ``origin`` and ``kept``: a relocatable actor moved here, and its last snapshot.
        """

    def gpu_share(self) -> GpuShare:
        """This node's GPUs and the actors holding them."""

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

    def begin_leave(self) -> None:
        """Start leaving the system (once); the process exits when it has left."""

    def peer_leaving(self, rank: int) -> None:
        """Node ``rank`` is leaving: spawn nothing there."""

    def peer_left(self, rank: int) -> None:
        """Node ``rank`` has left: its names and actors are gone."""


class NodeService(Actor):
    """Spawns, stops and watches actors on this node, evicts names, and takes part in leaving and shutdown."""

    max_concurrency = 1 << 30  # spawns, stops and watches may wait on user code

    def __init__(self, backend: ServiceBackend) -> None:
        self._backend = backend

    async def spawn(
        self,
        path: str,
        args: list[Any],
        kwargs: dict[str, Any],
        name: str | None,
        restart: Restart | None = None,
        device: str | None = None,
        gpus: int = 0,
        origin: tuple[int, int] | None = None,
        kept: tuple[Any] | None = None,
    ) -> ActorRef[Any]:
        """Build an actor of the class at ``path`` here and run its ``on_start``.

        It runs on ``device`` if given; with ``gpus``, it holds that many free
        GPUs of this node (``PlacementError`` if they are not free) and runs on
        the first. ``origin`` is given when rank 0's relocator moves a
        relocatable actor here: where it was first started, and ``kept`` its
        last snapshot (restored before ``on_start``), if it saved one.
        """
        cls = resolve_class(path)
        if cls is None:
            raise ImportError(f"cannot import actor class {path!r} on node {self._backend.rank}")
        return await self._backend.build(
            cls, tuple(args), kwargs, name, restart, device=device, gpus=gpus, origin=origin, kept=kept
        )

    async def gpus(self) -> tuple[tuple[str, ...], dict[str, str]]:
        """This node's GPUs, and those actors hold with the actor holding each."""
        share = self._backend.gpu_share()
        return share.devices, dict(share.holders)

    async def stop_actor(self, actor_id: int) -> None:
        """Stop a local actor: drain it, run ``on_stop``, release its name."""
        await self._backend.stop_actor(actor_id, ActorExit("stopped"))

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

    async def shutdown(self, failed: bool = False) -> None:
        """Stop every user actor of this node: the system is ending, rank 0 leaves next.

        ``failed`` says that ``main`` raised: this node's process then exits with code 1.
        """
        await self._backend.end(failed=failed)
