"""Who waits on whom: the wait-for graph of running handlers, built from what each actor's mailbox holds.

Every call carries its chain of callers' keys, the last being the handler that
made it; keys are unique in the system (they start with their node's rank). So
a callee's mailbox alone says who waits on it: a running handler whose caller
is ``c`` means ``c`` waits on that handler, and a queued message from ``c``
means ``c`` waits on every handler the actor runs now (one of them must end
first). Nothing is recorded on the caller's side, and the graph is read only
when asked for (``actorch status``, a call whose deadline expired). A cycle of
handlers waiting on each other is a deadlock; it is named by its actors,
``A -> B -> A``. A call still on its way, or waiting for room in a full
mailbox, is in no mailbox yet and shows no edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MAX_CALLERS", "WaitGraph", "describe_cycle"]

MAX_CALLERS = 64
"""Distinct callers of queued messages an actor reports at most (a long queue has few distinct callers)."""


def describe_cycle(labels: list[str]) -> str:
    """A cycle in words: ``A -> B -> A``."""
    return " -> ".join([*labels, labels[0]])


class WaitGraph:
    """Running handlers (by key), which actor runs each, and which handlers each one waits on."""

    __slots__ = ("edges", "owner")

    def __init__(self) -> None:
        self.edges: dict[int, set[int]] = {}  # a handler's key -> the keys of the handlers it waits on
        self.owner: dict[int, str] = {}  # a running handler's key -> the actor running it

    def __repr__(self) -> str:
        return f"<WaitGraph handlers={len(self.owner)} waits={sum(map(len, self.edges.values()))}>"

    @classmethod
    def of(cls, actors: Iterable[Mapping[str, Any]]) -> WaitGraph:
        """The graph of actors as ``Cell.waits`` describes them (one node's, or every node's together).

        An actor is named by its name, or by its label if it has none.
        """
        graph = cls()
        for actor in actors:
            who = actor.get("name") or actor["label"]
            graph.add(who, actor.get("handlers") or (), actor.get("queued_callers") or ())
        return graph

    def add(self, label: str, running: Iterable[Mapping[str, Any]], queued_callers: Iterable[int]) -> None:
        """Add one actor: its running handlers (``key``, ``caller``) and the callers of its queued messages."""
        keys = []
        for handler in running:
            key = handler["key"]
            keys.append(key)
            self.owner[key] = label
            caller = handler.get("caller")
            if caller is not None:
                self.edges.setdefault(caller, set()).add(key)
        for caller in queued_callers:
            self.edges.setdefault(caller, set()).update(keys)

    def waits_on(self, key: int) -> list[str]:
        """The actors whose handlers the handler ``key`` waits on (sorted)."""
        return sorted({self.owner[other] for other in self.edges.get(key, ()) if other in self.owner})

    def cycle_through(self, key: int) -> list[str] | None:
        """The actors of a cycle of waits that comes back to handler ``key``, starting with its own; None if none."""
        if key not in self.owner:
            return None
        path = self._path(key, key)
        return None if path is None else [self.owner[step] for step in path]

    def cycles(self) -> list[list[str]]:
        """Every cycle of waiting handlers, each once, as its actors (starting with the least key's)."""
        found: dict[frozenset[int], list[int]] = {}
        for key in sorted(self.owner):
            path = self._path(key, key)
            if path is not None:
                found.setdefault(frozenset(path), path)
        cycles = []
        for path in found.values():
            start = path.index(min(path))
            cycles.append([self.owner[step] for step in path[start:] + path[:start]])
        return cycles

    def _path(self, start: int, goal: int) -> list[int] | None:
        """Handlers from ``start`` along waits back to ``goal`` (``goal`` not repeated), depth first; None if none."""
        stack: list[tuple[int, list[int]]] = [(start, [start])]
        seen: set[int] = set()
        while stack:
            key, path = stack.pop()
            for other in self.edges.get(key, ()):
                if other == goal:
                    return path
                if other in self.owner and other not in seen:
                    seen.add(other)
                    stack.append((other, [*path, other]))
        return None
