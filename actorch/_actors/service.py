"""``NodeService``: the system actor every node hosts (id 1), doing what other nodes ask of this one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actorch._actors.actor import Actor
from actorch._actors.ref import ActorRef, _resolve_class
from actorch._actors.restart import ActorExit, Restart

if TYPE_CHECKING:
    from actorch._actors.system import ActorSystem

__all__ = ["NodeService"]


class NodeService(Actor):
    """Spawns, stops and watches actors on this node, evicts names, and takes part in shutdown."""

    max_concurrency = 1 << 30  # spawns, stops and watches may wait on user code

    def __init__(self, system: ActorSystem) -> None:
        self._hosted = system

    async def spawn(
        self, path: str, args: list[Any], kwargs: dict[str, Any], name: str | None, restart: Restart | None = None
    ) -> ActorRef[Any]:
        """Build an actor of the class at ``path`` here and run its ``on_start``."""
        cls = _resolve_class(path)
        if cls is None:
            raise ImportError(f"cannot import actor class {path!r} on node {self._hosted.rank}")
        return await self._hosted._build(cls, tuple(args), kwargs, name, restart)

    async def stop_actor(self, actor_id: int) -> None:
        """Stop a local actor: drain it, run ``on_stop``, release its name."""
        cell = self._hosted._node.cell(actor_id)
        if cell is not None:
            await self._hosted._stop_cell(cell, ActorExit("stopped"))

    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """Wait until a local actor has stopped; how it ended."""
        return await self._hosted._supervisor.wait_stopped(actor_id)

    async def evict(self, names: list[str]) -> None:
        """Drop ``names`` from this node's name cache."""
        self._hosted._cache.evict(names)

    async def name_event(self, seq: int, kind: str, name: str, ref: ActorRef[Any] | None, reason: str | None) -> None:
        """The registry's change number ``seq`` to the names (told to subscribed nodes)."""
        self._hosted._events.name_event(seq, kind, name, ref, reason)

    async def shutdown(self, failed: bool = False) -> None:
        """Stop every user actor of this node: the system is ending, rank 0 leaves next.

        ``failed`` says that ``main`` raised: this node's process then exits with code 1.
        """
        self._hosted._exit_code = 1 if failed else 0
        self._hosted._node.departing = True
        await self._hosted._stop_local_actors()
