"""Whether a node fits a spawn: the one predicate that ``Where`` placement, ``gpus=`` and relocation ask.

A node is refused for what it *is* (:func:`refusal`: lost or leaving, another
actor's own process, its label or host, a device it lacks, less of a resource
in all than the actor holds, :func:`lacks_capacity`) or for what it *has free* now (:func:`lacks_free`: what
other actors hold). Each reason is one phrase, worded here and nowhere else,
so a ``PlacementError`` and a relocation that finds no node read the same
(:func:`by_node` lists them), and amounts are compared with one tolerance,
:data:`EPSILON`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actorch._actors.where import Where
from actorch._base.resources import GPUS, describe_amount
from actorch._transport.base import NodeInfo

__all__ = ["EPSILON", "LEAVING", "LOST", "by_node", "capacity", "lacks_capacity", "lacks_free", "refusal"]

EPSILON = 1e-9
"""How much an amount may fall short and still count as enough: fractions of a CPU add up with rounding errors."""

LOST = "lost"
LEAVING = "leaving the system"


def capacity(info: NodeInfo) -> dict[str, float]:
    """All that node ``info`` offers actors, by resource name; its GPUs counted from its devices if not declared."""
    return {**info.resources, GPUS: float(info.resources.get(GPUS, len(info.devices)))}


def refusal(info: NodeInfo, where: Where, device: str | None, unavailable: Mapping[int, str]) -> str | None:
    """Why node ``info`` can never take an actor placed by ``where`` (on ``device``) as it is now; None if it can.

    Args:
        info: The node.
        where: What the spawn asked of its node (label, host, the resources the actor holds).
        device: The device the spawn named (``device=``), if any: the node must have it.
        unavailable: Nodes that take no actor now, and why (``LOST``, ``LEAVING``, rank 0 for relocation).
    """
    if info.rank in unavailable:
        return unavailable[info.rank]
    if info.owner is not None:  # before its label: no placement puts an actor there, whatever it asks
        return f"the own process of {info.owner}"
    if where.label is not None and info.label != where.label:
        return f"label {info.label!r}, not {where.label!r}"
    if where.host is not None and info.host != where.host:
        return f"on host {info.host!r}, not {where.host!r}"
    if device is not None and device != "cpu" and device not in info.devices:
        return f"has no {device} ({', '.join(info.devices) or 'no GPU'})"
    return lacks_capacity(capacity(info), where.needs())


def lacks_capacity(have: Mapping[str, float], needs: Mapping[str, float]) -> str | None:
    """What a node that has ``have`` in all lacks for ``needs`` (the first resource short), in words; else None."""
    for name, amount in needs.items():
        if have.get(name, 0.0) + EPSILON < amount:
            return f"has {describe_amount(name, have.get(name, 0.0))}, needs {describe_amount(name, amount)}"
    return None


def lacks_free(share: Mapping[str, Any], needs: Mapping[str, float]) -> str | None:
    """What a node's free resources lack for ``needs``, in words; None if nothing.

    ``share`` is what the node says it has free and who holds what:
    ``{"free": {name: amount}, "held": {holder: {name: amount}}}``.
    """
    free: Mapping[str, float] = share["free"]
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
