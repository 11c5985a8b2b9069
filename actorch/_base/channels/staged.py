"""The staged channel: a GPU tensor no direct path carries is copied to pinned host memory and sent from there.

The copy is queued without blocking, and the message waits once per device
for every copy it queued. For a node of this host the copy lands in a pinned
segment of shared memory, which the receiver maps (no socket in between);
elsewhere in pinned memory the transport sends by value (its pool of pinned
blocks is torch's, reused). On arrival the host copy goes to the receiving
actor's device (the CPU for an actor without one). Under ``devices="strict"``
the tensor is refused instead, naming where it sits in the value.
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
        if shm is not None and tensor.is_cuda and shm.reaches(route):
            try:
                reference = shm.staged(tensor, route.dest)
            except (RuntimeError, OSError):  # what the segment refused: the transport carries it
                reference = None
            if reference is not None:
                out.staged_on(tensor.device)
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
        """The host copy, moved to the receiving actor's device if it has one."""
        if isinstance(payload, list):
            if self._shm is None:
                raise SerializationError("a staged tensor arrived in shared memory, which this node does not use")
            host = self._shm.receive(payload, arrival)  # the segment is let go once the copy below is done
        else:
            host = side_tensor(payload, arrival)
        device = arrival.device
        return host if device is None or device.type == "cpu" else accelerator().to_device(host, device)

    def drop(self, payload: Any) -> None:
        """A message that carried ``payload`` was dropped unread: a segment it lent goes back."""
        if isinstance(payload, list) and self._shm is not None:
            self._shm.drop(payload)

    def statistics(self) -> dict[str, int]:
        """Tensors staged through a segment of this host's shared memory (the rest went by the transport)."""
        return {"through_shared_memory": self.through_shared_memory}
