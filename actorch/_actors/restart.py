"""Supervision as data: how a failed actor is restarted (``Restart``) and how an actor ended (``ActorExit``).

Also what every place that restarts or moves actors counts by: the failures
that count against a policy (:func:`count_failure`), and how many endings a
node remembers (:data:`EXITS_KEPT`). A node's supervisor and rank 0's
relocator both use them.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from actorch._base.codec import serializable
from actorch._base.config import is_count, is_number

__all__ = ["EXITS_KEPT", "EXIT_REASONS", "ActorExit", "Restart", "count_failure"]

EXIT_REASONS = ("stopped", "failed", "node_lost", "node_left", "shutdown")

EXITS_KEPT = 4096
"""How many ended actors a node remembers, for ``wait_stopped`` calls that come late."""


@serializable()
@dataclass(frozen=True)
class Restart:
    """Restart an actor that fails, on the same node under the same name (``spawn(..., restart=)``).

    An actor fails when a handler raises one of its class's ``fatal_errors``, or
    when ``__init__`` or ``on_start`` raises (at ``spawn``, which then returns once
    a start succeeded, or during a restart). Its calls in flight get
    ``ActorStoppedError``; calls made meanwhile wait and reach the new instance.
    If the class defines ``snapshot()`` and ``restore(state)``, the failed
    instance's snapshot is restored into the new one before its ``on_start``.

    With ``relocate=True`` the actor also outlives its node: when the node is
    lost, the actor is started again on another live node from the last
    snapshot it saved (``Actor.save_snapshot``), under the same name, and its
    refs follow it (see the relocation guide).

    Attributes:
        max_restarts: Restarts allowed within ``within`` seconds; one more
            failure stops the actor for good.
        within: Seconds over which failures are counted; None counts them all.
        backoff: Seconds to wait before the first restart.
        factor: Growth of the wait for each further failure counted.
        max_backoff: The longest wait between a failure and its restart.
        relocate: Start the actor again on another node when its node is lost
            (never on rank 0, which holds the snapshots). A relocation counts
            as a restart, and waits the same backoff.
    """

    max_restarts: int = 3
    within: float | None = 60.0
    backoff: float = 0.1
    factor: float = 2.0
    max_backoff: float = 10.0
    relocate: bool = False

    def __post_init__(self) -> None:
        if not is_count(self.max_restarts, 0):
            raise ValueError(f"max_restarts must be an int >= 0, not {self.max_restarts!r}")
        if self.within is not None and not is_number(self.within, inclusive=False):
            raise ValueError(f"within must be a positive number of seconds or None, not {self.within!r}")
        for field in ("backoff", "max_backoff"):
            if not is_number(getattr(self, field)):
                raise ValueError(f"{field} must be a finite number of seconds >= 0, not {getattr(self, field)!r}")
        if not is_number(self.factor, 1.0):
            raise ValueError(f"factor must be a finite number >= 1, not {self.factor!r}")
        if not isinstance(self.relocate, bool):
            raise TypeError(f"relocate must be True or False, not {self.relocate!r}")

    def delay(self, failures: int) -> float:
        """Seconds to wait before restarting after the ``failures``-th failure counted (1 for the first)."""
        return min(self.max_backoff, self.backoff * self.factor ** max(0, failures - 1))


def count_failure(history: deque[float], restart: Restart) -> int:
    """Add a failure now to ``history``; how many of it count against ``restart`` (this one included)."""
    now = time.monotonic()
    history.append(now)
    if restart.within is not None:
        while history and history[0] < now - restart.within:
            history.popleft()
    return len(history)


@serializable()
@dataclass(frozen=True)
class ActorExit:
    """How an actor ended, as ``await ref.wait_stopped()`` reports it.

    Attributes:
        reason: ``"stopped"`` (``stop()`` was called), ``"failed"`` (a fatal
            error with no restart left), ``"node_lost"`` (its node died or was
            cut off), ``"node_left"`` (its node left the system, stopping it)
            or ``"shutdown"`` (the system ended).
        error: What caused a failure or a node loss, as text; None otherwise.
        restarts: How many times the actor had been restarted.
    """

    reason: str
    error: str | None = None
    restarts: int = 0

    @property
    def failed(self) -> bool:
        """Whether the actor ended by failing (including its node being lost)."""
        return self.reason in ("failed", "node_lost")
