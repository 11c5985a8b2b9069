"""Callers' tasks that run a handler of an actor in place: same-node calls that skip the mailbox.

When an actor of this node may start a call at once, its handler runs in the
caller's own task: no task, no queue, no serialisation. The actor's cell keeps
an :class:`InlineCalls` to know those tasks, so that stopping the actor cancels
them too, and so that such a caller then hears that the actor stopped rather
than that it was cancelled itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["InlineCalls"]


class InlineCalls:
    """The tasks running one actor's handlers in place, how deep, and those cancelled by the actor."""

    __slots__ = ("depth", "evicted")

    def __init__(self) -> None:
        self.depth: dict[asyncio.Task[Any], int] = {}  # callers' tasks running a handler inline, and how deep
        self.evicted: set[asyncio.Task[Any]] = set()  # inline callers cancelled because the actor stopped

    def __repr__(self) -> str:
        return f"<InlineCalls tasks={len(self.depth)} evicted={len(self.evicted)}>"

    def enter(self, task: asyncio.Task[Any]) -> None:
        """``task`` starts a handler in place."""
        self.depth[task] = self.depth.get(task, 0) + 1

    def leave(self, task: asyncio.Task[Any]) -> None:
        """The handler ``task`` ran in place is done."""
        depth = self.depth[task] - 1
        if depth:
            self.depth[task] = depth
        else:
            del self.depth[task]
            self.evicted.discard(task)

    def was_evicted(self, task: asyncio.Task[Any]) -> bool:
        """Whether the outermost handler ``task`` runs in place was cancelled by the actor, not by its caller."""
        return task in self.evicted and self.depth[task] == 1

    def evict(self, keep: asyncio.Task[Any] | None) -> None:
        """Cancel every task running a handler in place, but ``keep``: the actor stops or failed."""
        for task in self.depth:
            if task is not keep and task not in self.evicted:
                self.evicted.add(task)
                task.cancel()
