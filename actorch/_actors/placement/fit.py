"""Whether a node fits a spawn: the one predicate that every placement (the placer's, relocation's) asks.

A node is refused for what it *is* (:func:`refusal`: lost or leaving, another
actor's own process, its label or host, not the node of the actor it must be
near or the node of one it must be apart from, a device it lacks, less of a resource
in all than the actor holds, :func:`lacks_capacity`) or for what it *has free* now (:func:`lacks_free`: what
other actors hold). A node that the spawn names by rank (``on=rank``,
``Where(rank=...)``) is taken as it is, and only what the actor holds must
fit there. Each reason is one phrase, worded here and nowhere else,
so a ``PlacementError`` and a relocation that finds no node read the same
(:func:`by_node` lists them), and amounts are compared with one tolerance,
:data:`EPSILON`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from actorch._actors.node_share import NodeShare
from actorch._actors.spawn_request import SpawnRequest
from actorch._actors.where import Placed, Where
from actorch._base.resources import GPUS, describe_amount
from actorch._transport.base import NodeInfo

__all__ = [
    "EPSILON",
    "LEAVING",
    "LOST",
    "RANK_0",
    "HomeOf",
    "by_node",
    "capacity",
    "lacks_capacity",
    "lacks_free",
    "rank_of",
    "refusal",
]

EPSILON = 1e-9
"""How much an amount may fall short and still count as enough: fractions of a CPU add up with rounding errors."""

LOST = "lost"
LEAVING = "leaving the system"
RANK_0 = "rank 0 hosts no relocatable actor (it keeps their snapshots)"


def capacity(info: NodeInfo) -> dict[str, float]:
    """All that node ``info`` offers actors, by resource name; its GPUs counted from its devices if not declared."""
    return {**info.resources, GPUS: float(info.resources.get(GPUS, len(info.devices)))}


HomeOf = Callable[[Placed], int | None]
"""Where an actor lives now, as the one who asks knows it; None if it lives nowhere any more."""


def rank_of(ref: Placed) -> int:
    """The node of ``ref``'s actor, as the ref knows it."""
    return ref.rank


def refusal(  # noqa: PLR0911 - one return per reason
    info: NodeInfo, request: SpawnRequest, unavailable: Mapping[int, str], home_of: HomeOf = rank_of
) -> str | None:
    """Why node ``info`` can never take the actor of ``request`` as the node is now; None if it can.

    Args:
        info: The node.
        request: The spawn: the device it named, the node, label and host its ``Where``
            asked for, the GPUs and resources the actor holds.
        unavailable: Nodes that take no actor now, and why (``LOST``, ``LEAVING``,
            ``RANK_0`` for a relocatable actor).
        home_of: Where the actors its ``Where`` is near or apart from live now
            (the relocator knows better than their refs where relocated ones went).
    """
    where, device = request.where, request.device
    if info.rank in unavailable:
        return unavailable[info.rank]
    if info.rank == where.rank:
        # The exact form: the node named is taken whoever's process it is, and the spawn checks the
        # device there itself as it asks the node (it knows the class's own device, this does not).
        return lacks_capacity(capacity(info), request.needs())
    if info.owner is not None:  # before its label: no placement puts an actor there, whatever it asks
        return f"the own process of {info.owner}"
    if where.label is not None and info.label != where.label:
        return f"label {info.label!r}, not {where.label!r}"
    if where.host is not None and info.host != where.host:
        return f"on host {info.host!r}, not {where.host!r}"
    why = _affinity(info.rank, where, unavailable, home_of)
    if why is not None:
        return why
    if device is not None and device != "cpu" and device not in info.devices:
        return f"has no {device} ({', '.join(info.devices) or 'no GPU'})"
    return lacks_capacity(capacity(info), request.needs())


def _affinity(rank: int, where: Where, unavailable: Mapping[int, str], home_of: HomeOf) -> str | None:
    """Why node ``rank`` is not near the actor ``where`` asks for, or is the node of one it keeps apart from."""
    if where.near is not None:
        home = home_of(where.near)
        if home is None:
            return f"not the node of {_who(where.near)}, which lives on no node now"
        if home != rank:
            gone = f", {unavailable[home]}" if home in unavailable else ""
            return f"not the node of {_who(where.near)} (node {home}{gone})"
    for other in where.apart:
        if home_of(other) == rank:
            return f"the node of {_who(other)}"
    return None


def _who(ref: Placed) -> str:
    """An actor as a refusal names it: its name, or its ref."""
    return ref.name if ref.name is not None else repr(ref)


def lacks_capacity(have: Mapping[str, float], needs: Mapping[str, float]) -> str | None:
    """What a node that has ``have`` in all lacks for ``needs`` (the first resource short), in words; else None."""
    for name, amount in needs.items():
        if have.get(name, 0.0) + EPSILON < amount:
            return f"has {describe_amount(name, have.get(name, 0.0))}, needs {describe_amount(name, amount)}"
    return None


def lacks_free(share: NodeShare, needs: Mapping[str, float]) -> str | None:
    """What a node's free resources lack for ``needs``, in words; None if nothing.

    ``share`` is what the node says it has free and who holds what.
    """
    free = share["free"]
    short = [name for name, amount in needs.items() if free.get(name, 0.0) + EPSILON < amount]
    if not short:
        return None
    lacking = ", ".join(
        f"{describe_amount(name, max(free.get(name, 0.0), 0.0))} free, needs {describe_amount(name, needs[name])}"
        for name in short
    )
    return lacking + _held_by(share["held"], short)


def _held_by(held: Mapping[str, Mapping[str, float]], short: list[str]) -> str:
    """`` (held by a, b)``: the holders of what is short, as the node names them; empty if none."""
    holders = ", ".join(sorted(holder for holder, amounts in held.items() if set(amounts) & set(short)))
    return f" (held by {holders})" if holders else ""


def by_node(refusals: Mapping[int, str]) -> str:
    """Every node and why it was refused, by rank: ``node 0: lost; node 1: label None, not 'env'``."""
    return "; ".join(f"node {rank}: {why}" for rank, why in sorted(refusals.items())) or "no node"
