"""The form a ``tensordict.TensorDict`` takes in a message: its layout in the bytes, its tensors on the side.

TorchRL's users hold their data in TensorDicts, so one travels natively: its
batch size, device, dimension names and lock go in the message's bytes, and
its entries after them, in order. It arrives on the device its tensors
arrived on: the one it was sent from, unless they were staged through host
memory or crossed a device map, as any tensor may be. Tensors among them take the codec's tensor
path (inlined if small, on torch RPC's own path if not; never pickled), a
nested TensorDict takes this same form, and a non-tensor entry
(``NonTensorData``) travels as its data, as any value does. Other kinds of
entry (lazy stacks, tensorclasses) go as any other value: pickled, or refused
by a strict codec.

``tensordict`` stays an optional dependency: recognising a TensorDict looks the
module up in ``sys.modules`` (a value cannot be a TensorDict unless its sender
imported it), and only a receiver that meets one imports it.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from actorch._base.errors import SerializationError

__all__ = ["is_tensordict", "layout", "rebuild"]

_AS_IS = 0  # a tensor, a nested TensorDict or another tensor collection: set as it arrives
_NON_TENSOR = 1  # a NonTensorData entry: its data
_MAX_DIMS = 255  # torch's own limit on a tensor's dimensions


def is_tensordict(value: Any) -> bool:
    """Whether ``value`` is a ``tensordict.TensorDict`` (that class exactly), without importing ``tensordict``."""
    module = sys.modules.get("tensordict")
    return module is not None and type(value) is getattr(module, "TensorDict", None)


def layout(tensordict: Any) -> list[Any]:
    """What rebuilds ``tensordict`` (an :func:`is_tensordict` value): its batch size, device, names, lock, entries.

    Each entry is ``[key, kind, value]``; the values are for the codec to
    encode (tensors on its tensor path).
    """
    from tensordict import NonTensorData  # noqa: PLC0415 - imported by whoever made the value

    device = tensordict.device
    names = list(tensordict.names)
    entries = [
        [key, _NON_TENSOR, value.data] if isinstance(value, NonTensorData) else [key, _AS_IS, value]
        for key, value in tensordict.items()
    ]
    return [
        list(tensordict.batch_size),
        None if device is None else str(device),
        None if all(name is None for name in names) else names,
        tensordict.is_locked,
        entries,
    ]


def rebuild(fields: Any) -> Any:
    """The TensorDict whose :func:`layout` arrived, with its tensors as they arrived.

    Raises:
        SerializationError: If ``tensordict`` is not installed here, or the
            layout is malformed (the bytes come from another process).
    """
    try:
        import tensordict  # noqa: PLC0415 - optional: imported only when a TensorDict arrives
    except ImportError:
        raise SerializationError(
            "a tensordict.TensorDict arrived, but the tensordict package is not installed in this process: "
            "pip install tensordict (TorchRL brings it)"
        ) from None
    try:
        batch_size, device, names, locked, entries = fields
        if not isinstance(batch_size, list) or len(batch_size) > _MAX_DIMS:
            raise TypeError(f"a batch size of {batch_size!r}")
        if not all(type(size) is int and size >= 0 for size in batch_size):  # TensorDict takes a negative one
            raise ValueError(f"a batch size of {batch_size}")
        if not (device is None or isinstance(device, str)) or not isinstance(entries, list):
            raise TypeError("a device or entries of the wrong type")
        rebuilt = tensordict.TensorDict(batch_size=batch_size, device=_arrival(device, entries), names=names)
        for key, kind, value in entries:
            if not isinstance(key, str):
                raise TypeError(f"a key of type {type(key).__name__}")
            if kind == _NON_TENSOR:
                rebuilt.set_non_tensor(key, value)
            elif kind == _AS_IS and (isinstance(value, torch.Tensor) or tensordict.is_tensor_collection(value)):
                rebuilt.set(key, value)
            else:
                raise TypeError(f"entry {key!r} of kind {kind!r} holding {type(value).__name__}")
        if locked is True:
            rebuilt.lock_()
    except Exception as exc:  # noqa: BLE001 - whatever tensordict raises on a malformed layout
        raise SerializationError(f"a TensorDict arrived malformed: {_describe(exc)}") from None
    return rebuilt


def _arrival(sent: str | None, entries: list[Any]) -> Any:
    """Where the TensorDict goes: where its tensors arrived (staged, or through a device map), else where it was.

    A TensorDict with a device holds every tensor on it, so they all take one
    way, and the first one tells where they landed.
    """
    if sent is None:
        return None
    for entry in entries:
        value = entry[2] if isinstance(entry, list) and len(entry) == 3 and entry[1] == _AS_IS else None
        device = value.device if isinstance(value, torch.Tensor) else getattr(value, "device", None)
        if isinstance(device, torch.device):
            return device
    return sent


def _describe(exc: Exception) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - a message that cannot be formatted still names its type
        return type(exc).__name__
