"""What refs ask of the runtime's own actors, declared beneath them so that refs can call them typed.

A ref stops its actor and waits for its end through the node service of the
actor's node; a ref to a relocatable actor keeps its snapshots with rank 0's
relocator and asks it where the actor lives now. Those actors take and return
refs, so refs cannot import them: refs name these declarations instead, which
``NodeService`` and ``Relocator`` implement, so that a renamed or retyped
endpoint fails type checking on both sides. :func:`system_call` sends such a
call by the runtime's own ids (``system_ids``), with the target actor's label.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from actorch._actors.restart import ActorExit
from actorch._engine.endpoints import endpoint_name

if TYPE_CHECKING:
    from actorch._engine.caller import Caller

__all__ = ["RelocatorEndpoints", "ServiceEndpoints", "system_call"]

P = ParamSpec("P")
R = TypeVar("R")


class ServiceEndpoints(ABC):
    """The endpoints of every node's service that refs call (``NodeService`` implements them)."""

    @abstractmethod
    async def stop_actor(self, actor_id: int, from_elsewhere: bool = False) -> None:
        """Stop local actor ``actor_id``; asked ``from_elsewhere``, also end its own process with it."""

    @abstractmethod
    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """How local actor ``actor_id`` ended, once it has."""


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
