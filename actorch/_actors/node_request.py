"""``NodeRequest``: node processes to start, as one value, from ``add_nodes`` to the node that starts them.

``ActorSystem.add_nodes`` makes one, and so does the placer for actors that
get processes of their own (``Where(process="own")``, one owner a process);
the placer sends it to rank 0 or to the host agent of its ``host``, whose
service hands it to the node's ``NodePool``. It checks itself as it is made,
so each of them takes it as it is; it crosses nodes, so the codec carries it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from actorch._actors.where import check_env, check_text
from actorch._base.codec import serializable
from actorch._base.config import is_count
from actorch._base.resources import check_resources

__all__ = ["NodeRequest"]


@serializable()
@dataclass(frozen=True)
class NodeRequest:
    """How many node processes to start, where, and what they say of themselves.

    Attributes:
        count: How many (>= 1).
        label: Their label (``NodeInfo.label``), if any.
        resources: Amounts they declare over what they detect (``{"env_slots": 4}``).
        env: Environment variables for the new processes.
        host: The host to start them on, through its agent (its host name or
            label); None: rank 0's host.
        owners: For processes started for one actor each (``Where(process="own")``),
            that actor's name (or class), one a process; None for plain nodes.

    Raises:
        ValueError: A bad ``count``, ``label``, ``host``, ``resources`` or
            ``env``, or not one owner a process.
        TypeError: ``resources`` is not a mapping.
    """

    count: int
    label: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict, hash=False)
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    host: str | None = None
    owners: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not is_count(self.count):
            raise ValueError(f"add_nodes(count=...) must be an int >= 1, not {self.count!r}")
        check_text(self.label, "add_nodes(label=...)")
        check_text(self.host, "add_nodes(host=...)")
        object.__setattr__(self, "resources", check_resources(self.resources, "add_nodes(resources=...)"))
        object.__setattr__(self, "env", check_env(self.env, "add_nodes(env=...)"))
        if self.owners is not None:
            object.__setattr__(self, "owners", tuple(self.owners))
            if len(self.owners) != self.count:
                raise ValueError(f"add_nodes({self.count}): {len(self.owners)} owners given")

    def owner_of_each(self) -> list[str | None]:
        """The owner of each process to start, in order: None for plain nodes."""
        return list(self.owners) if self.owners is not None else [None] * self.count
