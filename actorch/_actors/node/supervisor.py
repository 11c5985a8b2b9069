"""Supervision's records on one node: who is restarted by which policy, and how actors ended.

A handler that raises one of its class's ``fatal_errors`` fails the actor. Its
host pauses it, and then, if the actor was spawned with a ``Restart`` policy
that allows one more restart (counted here), builds a new instance in the same
cell after the policy's backoff: same node, same id, same name, so every ref
keeps working. Without a policy, or once the policy's restarts are used up,
the actor stops for good, and how it ended is kept here for ``wait_stopped``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from actorch._actors.actor import Actor
from actorch._actors.restart import EXITS_KEPT, ActorExit, Restart, count_failure

__all__ = ["RestartSpec", "Supervisor"]


@dataclass(frozen=True)
class RestartSpec:
    """What rebuilding an actor takes, and the policy that allows it."""

    cls: type[Actor]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    restart: Restart


class Supervisor:
    """This node's restart policies, failure counts, and how its actors ended."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._specs: dict[int, RestartSpec] = {}
        self._failures: dict[int, deque[float]] = {}
        self._exits: OrderedDict[int, ActorExit] = OrderedDict()
        self._waiters: dict[int, list[asyncio.Future[ActorExit]]] = {}

    def __repr__(self) -> str:
        return f"<Supervisor node {self.rank} supervised={len(self._specs)} ended={len(self._exits)}>"

    def adopt(
        self, actor_id: int, cls: type[Actor], args: tuple[Any, ...], kwargs: dict[str, Any], restart: Restart
    ) -> None:
        """Restart actor ``actor_id`` by ``restart`` when it fails, rebuilding it from these arguments."""
        self._specs[actor_id] = RestartSpec(cls, args, dict(kwargs), restart)

    def spec(self, actor_id: int) -> RestartSpec | None:
        """How actor ``actor_id`` is rebuilt when it fails, if it has a policy."""
        return self._specs.get(actor_id)

    def count_failure(self, actor_id: int, restart: Restart) -> int:
        """Record a failure now; how many count against ``restart`` (this one included)."""
        return count_failure(self._failures.setdefault(actor_id, deque()), restart)

    def ended(self, actor_id: int, exit_: ActorExit) -> None:
        """Record how actor ``actor_id`` ended and wake whoever waits for it."""
        self._specs.pop(actor_id, None)
        self._failures.pop(actor_id, None)
        self._exits[actor_id] = exit_
        while len(self._exits) > EXITS_KEPT:
            self._exits.popitem(last=False)
        for waiter in self._waiters.pop(actor_id, ()):
            if not waiter.done():
                waiter.set_result(exit_)

    def exit_of(self, actor_id: int) -> ActorExit | None:
        """How actor ``actor_id`` ended, if it has and is still remembered."""
        return self._exits.get(actor_id)

    async def wait_ended(self, actor_id: int) -> ActorExit:
        """Wait until ``ended`` is called for actor ``actor_id`` (or the node shuts down)."""
        waiter: asyncio.Future[ActorExit] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(actor_id, [])
        waiters.append(waiter)
        try:
            return await waiter
        finally:
            if waiter in waiters:
                waiters.remove(waiter)

    def close(self) -> None:
        """The node shuts down: whoever still waits hears so."""
        waiting, self._waiters = self._waiters, {}
        for waiters in waiting.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(ActorExit("shutdown"))
