"""The metadata channel: a tensor with no elements travels as its dtype, shape and strides, and is made on arrival.

There is nothing to copy, and not every path can carry nothing: TensorPipe's
CUDA channel aborts the sending process on a tensor of no elements (it asks
the driver about a null pointer). A CPU tensor that requires grad keeps the
transport's path, where distributed autograd can record it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actorch._base.channels.base import Arrival, Channel, Outgoing
from actorch._base.channels.route import TensorRoute
from actorch._base.errors import SerializationError

__all__ = ["EmptyChannel", "dtype_named", "name_of"]

_DTYPES: dict[str, torch.dtype] = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
_MAX_RANK = 64


def name_of(dtype: torch.dtype) -> str:
    """``dtype``'s name in torch (``"float32"``), which :func:`dtype_named` reads back."""
    return str(dtype).removeprefix("torch.")


def dtype_named(name: Any) -> torch.dtype:
    """The dtype :func:`name_of` named.

    Raises:
        SerializationError: ``name`` names no dtype.
    """
    dtype = _DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise SerializationError(f"a tensor arrived with an unknown dtype {name!r}")
    return dtype


def checked_shape(shape: Any, strides: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` and ``strides`` as tuples of ints, checked to be as many and non-negative.

    Raises:
        SerializationError: They are not.
    """
    if (
        not isinstance(shape, list)
        or not isinstance(strides, list)
        or len(shape) != len(strides)
        or len(shape) > _MAX_RANK
        or not all(isinstance(size, int) and size >= 0 for size in shape)
        or not all(isinstance(stride, int) and stride >= 0 for stride in strides)
    ):
        raise SerializationError(f"a tensor arrived with a malformed shape {shape!r} or strides {strides!r}")
    return tuple(shape), tuple(strides)


class EmptyChannel(Channel):
    """Tensors of no elements, on any device, as metadata (see the module's docstring)."""

    name = "metadata"
    apart = False

    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether ``tensor`` has no elements (and, on the CPU, needs no autograd)."""
        return tensor.numel() == 0 and not (tensor.is_cpu and tensor.requires_grad)

    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> list[Any]:
        """Dtype, shape, strides, the device it lands on (None: the receiver's), and whether it requires grad.

        A CPU tensor lands on the CPU, one on a mapped device where the map
        says, any other where a staged one would: on the receiving actor's device.
        """
        device = tensor.device
        target = "cpu" if device.type == "cpu" else route.direct.get(str(device))
        return [name_of(tensor.dtype), list(tensor.shape), list(tensor.stride()), target, tensor.requires_grad]

    def receive(self, payload: Any, arrival: Arrival) -> torch.Tensor:
        """An empty tensor of that dtype, shape and strides, on its device."""
        try:
            dtype_name, shape, strides, target, requires_grad = payload
        except (TypeError, ValueError):
            raise SerializationError("an empty tensor arrived with malformed metadata") from None
        dtype = dtype_named(dtype_name)
        sizes, steps = checked_shape(shape, strides)
        if math.prod(sizes) != 0:
            raise SerializationError(f"an empty tensor arrived with a shape {sizes} that holds elements")
        try:
            device = torch.device(target) if target is not None else (arrival.device or torch.device("cpu"))
            made = torch.empty_strided(sizes, steps, dtype=dtype, device=device)
            grads = requires_grad is True and (made.is_floating_point() or made.is_complex())
            return made.requires_grad_(True) if grads else made
        except (RuntimeError, TypeError, ValueError) as exc:
            raise SerializationError(
                f"an empty tensor could not be made on {target or arrival.device}: {exc}"
            ) from None
