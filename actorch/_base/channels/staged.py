"""The staged channel: a GPU tensor no direct path carries is copied to pinned host memory and sent from there.

The copy is queued without blocking, and the message waits once per device
for every copy it queued. On arrival the host copy goes to the receiving
actor's device (the CPU for an actor without one). Under ``devices="strict"``
the tensor is refused instead, naming where it sits in the value.
"""

from __future__ import annotations

from typing import Any

import torch

from actorch._base.channels.base import Arrival, Channel, Outgoing
from actorch._base.channels.by_value import side_tensor
from actorch._base.channels.route import TensorRoute
from actorch._base.devices import accelerator
from actorch._base.errors import SerializationError

__all__ = ["StagedChannel"]


class StagedChannel(Channel):
    """GPU tensors through host memory (see the module's docstring)."""

    name = "staged"

    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether ``tensor`` is off the CPU (a meta tensor too: staging it fails, naming it)."""
        return not tensor.is_cpu

    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> int:
        """The index of its host copy on the side list, valid once its device is synchronised.

        Raises:
            SerializationError: ``devices="strict"``, or the tensor cannot be copied to the host.
        """
        if route.strict:
            raise SerializationError(f"{out.where(tensor)}: {route.refusal(tensor)}")
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
        host = side_tensor(payload, arrival)
        device = arrival.device
        return host if device is None or device.type == "cpu" else accelerator().to_device(host, device)
