"""The transport channel: a tensor by value on the transport's own tensor path (TensorPipe's sockets, for torch RPC).

The fallback every CPU tensor has: the transport sends it straight from its
storage. It is also the path of what no other channel takes: a tensor that
requires grad (distributed autograd records it there), a subclass of
``torch.Tensor``, and a tensor whose shared-memory pool is full.
"""

from __future__ import annotations

from typing import Any

import torch

from actorch._base.channels.base import Arrival, Channel, Outgoing
from actorch._base.channels.route import TensorRoute
from actorch._base.errors import SerializationError

__all__ = ["ByValueChannel", "put_aside", "side_tensor"]


def side_tensor(payload: Any, arrival: Arrival) -> torch.Tensor:
    """The tensor at index ``payload`` of the side list.

    Raises:
        SerializationError: There is none.
    """
    if not isinstance(payload, int) or not 0 <= payload < len(arrival.tensors):
        raise SerializationError(f"a message names tensor {payload!r} of {len(arrival.tensors)} that came with it")
    item = arrival.tensors[payload]
    if not isinstance(item, torch.Tensor):
        raise SerializationError(f"a message names side item {payload} as a tensor, but it is {type(item).__name__}")
    return item


def put_aside(tensor: torch.Tensor, out: Outgoing) -> int:
    """``tensor`` on the side list (a private copy if the sender may change its own at once); its index."""
    if tensor._is_zerotensor() or (not tensor.numel() and tensor.storage_offset()):
        # torch RPC aborts the sender on a tensor with no memory, the receiver on an offset past an empty storage.
        tensor = tensor.clone()
    return out.add(tensor.detach().clone() if out.copy else tensor)


class ByValueChannel(Channel):
    """CPU tensors by value on the transport's path (see the module's docstring)."""

    name = "transport"

    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether ``tensor`` is on the CPU."""
        return tensor.is_cpu

    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> int:
        """Its index on the side list."""
        return put_aside(tensor, out)

    def receive(self, payload: Any, arrival: Arrival) -> torch.Tensor:
        """The tensor the transport brought."""
        return side_tensor(payload, arrival)
