"""``SpawnRequest``: one spawn as a value, from ``spawn``/``spawn_group`` to the node that builds the actor.

The caller makes it once; the placer reads its placement (one ``Where``,
whatever the spawn said: ``on=rank`` and ``gpus=`` are parts of it), names
each group member on a copy (:meth:`SpawnRequest.named`), the chosen node's
service builds the actor from it, and a relocatable actor's relocator keeps it
(in a ``RelocationSpec``) to build the actor again elsewhere. It crosses
nodes, so the codec carries it.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field, replace
from typing import Any

from actorch._actors.restart import Restart
from actorch._actors.where import Where
from actorch._base.codec import serializable
from actorch._base.resources import GPUS

__all__ = ["SpawnRequest"]

NOWHERE = Where()
"""The placement of a spawn that asks nothing of its node (``on=rank``, or none)."""


@serializable()
@dataclass(frozen=True)
class SpawnRequest:
    """What to build, under which name and policy, on what device, and what it asks of its node.

    Attributes:
        path: The actor's class, ``module:Qualname``.
        args: Positional arguments for ``__init__``.
        kwargs: Keyword arguments for ``__init__``.
        name: Its name, if any.
        restart: Its restart policy, if any.
        device: The device its spawn named (``device=``), if any.
        gpus: GPUs to lend it (``gpus=``), given when the request is made and
            kept in ``where.gpus``, so that a request asks for GPUs in one place
            (not a field: ``SpawnRequest(p, gpus=2) == SpawnRequest(p, where=Where(gpus=2))``).
        where: What it asks of its node: the node itself (``on=rank``), or its
            label, host, the resources it holds there, a process of its own.
    """

    path: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    restart: Restart | None = None
    device: str | None = None
    gpus: InitVar[int] = 0
    where: Where = NOWHERE

    def __post_init__(self, gpus: int) -> None:
        if not gpus:
            return
        if self.where.gpus:
            raise ValueError(f"spawn({self.qualname}): ask for GPUs in Where(gpus=...) or with gpus=, not both")
        object.__setattr__(self, "where", replace(self.where, gpus=gpus))

    @property
    def qualname(self) -> str:
        """The class's qualified name, as messages name the actor (``Learner``)."""
        return self.path.rpartition(":")[2]

    @property
    def relocatable(self) -> bool:
        """Whether its policy moves it when its node is lost (``Restart(relocate=True)``)."""
        return self.restart is not None and self.restart.relocate

    @property
    def own(self) -> bool:
        """Whether it gets a process of its own (``Where(process="own")``)."""
        return self.where.own

    def lent(self) -> int:
        """How many GPUs its node lends it (``gpus=``, ``Where(gpus=...)``)."""
        return self.where.gpus

    def held(self) -> dict[str, float]:
        """The resources it holds on its node besides lent GPUs (``Where(cpus=..., resources=...)``)."""
        return {name: amount for name, amount in self.where.needs().items() if name != GPUS}

    def needs(self) -> dict[str, float]:
        """All it holds on its node, lent GPUs included: what a node that fits must have."""
        lent = self.lent()
        return {**self.held(), **({GPUS: float(lent)} if lent else {})}

    def named(self, name: str | None) -> SpawnRequest:
        """The same spawn under ``name`` (a group's member)."""
        return replace(self, name=name)

    def placed(self) -> SpawnRequest:
        """The same spawn without the node its ``Where`` names: what the node it was placed on builds and keeps.

        The rank is the placer's to honour, once: a relocatable actor that
        moves is placed by the rest of what it asked, among the nodes there are then.
        """
        return self if self.where.rank is None else replace(self, where=replace(self.where, rank=None))
