"""``Where``: what a spawn asks of the node that will host an actor.

``spawn(Cls, on=Where(label="env", cpus=1))`` describes a node: its label,
its host, the resources the actor holds there while it lives, the actors it
must be near or apart from, or a process of the actor's own. ``spawn(Cls,
on=3)`` names one exactly, and ``spawn(Cls, gpus=2)`` asks for GPUs: inside,
both are parts of a ``Where`` too (:func:`where_of`), so that every spawn is
placed by one placer (``where_placer``), which finds a node that fits, or
raises ``PlacementError`` naming each node and why it did not, or waits for
one (``wait=True``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from actorch._base.codec import serializable
from actorch._base.resources import CPUS, GPUS, MEMORY, check_resources, describe_amount

__all__ = ["OWN", "Placed", "Where", "check_env", "check_text", "where_of"]

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
        rank: Only this node, taken as it is (``on=rank`` is short for
            ``Where(rank=rank)``): even another actor's own process. It names
            the node, so it goes with no other field that describes one
            (``label``, ``host``, ``near``, ``apart_from``, ``process``); the
            actor still holds what it asks there, and may ``wait`` for it.

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
    rank: int | None = None

    def __post_init__(self) -> None:
        for attribute in ("label", "host"):
            check_text(getattr(self, attribute), f"Where({attribute}=...)")
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
            object.__setattr__(self, "env", check_env(self.env, "Where(env=...)"))
        if not isinstance(self.wait, bool):
            raise ValueError(f"Where(wait=...) must be a bool, not {self.wait!r}")
        self._check_affinity()
        self._check_rank()

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

    def _check_rank(self) -> None:
        """Check ``rank``: a rank, and alone among the fields that describe a node."""
        if self.rank is None:
            return
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"Where(rank=...) must be a node's rank (an int >= 0) or None, not {self.rank!r}")
        described = [
            attribute
            for attribute, asked in (
                ("label", self.label is not None),
                ("host", self.host is not None),
                ("near", self.near is not None),
                ("apart_from", bool(self.apart)),
                ("process", self.own),
            )
            if asked
        ]
        if described:
            raise ValueError(
                f"Where(rank=..., {described[0]}=...): rank names the node, so it takes no {described[0]}; "
                "give one or the other"
            )

    def __repr__(self) -> str:
        shown = []
        for attribute in (
            "rank",
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


def check_text(value: object, what: str) -> None:
    """Refuse ``value`` unless it is None or a str with more than spaces (a label, a host name)."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{what} must be a non-empty str or None, not {value!r}")


def check_env(value: object, what: str) -> dict[str, str]:
    """``value`` as a plain dict of environment variables, if it maps str to str; else ``ValueError``."""
    if not isinstance(value, Mapping) or not all(
        isinstance(key, str) and isinstance(item, str) for key, item in value.items()
    ):
        raise ValueError(f"{what} must map str to str, not {value!r}")
    return dict(value)


def where_of(on: int | Where | None, here: int, *, gpus: int = 0, anywhere: bool = False) -> Where:
    """The one ``Where`` that a spawn's ``on=`` and ``gpus=`` make, for the placer.

    Args:
        on: What the spawn said: a ``Where`` (taken as it is), a rank (that
            node, ``Where(rank=on)``), or None.
        here: The caller's node, where a spawn that says nothing goes.
        gpus: GPUs it asks to be lent (``gpus=``), held on the node as ``Where(gpus=...)`` holds them.
        anywhere: Without ``on``, any node that fits rather than the caller's
            (a group spread across nodes); a spawn that asks for GPUs goes to any node too.
    """
    if isinstance(on, Where):
        return on
    if on is None and (gpus or anywhere):
        return Where(gpus=gpus)
    return Where(gpus=gpus, rank=here if on is None else on)
