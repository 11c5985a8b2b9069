"""``Relocatables``: one node's relocatable actors, and what rank 0's relocator hears of them.

A relocatable actor (``Restart(relocate=True)``) is adopted by rank 0's
:class:`~actorch._actors.relocation.relocator.Relocator` once it has started on a node
(with the ``RelocationSpec`` that built it), and forgotten there when it stops
for good; between the two its refs are ``MovableRef`` objects that follow it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from actorch._actors.actor import Actor, class_path
from actorch._actors.ref import ActorRef, make_ref
from actorch._actors.relocation.movable import Origin, movable_ref
from actorch._actors.relocation.relocator import Relocator
from actorch._actors.relocation.spec import RelocationSpec, restores_explicitly
from actorch._actors.restart import ActorExit
from actorch._base.errors import describe
from actorch._engine.system_ids import RELOCATOR_ID

if TYPE_CHECKING:
    from actorch._actors.spawn_request import SpawnRequest
    from actorch._engine.caller import Caller

__all__ = ["Relocatables"]


class Relocatables:
    """One node's relocatable actors: where each was first started, and what rank 0 hears of them."""

    def __init__(self, caller: Caller, rank: int) -> None:
        self._caller = caller
        self.rank = rank
        self._origins: dict[int, Origin] = {}  # local actor id -> origin
        self._relocator: ActorRef[Relocator] = make_ref(caller, 0, RELOCATOR_ID, None, class_path(Relocator))

    def __repr__(self) -> str:
        return f"<Relocatables node {self.rank} actors={len(self._origins)}>"

    def take(self, actor_id: int, origin: Origin | None) -> None:
        """Local actor ``actor_id`` is relocatable: first started as ``origin`` (None: here, now)."""
        self._origins[actor_id] = origin if origin is not None else (self.rank, actor_id)

    def drop(self, actor_id: int) -> Origin | None:
        """Local actor ``actor_id`` is no longer hosted here; its origin, if it was relocatable."""
        return self._origins.pop(actor_id, None)

    def ref(self, actor_id: int, name: str | None, cls: type[Actor]) -> ActorRef[Any]:
        """A ref to local actor ``actor_id``: one that follows it, if it is relocatable."""
        origin = self._origins.get(actor_id)
        if origin is None:
            return make_ref(self._caller, self.rank, actor_id, name, class_path(cls))
        return movable_ref(self._caller, self.rank, actor_id, name, class_path(cls), origin)

    def origin(self, actor_id: int) -> Origin:
        """Where local relocatable actor ``actor_id`` was first started."""
        return self._origins[actor_id]

    async def resume(self, request: SpawnRequest) -> tuple[Any] | None:
        """The snapshot a named relocatable actor built afresh starts from: its last one in the snapshot directory.

        None if it has none there, or if ``request`` hands it a ``restore=``
        of its own, which wins: then a warning says so when the directory
        holds a snapshot newer than that file (or when what ``restore=``
        names is not a file here, which cannot be compared).
        """
        name = request.name
        if name is None:
            return None
        if not restores_explicitly(request):
            return await self._relocator.call(Relocator.resume, name)
        found = await self._relocator.call(Relocator.latest, name)
        given = request.kwargs["restore"]
        if found is not None and found[1] > _modified(given):
            serial, saved, path = found
            self._caller.log.warning(
                "restore= given: the actor starts from it, not from the newer snapshot in the snapshot directory",
                actor=name,
                restore=str(given),
                newer=path,
                serial=serial,
                saved=datetime.fromtimestamp(saved, UTC).isoformat(timespec="seconds"),
            )
        return None

    async def adopt(self, spec: RelocationSpec) -> None:
        """Have rank 0 relocate the actor ``spec`` says (just started here) when this node is lost."""
        await self._relocator.call(Relocator.adopt, spec)

    async def forget(self, origin: Origin, exit_: ActorExit) -> None:
        """Tell rank 0 that the actor ``origin`` stopped for good; a failure is logged, not raised."""
        try:
            await self._relocator.call(Relocator.forget, origin, exit_)
        except Exception as exc:  # noqa: BLE001 - what stopped it matters more; rank 0 may be gone too
            self._caller.log.warning("rank 0 did not hear that a relocatable actor stopped", error=describe(exc))


def _modified(given: Any) -> float:
    """When the file a ``restore=`` names was last written (seconds since the epoch); 0 if it names no file here."""
    try:
        return os.stat(given).st_mtime
    except (OSError, TypeError, ValueError):
        return 0.0
