"""Moving the stock actors' tensors between devices: copies queued without blocking, one wait per source GPU.

The stock actors keep their state on their own device (``self.device``) and
deliver tensors where a caller asks. A collection of tensors (a state dict, a
replay sample) moves here as one transfer: every copy is queued first, and a
copy out of a GPU lands in pinned host memory, so the only wait is one
stream synchronisation per GPU the tensors came from, not one per tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import torch

__all__ = ["as_device", "to_device"]

K = TypeVar("K")

DeviceLike = str | torch.device


def as_device(value: DeviceLike, what: str = "device") -> torch.device:
    """``value`` (``"cpu"``, ``"cuda:1"``, a ``torch.device``) as a ``torch.device``; ``"cuda"`` means ``cuda:0``.

    Devices are named as ``spawn(device=...)`` names them, so ``"cuda"``
    compares equal to the ``cuda:0`` of a tensor's ``.device``.

    Raises:
        ValueError: ``value`` names no device.
    """
    if not isinstance(value, (str, torch.device)):
        raise ValueError(f"{what} must be a device such as 'cpu' or 'cuda:0', not {value!r}")
    try:
        device = torch.device(value)
    except RuntimeError as exc:
        raise ValueError(f"{what} must be a device such as 'cpu' or 'cuda:0', not {value!r}: {exc}") from None
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", 0)
    return device


def to_device(tensors: Mapping[K, torch.Tensor], device: torch.device) -> dict[K, torch.Tensor]:
    """``tensors`` on ``device``: those already there as they are, the others copied in one transfer.

    Copies to a GPU are queued on its current stream, where later work on it
    is ordered after them. Copies from a GPU to the host go into pinned memory
    without blocking, then one synchronisation per source GPU makes them all
    readable at once.
    """
    moved: dict[K, torch.Tensor] = {}
    sources: set[torch.device] = set()
    for key, tensor in tensors.items():
        if tensor.device == device:
            moved[key] = tensor
        elif device.type == "cpu" and tensor.device.type == "cuda":
            host = torch.empty_like(tensor, device="cpu", pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            moved[key] = host
            sources.add(tensor.device)
        else:
            moved[key] = tensor.to(device, non_blocking=device.type == "cuda")
    for source in sources:
        torch.cuda.current_stream(source).synchronize()
    return moved
