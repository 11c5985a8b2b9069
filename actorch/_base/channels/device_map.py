"""The device-map channel: a CUDA tensor whose device a map covers goes on the transport's CUDA path (TensorPipe's).

It lands on the device the map names. The transport waits, on the thread
that hands the message to the event loop, until such tensors have landed.
"""

from __future__ import annotations

from typing import Any

import torch

from actorch._base.channels.base import Arrival, Channel, Outgoing
from actorch._base.channels.by_value import put_aside, side_tensor
from actorch._base.channels.route import TensorRoute

__all__ = ["DeviceMapChannel"]


class DeviceMapChannel(Channel):
    """GPU tensors on a device map (see the module's docstring)."""

    name = "device_map"

    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether a map toward ``route.dest`` covers ``tensor``'s device."""
        return not tensor.is_cpu and str(tensor.device) in route.direct

    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> int:
        """Its index on the side list."""
        return put_aside(tensor, out)

    def receive(self, payload: Any, arrival: Arrival) -> torch.Tensor:
        """The tensor the transport brought, on the mapped device."""
        return side_tensor(payload, arrival)
