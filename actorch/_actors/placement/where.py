"""``Where``: what a spawn asks of the node that will host an actor.

``spawn(Cls, on=3)`` names a node exactly. ``spawn(Cls, on=Where(label="env",
cpus=1))`` describes one instead: its label, its host, the resources the actor
holds there while it lives, the actors it must be near or apart from, or a
process of the actor's own. The placement
(``where_placer``) finds a node that fits, or raises ``PlacementError`` naming each
node and why it did not, or waits for one (``wait=True``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from actorch._base.codec import serializable
from actorch._base.resources import CPUS, GPUS, MEMORY, check_resources, describe_amount

__all__ = ["OWN", "Placed", "Where"]

OWN = "own"
ANY = "any"


@runtime_checkable
class Placed(Protocol):
    """An actor as ``Where(near=..., apart_from=...)`` names it: its ref (an ``ActorRef``).

    A protocol rather than ``ActorRef`` itself: ``ActorSystem``'s signatures
    name ``Where``, and ``ActorRef`` is built on ``Actor``, which names the
    system (the one import tie the layers allow stays that small).
    """

    @property
    def rank(self) -> int:
        """The rank of the node hosting the actor, as the ref knows it."""

    @property
    def name(self) -> str | None:
        """The actor's name, if it has one."""

    async def wait_stopped(self) -> object:
        """How the actor ended, once it has."""


@serializable()
@dataclass(frozen=True)
class Where:
    """Where to place an actor: a node chosen by label, host and free resources, or a process of its own.

    Give it as ``on=`` to ``spawn`` or ``spawn_group``. Every field left at its
    default asks nothing. The resources an actor asks for (``cpus``, ``gpus``,
    ``memory``, ``resources``) are held for it on its node until it stops, and
    no other actor placed by resources gets them meanwhile.

    Attributes:
        label: Only nodes with this label (``add_nodes(label=...)``, ``serve(name=...)``).
        host: Only nodes on this host (its host name); with ``process="own"``,
            the host agent to start the process, named by its host name or label.
        cpus: CPUs the actor holds (a fraction is fine).
        gpus: GPUs the actor holds, whole ones, lent as devices: its device is the first.
        memory: Bytes of memory the actor holds.
        resources: Amounts of declared resources the actor holds (``{"env_slots": 1}``).
        process: ``"any"`` (a node that fits), or ``"own"``: a new node process
            started for this actor alone (on rank 0's host, or on ``host``
            through its agent), which leaves the system when the actor stops.
            ``label`` then labels that new node.
        env: With ``process="own"``: environment variables for the new process.
        wait: When nothing fits, wait for a node to join or an actor to give its
            resources back, until the caller's deadline (``asyncio.timeout``) or,
            without one, the system's ``lookup_timeout``; else raise at once.
        near: Only the node of this actor (its ref).
        apart_from: Not the node of any of these actors: a ref, or a list of refs.

    Example:
        >>> await system.spawn(Simulator, on=actorch.Where(label="env", cpus=1))
        >>> await system.spawn(Learner, on=actorch.Where(process="own"))
    """

    label: str | None = None
    host: str | None = None
    cpus: float = 0.0
    gpus: int = 0
    memory: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict, hash=False)
    process: str = ANY
    env: Mapping[str, str] | None = field(default=None, hash=False)
    wait: bool = False
    near: Placed | None = None
    apart_from: Placed | Sequence[Placed] = ()

    def __post_init__(self) -> None:
        for attribute in ("label", "host"):
            value = getattr(self, attribute)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"Where({attribute}=...) must be a non-empty str or None, not {value!r}")
        for attribute in (CPUS, MEMORY):
            value = getattr(self, attribute)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Where({attribute}=...) must be a finite number >= 0, not {value!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise ValueError(f"Where(gpus=...) must be an int >= 0, not {self.gpus!r}")
        declared = check_resources(self.resources, "Where(resources=...)")
        clash = sorted(set(declared) & {CPUS, GPUS, MEMORY})
        if clash:
            raise ValueError(
                f"Where(resources=...): give {', '.join(clash)} as Where({clash[0]}=...), not in resources"
            )
        object.__setattr__(self, "resources", declared)
        if self.process not in (ANY, OWN):
            raise ValueError(f"Where(process=...) must be 'any' or 'own', not {self.process!r}")
        if self.env is not None:
            if self.process != OWN:
                raise ValueError("Where(env=...) is for a process of the actor's own: add process='own'")
            if not isinstance(self.env, Mapping) or not all(
                isinstance(key, str) and isinstance(value, str) for key, value in self.env.items()
            ):
                raise ValueError(f"Where(env=...) must map str to str, not {self.env!r}")
            object.__setattr__(self, "env", dict(self.env))
        if not isinstance(self.wait, bool):
            raise ValueError(f"Where(wait=...) must be a bool, not {self.wait!r}")
        self._check_affinity()

    def _check_affinity(self) -> None:
        """Check ``near`` and ``apart_from``; keep ``apart_from`` as a tuple of refs."""
        if self.near is not None and not isinstance(self.near, Placed):
            raise ValueError(f"Where(near=...) must be an actor's ref (ActorRef) or None, not {self.near!r}")
        apart = (self.apart_from,) if isinstance(self.apart_from, Placed) else self.apart_from
        if isinstance(apart, (str, bytes)) or not isinstance(apart, Sequence):
            raise ValueError(f"Where(apart_from=...) must be an actor's ref or a list of refs, not {apart!r}")
        strays = [item for item in apart if not isinstance(item, Placed)]
        if strays:
            raise ValueError(f"Where(apart_from=...) must hold actors' refs only, not {strays[0]!r}")
        object.__setattr__(self, "apart_from", tuple(apart))
        if self.near is not None and self.process == OWN:
            raise ValueError("Where(near=...) places on an actor's node, not in a process of its own (process='own')")
        if self.near is not None and self.near in self.apart:
            raise ValueError(f"Where(near=..., apart_from=...): {self.near!r} cannot be both")

    def __repr__(self) -> str:
        shown = []
        for attribute in (
            "label",
            "host",
            "cpus",
            "gpus",
            "memory",
            "resources",
            "process",
            "env",
            "wait",
            "near",
            "apart_from",
        ):
            value = getattr(self, attribute)
            if value != Where.__dataclass_fields__[attribute].default and value not in ({}, None, ()):
                shown.append(f"{attribute}={value!r}")
        return f"Where({', '.join(shown)})"

    @property
    def apart(self) -> tuple[Placed, ...]:
        """The actors whose nodes are refused (``apart_from``), as a tuple."""
        return self.apart_from  # type: ignore[return-value]  # __post_init__ made it one

    @property
    def own(self) -> bool:
        """Whether the actor gets a process of its own."""
        return self.process == OWN

    def needs(self) -> dict[str, float]:
        """The amounts the actor holds, by resource name, GPUs included; those it asks none of left out."""
        amounts = {CPUS: float(self.cpus), GPUS: float(self.gpus), MEMORY: float(self.memory), **self.resources}
        return {name: amount for name, amount in amounts.items() if amount > 0}

    def describe_needs(self) -> str:
        """What the actor holds, in words (``1 cpus, 2 env_slots``), or ``nothing``."""
        return ", ".join(describe_amount(name, amount) for name, amount in self.needs().items()) or "nothing"
