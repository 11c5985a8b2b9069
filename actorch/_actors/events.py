"""Membership events: nodes joining, leaving and being lost, names registered and removed.

``ActorSystem.events()`` yields them. Node events come from this node's own view
of its peers; name events come from the registry, which tells every subscribed
node's service each change with a sequence number.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from actorch._actors.ref import ActorRef
from actorch._actors.system import MembershipEvent
from actorch._transport.base import NodeInfo

__all__ = [
    "EventHub",
    "NameRegistered",
    "NameRemoved",
    "NodeJoined",
    "NodeLeft",
    "NodeLost",
    "Subscription",
]


@dataclass(frozen=True)
class NodeJoined(MembershipEvent):
    """A node is part of the system: yielded first for every live node, then for each node that joins.

    Attributes:
        rank: The node's rank.
        info: Its host, pid and worker name.
    """

    rank: int
    info: NodeInfo


@dataclass(frozen=True)
class NodeLeft(MembershipEvent):
    """A node left the system on purpose (``system.leave``): its actors stopped and its names went first.

    Attributes:
        rank: The node's rank (never given to another node).
        reason: Why, as the node said.
    """

    rank: int
    reason: str


@dataclass(frozen=True)
class NodeLost(MembershipEvent):
    """A node died, stopped answering or was cut off; its actors and names are gone.

    Attributes:
        rank: The node's rank.
        reason: How it was noticed (a closed connection, silence past the liveness timeout).
    """

    rank: int
    reason: str


@dataclass(frozen=True)
class NameRegistered(MembershipEvent):
    """An actor took a name (yielded first for every name that exists).

    Attributes:
        name: The name.
        ref: The actor now holding it.
    """

    name: str
    ref: ActorRef[Any]


@dataclass(frozen=True)
class NameRemoved(MembershipEvent):
    """A name is free again.

    Attributes:
        name: The name.
        reason: ``"stopped"``, ``"failed"`` (the actor failed with no restart
            left), ``"node_lost"`` or ``"node_left"`` (its node left the system).
    """

    name: str
    reason: str


class Subscription:
    """One ``events()`` iterator's queue, and the registry changes its snapshot already held."""

    __slots__ = ("pattern", "queue", "seen")

    def __init__(self, pattern: re.Pattern[str] | None) -> None:
        self.pattern = pattern
        self.queue: asyncio.Queue[MembershipEvent | None] = asyncio.Queue()  # None: the node shut down
        self.seen: int | None = None  # registry sequence number of the snapshot; None until it came

    def __repr__(self) -> str:
        return f"<Subscription queued={self.queue.qsize()} seen={self.seen}>"

    def wants(self, event: MembershipEvent) -> bool:
        """Whether the event's name (if it has one) matches this subscription's pattern."""
        if self.pattern is None or not isinstance(event, (NameRegistered, NameRemoved)):
            return True
        return self.pattern.fullmatch(event.name) is not None


class EventHub:
    """Hands this node's membership events to every live ``events()`` iterator."""

    def __init__(self) -> None:
        self.subscriptions: set[Subscription] = set()
        self._pending: list[tuple[int, MembershipEvent]] = []  # name events seen before a snapshot came

    def __repr__(self) -> str:
        return f"<EventHub subscriptions={len(self.subscriptions)}>"

    def close(self) -> None:
        """The node shuts down: every iterator ends."""
        for subscription in self.subscriptions:
            subscription.queue.put_nowait(None)

    def node_lost(self, rank: int, reason: str) -> None:
        """This node saw ``rank`` lost."""
        self._node_event(NodeLost(rank, reason))

    def node_joined(self, info: NodeInfo) -> None:
        """A node joined the system."""
        self._node_event(NodeJoined(info.rank, info))

    def node_left(self, rank: int, reason: str) -> None:
        """Node ``rank`` left the system."""
        self._node_event(NodeLeft(rank, reason))

    def _node_event(self, event: MembershipEvent) -> None:
        for subscription in self.subscriptions:
            subscription.queue.put_nowait(event)

    def name_event(self, seq: int, kind: str, name: str, ref: ActorRef[Any] | None, reason: str | None) -> None:
        """The registry's change number ``seq``."""
        event: MembershipEvent = NameRegistered(name, ref) if ref is not None else NameRemoved(name, reason or kind)
        waiting_for_snapshot = False
        for subscription in self.subscriptions:
            if subscription.seen is None:
                waiting_for_snapshot = True
            elif seq > subscription.seen and subscription.wants(event):
                subscription.queue.put_nowait(event)
        if waiting_for_snapshot:
            self._pending.append((seq, event))  # sorted out when the snapshots come

    def snapshot_came(self, subscription: Subscription, seq: int) -> None:
        """``subscription``'s snapshot holds the registry's changes up to ``seq``: queue the later ones seen."""
        subscription.seen = seq
        for event_seq, event in self._pending:
            if event_seq > seq and subscription.wants(event):
                subscription.queue.put_nowait(event)
        if all(other.seen is not None for other in self.subscriptions):
            self._pending.clear()
