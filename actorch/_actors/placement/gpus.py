"""The GPUs a node lends to actors: each node's :class:`GpuPool`, and what it says of them (:class:`GpuShare`).

An actor spawned with ``gpus=k`` or ``Where(gpus=k)`` asks to be lent ``k``
GPUs of one node, as it may ask for any resource; the placer finds the node
(``where_placer``). That node's pool lends them as it builds the actor, with
no ``await`` between finding them free and holding them, so two spawns never
get the same GPU; a spawn that finds them taken meanwhile is refused with
``PlacementError`` and moves on to the next node that fits. An actor keeps
its GPUs across restarts and gives them back when it stops, for good, or its
node shuts down. An actor spawned with ``device=`` alone holds nothing: it
shares its device with whoever else is there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from actorch._actors.node_share import NodeShare
from actorch._actors.placement.fit import lacks_capacity, lacks_free
from actorch._base.errors import PlacementError
from actorch._base.resources import GPUS

__all__ = ["GpuPool", "GpuShare", "check_device"]


def check_device(actor: str, device: str, rank: int, have: tuple[str, ...]) -> None:
    """Refuse to place ``actor`` on ``device`` of node ``rank`` unless the node has it (``have``; the CPU always).

    Raises:
        PlacementError: The node lacks the device; the message names the devices it has.
    """
    if device != "cpu" and device not in have:
        raise PlacementError(f"cannot place {actor} on {device}: node {rank} has {', '.join(have) or 'no GPU'}")


@dataclass(frozen=True)
class GpuShare:
    """What one node says of its GPUs: which it has and which actors hold.

    Attributes:
        rank: The node's rank.
        devices: Its GPUs (``("cuda:0", "cuda:1")``), empty without one.
        holders: The GPUs held by actors spawned with ``gpus=``, with the actor
            holding each (its name, or ``Class#id on node N``).
    """

    rank: int
    devices: tuple[str, ...]
    holders: Mapping[str, str] = field(default_factory=dict)

    @property
    def free(self) -> tuple[str, ...]:
        """The GPUs no actor holds, in the node's order."""
        return tuple(device for device in self.devices if device not in self.holders)

    def as_resources(self) -> NodeShare:
        """What it says, as a node says what it has of any resource (``{"free": {"gpus": n}, "held": {...}}``)."""
        held: dict[str, dict[str, float]] = {}
        for holder in self.holders.values():
            held.setdefault(holder, {GPUS: 0.0})[GPUS] += 1.0
        return {"free": {GPUS: float(len(self.free))}, "held": held}

    def lacks(self, count: int) -> str | None:
        """Why this node cannot lend ``count`` GPUs now, in the words of every placement (``fit``); None if it can."""
        needs = {GPUS: float(count)}
        return lacks_capacity({GPUS: float(len(self.devices))}, needs) or lacks_free(self.as_resources(), needs)


class GpuPool:
    """The GPUs of one node and the actors holding them (``gpus=`` spawns only)."""

    def __init__(self, rank: int, inventory: Callable[[], tuple[str, ...]]) -> None:
        """Lend the GPUs ``inventory()`` lists (read on each use: the transport learns them as it starts)."""
        self.rank = rank
        self._inventory = inventory
        self.holders: dict[str, str] = {}
        """GPU (``"cuda:0"``) to the actor holding it."""
        self._held: dict[int, tuple[str, ...]] = {}  # actor id -> its GPUs

    def __repr__(self) -> str:
        return f"<GpuPool node {self.rank} held={sorted(self.holders)}>"

    def share(self) -> GpuShare:
        """What this node has and who holds what, now."""
        return GpuShare(self.rank, self._inventory(), dict(self.holders))

    def pick(self, count: int, what: str) -> tuple[str, ...]:
        """The first ``count`` free GPUs, not yet held: :meth:`hold` them before the next ``await``.

        Raises:
            PlacementError: Fewer than ``count`` are free; the message says
                what this node has free and who holds it.
        """
        share = self.share()
        why = share.lacks(count)
        if why is not None:
            raise PlacementError(f"{what}: node {self.rank}: {why}")
        return share.free[:count]

    def hold(self, devices: Iterable[str], actor_id: int, holder: str) -> None:
        """Lend ``devices`` (from :meth:`pick`) to actor ``actor_id``, shown as ``holder``, until :meth:`release`."""
        taken = tuple(devices)
        if not taken:
            return
        for device in taken:
            self.holders[device] = holder
        self._held[actor_id] = taken

    def release(self, actor_id: int) -> None:
        """Take back what actor ``actor_id`` holds, if anything."""
        for device in self._held.pop(actor_id, ()):
            del self.holders[device]
