"""How tensors leave for one destination node: its device maps, and what its channels reach."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

__all__ = ["TensorRoute"]

_NOTHING: Mapping[str, str] = MappingProxyType({})


class TensorRoute:
    """How tensors leave for one destination node; the transport makes one per peer it meets.

    Attributes:
        dest: The destination's rank.
        direct: The device maps toward ``dest``: each CUDA device (``"cuda:0"``)
            a map carries directly, with the device it lands on there.
        reach: What the destination's channels said of where they reach (its
            host's shared memory, its GPUs), to compare with this node's own
            (see ``channels.reach``).
    """

    __slots__ = ("dest", "direct", "reach")

    def __init__(self, dest: int, direct: Mapping[str, str] = _NOTHING, *, reach: Mapping[str, str] = _NOTHING) -> None:
        self.dest = dest
        self.direct = direct
        self.reach = reach

    def __repr__(self) -> str:
        return f"<TensorRoute to node {self.dest} direct={dict(self.direct)}>"

    def refusal(self, tensor: torch.Tensor) -> str:
        """Why ``tensor`` cannot go to ``dest`` under ``devices="strict"``."""
        device = str(tensor.device)
        mapped = ", ".join(sorted(self.direct)) or "none"
        return (
            f"a tensor on {device} cannot go to node {self.dest}: no device map covers {device} for that node "
            f"(devices mapped there: {mapped}), no CUDA IPC reaches it, and devices='strict' refuses to stage it "
            "through host memory; add it to TorchRpc(device_maps=...), or move it to the CPU first"
        )
