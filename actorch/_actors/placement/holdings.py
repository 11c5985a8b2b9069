"""What the actors of one node hold of its resources, so that two spawns never count on the same CPUs.

Each node's host keeps :class:`Holdings` against the node's resources
(``NodeInfo.resources``). A spawn placed by resources (``Where(cpus=1,
resources={"env_slots": 1})``) picks and holds them as the node builds the
actor, with no ``await`` in between, and the actor gives them back when it stops
for good (restarts keep them). GPUs are lent as devices by the node's
``GpuPool`` instead; :func:`node_share` puts both in one answer for the placement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from actorch._actors.node_share import NodeShare
from actorch._actors.placement.fit import lacks_free
from actorch._actors.placement.gpus import GpuShare
from actorch._base.errors import PlacementError
from actorch._base.resources import GPUS

__all__ = ["Holdings", "node_share"]


class Holdings:
    """The counted resources (all but GPUs) that this node's actors hold, and who holds what."""

    def __init__(self, rank: int, capacity: Callable[[], Mapping[str, float]]) -> None:
        """Count against ``capacity()`` (read on each use: the transport learns it as it starts)."""
        self.rank = rank
        self._capacity = capacity
        self._held: dict[int, tuple[str, dict[str, float]]] = {}  # actor id -> (holder, amounts)

    def __repr__(self) -> str:
        return f"<Holdings node {self.rank} actors={len(self._held)}>"

    def free(self) -> dict[str, float]:
        """What no actor holds now, by resource name (GPUs left out)."""
        free = {name: amount for name, amount in self._capacity().items() if name != GPUS}
        for _, amounts in self._held.values():
            for name, amount in amounts.items():
                free[name] = free.get(name, 0.0) - amount
        return free

    def holders(self) -> dict[str, dict[str, float]]:
        """What each holding actor (its name, or ``Class#id on node N``) holds."""
        return {holder: dict(amounts) for holder, amounts in self._held.values()}

    def pick(self, needs: Mapping[str, float], what: str) -> dict[str, float]:
        """The counted part of ``needs`` if this node has it free: :meth:`hold` it before the next ``await``.

        Raises:
            PlacementError: Something is short; the message says what the node has free and who holds it.
        """
        counted = {name: amount for name, amount in needs.items() if name != GPUS and amount > 0}
        why = lacks_free({"free": self.free(), "held": self.holders()}, counted)
        if why is not None:
            raise PlacementError(f"{what}: node {self.rank}: {why}")
        return counted

    def hold(self, actor_id: int, amounts: Mapping[str, float], holder: str) -> None:
        """Hold ``amounts`` (from :meth:`pick`) for actor ``actor_id``, shown as ``holder``, until :meth:`release`."""
        if amounts:
            self._held[actor_id] = (holder, dict(amounts))

    def release(self, actor_id: int) -> None:
        """Take back what actor ``actor_id`` holds, if anything."""
        self._held.pop(actor_id, None)


def node_share(holdings: Holdings, gpus: GpuShare) -> NodeShare:
    """What a node has free and who holds what, GPUs counted in, for the placement and the node's status."""
    lent = gpus.as_resources()
    free = {**holdings.free(), **lent["free"]}
    held = holdings.holders()
    for holder, amounts in lent["held"].items():
        held.setdefault(holder, {}).update(amounts)
    return {"free": free, "held": held}
