"""The run's plan: every fault and join, with its time and target, drawn from the seed before anything starts.

Partitions must be known before the system starts (``FaultyTransport``'s
schedule travels to every node), so the whole plan is: joined nodes get
ranks in the order they join, and the plan gives each its rank beforehand.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from actorch.testing import Partition

SETTLE = 12.0
"""Seconds after a planned join before the plan makes the new node a target (it must have joined and got its roles)."""
MIN_WORKERS = 1
"""Live nodes besides rank 0 a fault that removes a node must leave (somewhere for the ledgers to go)."""
WEIGHTS = {"kill": 3, "stop": 3, "partition": 3, "cut": 2, "leave": 1, "join": 1}
"""How often each kind of event is drawn (a cut needs a node in the other namespace; a join, room for one)."""


@dataclass(frozen=True)
class Event:
    """One planned fault or membership change, ``at`` seconds after the epoch.

    Attributes:
        at: When, in seconds after the run's epoch.
        kind: ``kill``, ``stop``, ``partition`` (FaultyTransport), ``cut`` (network namespaces), ``leave`` or ``join``.
        rank: The target's rank; for a join, the rank the newcomer will get.
        seconds: How long a stop, partition or cut lasts.
        way: How a join is made: ``add_nodes``, ``serve`` or ``serve-netns``.
    """

    at: float
    kind: str
    rank: int
    seconds: float = 0.0
    way: str = ""

    def long(self, liveness: float) -> bool:
        """Whether the fault outlasts the liveness timeout (the node is then lost)."""
        return self.kind in ("stop", "partition", "cut") and self.seconds > liveness

    def label(self, liveness: float) -> str:
        """The row of the faults table it counts in."""
        if self.kind in ("stop", "partition", "cut"):
            return f"{self.kind} {'long' if self.long(liveness) else 'short'}"
        if self.kind == "join":
            return f"join ({self.way})"
        return self.kind

    def removes(self, liveness: float) -> bool:
        """Whether the node is gone after it: killed, left, or lost to a long stop or cut."""
        return self.kind in ("kill", "leave") or self.long(liveness)


@dataclass(frozen=True)
class Plan:
    """Everything a run does, from its options and seed."""

    seed: int
    seconds: float
    nodes: int
    liveness: float
    every: float
    snapshot_every: int
    netns: bool
    events: tuple[Event, ...]

    @property
    def warm_up(self) -> float:
        """Seconds after the epoch before the first fault (start-up, then the load settles)."""
        return max(8.0, 0.1 * self.seconds)

    @property
    def cool_down(self) -> float:
        """Seconds before the end with no new fault (stops resume, joins finish, memory settles)."""
        return max(6.0, 0.1 * self.seconds)

    def partitions(self) -> list[Partition]:
        """The FaultyTransport schedule: one ``Partition`` per planned partition."""
        return [
            Partition({event.rank}, start=event.at, stop=event.at + event.seconds)
            for event in self.events
            if event.kind == "partition"
        ]


def make_plan(
    seed: int, seconds: float, nodes: int, liveness: float, every: float, snapshot_every: int, netns: bool
) -> Plan:
    """Draw the run's events from ``seed``: targets, kinds and durations, joins where the system shrank.

    The first fault is a kill, so that even a short run relocates its ledgers;
    a node whose fault removes it is replaced by a join at the next event.
    """
    plan = Plan(seed, seconds, nodes, liveness, every, snapshot_every, netns, ())
    rng = random.Random(seed)
    joined: dict[int, float] = dict.fromkeys(range(1, nodes), -SETTLE)  # live nodes, when they join(ed)
    busy: dict[int, float] = {}  # a node under a fault until then
    next_rank = nodes
    remote: int | None = None  # the node in the other network namespace
    events: list[Event] = []
    at = plan.warm_up
    end = seconds - plan.cool_down
    while True:
        at += rng.uniform(0.5, 1.5) * every
        if at >= end:
            break
        ready = sorted(rank for rank, since in joined.items() if since + SETTLE <= at and busy.get(rank, 0) <= at)
        kind = "kill" if not events else rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        if len(joined) < nodes - 1 or (kind == "join" and len(joined) < nodes):
            kind = "join"
        elif kind == "join" or not ready:
            continue
        if kind == "cut" and (remote not in ready):
            kind = "stop"
        if kind == "join":
            ways = ["add_nodes", "serve", "serve-netns"] if netns and remote is None else ["add_nodes", "serve"]
            way = rng.choice(ways)
            events.append(Event(at, "join", next_rank, way=way))
            joined[next_rank] = at
            remote = next_rank if way == "serve-netns" else remote
            next_rank += 1
            continue
        rank = remote if kind == "cut" else rng.choice(ready)
        assert rank is not None
        seconds_ = 0.0
        if kind in ("stop", "partition", "cut"):
            seconds_ = (
                rng.uniform(0.3, 0.4 * liveness) if rng.random() < 0.5 else rng.uniform(liveness + 1.5, liveness + 4.0)
            )
        event = Event(at, kind, rank, seconds_)
        if event.removes(liveness) and len(joined) - 1 < MIN_WORKERS:
            continue
        events.append(event)
        busy[rank] = at + seconds_ + 2.0
        if event.removes(liveness):
            del joined[rank]
            remote = None if rank == remote else remote
    return dataclasses.replace(plan, events=tuple(events))
