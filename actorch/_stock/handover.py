"""Handing a collector's batches to a learner on the same host by reference: leases of shared memory, reused.

A batch of pixels is megabytes. Sent as tensors it is copied on its way (the
stream keeps a private copy for its sender, the transport copies it into the
receiver) and costs both ends a millisecond of CPU per megabyte. When the
learner is another process, the collector writes each batch's observations
straight into an :func:`actorch.lease` (shared memory of its own process),
one of a few it reuses, and sends the batch as any other: on the learner's
host the lease goes by reference, and the learner's batch holds the very
bytes the environments wrote, with no copy on their way; elsewhere it goes by
value. A lease is written again only once the learner has let go of the
batch that used it (:attr:`actorch.Lease.in_use`); when every lease is still
held, or shared memory has no room, the batch is made in private memory and
goes by value.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch

from actorch._base.channels.leases import Lease, lease

__all__ = ["Handover", "Slots", "usable"]


class Handover(NamedTuple):
    """What a reader asks of a collector so that batches come by reference: who it is, and how many it may hold.

    Attributes:
        pid: The reader's process: a collector in the same process hands over its batches as they are.
        slots: How many leases the collector keeps (the batches the reader may hold unread, plus one).
    """

    pid: int
    slots: int


def usable(handover: Any) -> Handover | None:
    """``handover`` as sent by a reader, if batches can go to it through leases (another process)."""
    if handover is None:
        return None
    asked = Handover(*handover)
    if asked.pid == os.getpid() or asked.slots < 1:
        return None
    return asked


class Slots:
    """A collector's leases, each holding a batch's observations and next observations, reused once let go."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._leases: list[Lease] = []
        self.refusal: str | None = None
        """Why the last lease asked for was not shared memory (``/dev/shm`` full, the pool at its limit)."""
        self.busy = 0
        """Times every lease was still held by the reader (the batch went by value)."""

    def __repr__(self) -> str:
        held = sum(kept.in_use for kept in self._leases)
        return f"<Slots {len(self._leases)} of {self.count} leased, {held} held by the reader>"

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """Room for ``[2, *shape]`` of ``dtype`` in a free lease; None: by value (every lease held, or no room)."""
        wanted = (2, *shape)
        for kept in self._leases:
            if not kept.in_use and kept.tensor.shape == wanted and kept.tensor.dtype == dtype:
                return kept.tensor
        if len(self._leases) >= self.count:
            spare = next((kept for kept in self._leases if not kept.in_use), None)
            if spare is None:
                self.busy += 1
                return None
            self._leases.remove(spare)  # another shape: make it anew
            spare.close()
        made = lease(wanted, dtype)
        if not made.shared:
            self.refusal = made.refusal
            made.close()
            return None
        self._leases.append(made)
        return made.tensor

    def close(self) -> None:
        """Give every lease back."""
        for held in self._leases:
            held.close()
        self._leases.clear()
