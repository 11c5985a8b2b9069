"""The staged channel: a GPU tensor no direct path carries is copied to pinned host memory and sent from there.

For a node of this host the copy goes to a pinned segment of shared memory
from the pool (reused), which the receiver maps: no socket in between. The
sender waits for the work already queued on the tensor's device, queues the
copy in chunks and sends the message at once; each chunk is marked in the
segment as it lands, and the receiver copies it to its device (from its own
pinned mapping) as soon as it is there (``landing``), so the two copies and
the message's trip overlap. Elsewhere the copy goes to pinned memory that the
transport sends by value (torch's pool of pinned blocks, reused): the message
waits once per device for every copy it queued, since the transport reads
the whole buffer when it sends. On arrival the host copy goes to the
receiving actor's device (the CPU for an actor without one). Under
``devices="strict"`` the tensor is refused instead, naming where it sits in
the value.
"""

from __future__ import annotations

from typing import Any

import torch

from actorch._base.channels.base import Arrival, Channel, Outgoing
from actorch._base.channels.by_value import side_tensor
from actorch._base.channels.route import TensorRoute
from actorch._base.channels.shm import SharedMemoryChannel
from actorch._base.devices import accelerator
from actorch._base.errors import SerializationError

__all__ = ["StagedChannel"]


class StagedChannel(Channel):
    """GPU tensors through host memory (see the module's docstring)."""

    name = "staged"

    def __init__(self, shm: SharedMemoryChannel | None = None, *, strict: bool = False) -> None:
        self._shm = shm
        self._strict = strict  # devices="strict": refuse rather than stage
        self.through_shared_memory = 0

    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether ``tensor`` is off the CPU (a meta tensor too: staging it fails, naming it)."""
        return not tensor.is_cpu

    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> int | list[Any]:
        """Where its host copy is (a segment of this host, or the side list), valid once its device is synchronised.

        Raises:
            SerializationError: ``devices="strict"``, or the tensor cannot be copied to the host.
        """
        if self._strict:
            raise SerializationError(f"{out.where(tensor)}: {route.refusal(tensor)}")
        shm = self._shm
        if shm is not None and shm.reaches(route) and accelerator().stages_in_chunks(tensor):
            out.settle(tensor.device)  # the receiver then waits for the copy alone, not for the sender's work
            try:
                reference = shm.staged(tensor, route.dest)
            except (RuntimeError, OSError):  # what the segment refused: the transport carries it
                reference = None
            if reference is not None:
                self.through_shared_memory += 1
                return reference
        try:
            host = accelerator().to_host(tensor.detach())
        except (RuntimeError, NotImplementedError) as exc:
            raise SerializationError(
                f"{out.where(tensor)}: a tensor on {tensor.device} cannot be staged: {exc}"
            ) from exc
        out.staged_on(tensor.device)
        return out.add(host)

    def receive(self, payload: Any, arrival: Arrival) -> torch.Tensor:
        """The host copy, moved to the receiving actor's device if it has one.

        Raises:
            SerializationError: The payload is malformed, or its copy out of the sender's GPU failed or stalled.
        """
        device = arrival.device
        if device is not None and device.type == "cpu":
            device = None
        if not isinstance(payload, list):
            host = side_tensor(payload, arrival)
            return host if device is None else accelerator().to_device(host, device)
        if self._shm is None:
            raise SerializationError("a staged tensor arrived in shared memory, which this node does not use")
        host, raw, landing, chunk = self._shm.arriving(payload, pin=device is not None)
        if device is None:  # it stays over the segment, as a CPU tensor sent by reference does
            landing.wait_all()
            return host
        return accelerator().to_device_in_chunks(host, raw, device, chunk, landing.wait)  # then the lend is let go

    def drop(self, payload: Any) -> None:
        """A message that carried ``payload`` was dropped unread: a segment it lent goes back."""
        if isinstance(payload, list) and payload and self._shm is not None:
            self._shm.drop(payload[0])

    def statistics(self) -> dict[str, int]:
        """Tensors staged through a segment of this host's shared memory (the rest went by the transport)."""
        return {"through_shared_memory": self.through_shared_memory}
