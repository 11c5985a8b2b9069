"""The inline channel: a small plain CPU tensor rides inside the message's bytes (dtype, shape, data)."""

from __future__ import annotations

import torch

from actorch._base.channels.base import Arrival, Channel, Outgoing
from actorch._base.channels.route import TensorRoute
from actorch._base.tensorforms import from_inline, inlinable, inline

__all__ = ["InlineChannel"]


class InlineChannel(Channel):
    """Small CPU tensors inside the message: a tensor apart costs far more than copying a few kilobytes.

    Each tensor the transport carries apart costs about 80 us of CPU at either
    end; an observation or an action is a few bytes (``INLINE_TENSOR_BYTES``).
    """

    name = "inline"
    apart = False
    packed = False

    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether ``tensor`` is a small plain CPU tensor of class ``torch.Tensor`` that needs no autograd."""
        return tensor.is_cpu and type(tensor) is torch.Tensor and inlinable(tensor)

    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> bytes:
        """Its dtype code, shape and data, read now: a copy, whatever the sender does next."""
        return inline(tensor)

    def receive(self, payload: bytes, arrival: Arrival) -> torch.Tensor:
        """The tensor, in fresh memory of its own."""
        return from_inline(payload)
