"""What the rooms of ``_actors`` ask of the runtime's own actors, declared beneath them so that calls are typed.

A ref stops its actor and waits for its end through the node service of the
actor's node; a ref to a relocatable actor keeps its snapshots with rank 0's
relocator and asks it where the actor lives now. The placer asks each node's
service what it has free, to start node processes and to leave; the
relocator has a service build an actor it moves; the registry tells the
services of names that change; a trace starts and stops every node's part.
Those actors take and return refs and sit above all of these, so none of
them can import them: they name these declarations instead, which
``NodeService`` and ``Relocator`` implement, so that a renamed or retyped
endpoint fails type checking on both sides. A ref itself is ``Any`` here
(refs are built on these declarations); the service's own signatures name it.
:func:`system_call` sends such a call by the runtime's own ids
(``system_ids``), with the target actor's label.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from actorch._actors.node_request import NodeRequest
from actorch._actors.node_share import NodeShare
from actorch._actors.restart import ActorExit
from actorch._actors.spawn_request import SpawnRequest
from actorch._engine.endpoints import endpoint_name

if TYPE_CHECKING:
    from actorch._engine.caller import Caller

__all__ = ["RelocatorEndpoints", "ServiceEndpoints", "system_call"]

P = ParamSpec("P")
R = TypeVar("R")


class ServiceEndpoints(ABC):
    """The endpoints of every node's service that refs, the placer, the relocator, the registry and traces call.

    ``NodeService`` implements them (and has more, which only the rooms above it call).
    """

    @abstractmethod
    async def stop_actor(self, actor_id: int, from_elsewhere: bool = False) -> None:
        """Stop local actor ``actor_id``; asked ``from_elsewhere``, also end its own process with it."""

    @abstractmethod
    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """How local actor ``actor_id`` ended, once it has."""

    @abstractmethod
    async def spawn(
        self, request: SpawnRequest, origin: tuple[int, int] | None = None, kept: tuple[Any] | None = None
    ) -> Any:
        """Build the actor ``request`` asks for on this node; its ref (``origin`` and ``kept``: one that moved here)."""

    @abstractmethod
    async def resources(self) -> NodeShare:
        """What this node has free and who holds what."""

    @abstractmethod
    async def add_nodes(self, request: NodeRequest) -> list[int]:
        """Start the node processes ``request`` asks for on this node's host; their ranks, once they serve."""

    @abstractmethod
    async def leave(self) -> None:
        """Begin this node's leave of the system."""

    @abstractmethod
    async def evict(self, names: list[str]) -> None:
        """Drop ``names`` from this node's name cache."""

    @abstractmethod
    async def name_event(self, seq: int, kind: str, name: str, ref: Any, reason: str | None) -> None:
        """The registry's change number ``seq`` to the names: ``name`` is now ``ref`` (None: gone), for ``reason``."""

    @abstractmethod
    async def trace_start(self, sample: float, max_events: int) -> None:
        """Record this node's part of a timeline from now on."""

    @abstractmethod
    async def trace_clock(self) -> int:
        """This node's clock now (``perf_counter_ns``)."""

    @abstractmethod
    async def trace_stop(self) -> dict[str, Any] | None:
        """Stop recording: this node's part of the timeline, or None if none ran."""


class RelocatorEndpoints(ABC):
    """The endpoints of rank 0's relocator that refs to relocatable actors call (``Relocator`` implements them)."""

    @abstractmethod
    async def keep(self, origin: tuple[int, int], rank: int, state: Any, name: str | None = None) -> None:
        """Keep ``state`` as the last snapshot of the actor ``origin`` (``name``), sent by its instance on ``rank``."""

    @abstractmethod
    async def home(self, origin: tuple[int, int], stale: int) -> tuple[int, int] | ActorExit:
        """Where the actor ``origin`` lives once it no longer lives on node ``stale``; how it ended if nowhere."""


def system_call(
    caller: Caller,
    rank: int,
    actor_id: int,
    label: str,
    deadline: float | None,
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
    *args: P.args,
    **kwargs: P.kwargs,
) -> Coroutine[Any, Any, R]:
    """Call ``method`` of the system actor ``actor_id`` on ``rank`` through ``caller``; errors name ``label``."""
    return caller.call(rank, actor_id, endpoint_name(method), args, kwargs, label, deadline)
