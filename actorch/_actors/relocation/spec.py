"""Relocation: actors that outlive their node (``Restart(relocate=True)``), seen from each node.

A relocatable actor lives on any node but rank 0. Once it has started, its
host has rank 0's :class:`~actorch._actors.relocation.relocator.Relocator` adopt it with
a :class:`RelocationSpec` (how to build it again), and its refs are
``MovableRef`` objects that follow it. When it stops for good, rank 0 hears so
and moves it no more. Where it goes when its node is lost is chosen in one
place, :func:`eligible_nodes`; the relocator does the moving, and each node's
:class:`~actorch._actors.relocation.relocatables.Relocatables` keeps its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from actorch._actors.placement.fit import RANK_0, HomeOf, rank_of, refusal
from actorch._actors.relocation.movable import Origin
from actorch._actors.spawn_request import SpawnRequest
from actorch._base.codec import serializable
from actorch._base.names import actor_label
from actorch._transport.base import NodeInfo

__all__ = ["RANK_0", "RelocationSpec", "check_home", "eligible_nodes", "restores_explicitly"]


def check_home(what: str, rank: int) -> None:
    """Raise ``ValueError`` if a relocatable actor (``what``) would live on ``rank``: not on rank 0."""
    if rank == 0:
        raise ValueError(
            f"cannot place {what} on node 0 with Restart(relocate=True): rank 0 runs main and keeps the "
            "snapshots, and its loss ends the system; spawn it on another node (on=1)"
        )


def restores_explicitly(request: SpawnRequest) -> bool:
    """Whether ``request`` hands its actor a state of its own to start from: a ``restore=`` keyword, not None.

    Such an actor (a ``ReplayBuffer`` spawned from a snapshot file) starts
    from what it was given, not from the snapshot directory.
    """
    return request.kwargs.get("restore") is not None


@serializable()
@dataclass(frozen=True)
class RelocationSpec:
    """A relocatable actor as rank 0 keeps it: where it was first started, and the spawn that built it.

    Attributes:
        origin: Where it was first started, ``(rank, actor id)``: its identity.
        request: Its spawn, unchanged: what to build, its name and policy, and
            what it asked of its node, which every node it moves to must fit too.
    """

    origin: Origin
    request: SpawnRequest

    def label(self, home: Origin) -> str:
        """How logs and errors name the actor, living at ``home``."""
        return actor_label(self.request.name, self.request.qualname, home[1], home[0])


def eligible_nodes(
    spec: RelocationSpec,
    nodes: Sequence[NodeInfo],
    unavailable: Mapping[int, str],
    load: Mapping[int, int],
    home_of: HomeOf = rank_of,
) -> tuple[list[int], dict[int, str]]:
    """The nodes that may host ``spec``'s actor, best first, and why each other node may not.

    The one place relocation chooses a node. A node qualifies when it is not
    ``unavailable`` (lost, leaving, rank 0) and fits what the spawn asked for
    (``fit.refusal``: the device named with ``device=``, the label and host its
    ``Where`` named, near or apart from the actors it named, as ``home_of``
    says where they live; at least the GPUs and resources the actor holds; the node
    itself checks, as it builds the actor, that enough of them are free, and
    the relocator goes on to the next node if not). The node hosting
    the fewest relocatable actors (``load``) comes first, then the lowest rank.
    """
    chosen: list[int] = []
    refused: dict[int, str] = {}
    for info in nodes:
        why = refusal(info, spec.request, unavailable, home_of)
        if why is None:
            chosen.append(info.rank)
        else:
            refused[info.rank] = why
    chosen.sort(key=lambda rank: (load.get(rank, 0), rank))
    return chosen, refused
