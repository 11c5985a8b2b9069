"""Placing actors by resource: the GPUs a node lends to actors spawned with ``gpus=``.

Each node's host keeps a :class:`GpuPool` of its own GPUs. ``spawn(..., gpus=k)``
asks the candidate nodes' services what they have (a :class:`GpuShare` each),
then asks the first with ``k`` free GPUs to build the actor. That node takes
them as it builds, with no ``await`` between finding them free and holding
them, so two spawns never get the same GPU; a spawn that finds them taken
meanwhile is refused with ``PlacementError`` and moves on to the next
candidate. An actor keeps its GPUs across restarts and gives them back when it
stops, for good, or its node shuts down. An actor spawned with ``device=``
alone holds nothing: it shares its device with whoever else is there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from actorch._actors.placement.fit import LOST, by_node, lacks_capacity, lacks_free
from actorch._base.errors import PlacementError
from actorch._base.resources import GPUS

__all__ = ["GpuPool", "GpuShare", "candidate_ranks", "check_device", "place_on_gpus"]

T = TypeVar("T")


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

    def as_resources(self) -> dict[str, Any]:
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


def candidate_ranks(own: int, ranks: Iterable[int], on: int | None) -> list[int]:
    """The nodes a ``gpus=`` spawn may use, best first: ``on`` alone, else this node, then the others of ``ranks``."""
    if on is not None:
        return [on]
    return [own, *(rank for rank in sorted(ranks) if rank != own)]


async def place_on_gpus(
    what: str,
    gpus: int,
    ranks: list[int],
    share_of: Callable[[int], Awaitable[GpuShare | None]],
    spawn_there: Callable[[int], Awaitable[T]],
) -> T:
    """Spawn on the first of ``ranks`` with ``gpus`` free GPUs, or the next if they were taken meanwhile.

    Args:
        what: The spawn, as error messages name it (``spawn(Learner, gpus=2)``).
        gpus: How many free GPUs the node must have.
        ranks: The candidate nodes, best first (:func:`candidate_ranks`).
        share_of: Asks a node what it has (None: the node is lost).
        spawn_there: Spawns on a node, whose host lends it the GPUs or raises
            ``PlacementError`` if they are no longer free.

    Raises:
        PlacementError: No candidate has ``gpus`` free GPUs; the message says
            what each has free and who holds it, in the words of every placement.
    """
    shares = dict(zip(ranks, await asyncio.gather(*(share_of(rank) for rank in ranks)), strict=True))
    refusals: dict[int, str] = {}
    for rank in ranks:
        share = shares[rank]
        why = LOST if share is None else share.lacks(gpus)
        if why is not None:
            refusals[rank] = why
            continue
        try:
            return await spawn_there(rank)
        except PlacementError:
            fresh = await share_of(rank)
            why = LOST if fresh is None else fresh.lacks(gpus)
            if why is None:
                raise  # not the node's refusal for want of GPUs: the actor's own code raised it
            refusals[rank] = why
    raise PlacementError(f"{what}: no node fits; {by_node(refusals)}")
