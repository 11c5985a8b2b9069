"""Devices: naming them, making one current for an actor, and staging tensors through host memory.

A tensor on an accelerator crosses nodes one of two ways. Where a device map
covers its device for the destination, torch RPC carries it directly (TensorPipe's
CUDA channels). Elsewhere it is *staged*: copied to pinned host memory (without
blocking, then synchronised once per message) and sent as a CPU tensor marked
as staged, which the receiver moves to the receiving actor's device, if it has
one; on one host, a CUDA IPC handle carries it. Which of these a tensor takes
is the data plane's choice (``channels``).

The device work itself goes through an :class:`Accelerator`; tests of the
staging logic on machines without a GPU install another with
:func:`use_accelerator`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import torch

from actorch._base.steps import stepwise

__all__ = [
    "Accelerator",
    "accelerator",
    "on_device",
    "parse_device",
    "use_accelerator",
]

T = TypeVar("T")

DeviceLike = str | int | torch.device


def parse_device(value: object, what: str = "device") -> torch.device:
    """``value`` (``"cuda:1"``, ``1``, a ``torch.device``) as a ``torch.device`` with an index for CUDA.

    Raises:
        ValueError: ``value`` names no device, or one other than the CPU or a CUDA device.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise ValueError(f"{what} must be a device such as 'cpu' or 'cuda:0', not {value!r}")
    try:
        device = torch.device("cuda", value) if isinstance(value, int) else torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{what} must be a device such as 'cpu' or 'cuda:0', not {value!r}: {exc}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"{what} must be the CPU or a CUDA device, not {device}")
    return torch.device("cuda", 0 if device.index is None else device.index)


class Accelerator:
    """The device work the runtime does: listing devices, making one current, copying to and from the host.

    This one drives CUDA through torch; it is the only one the runtime installs.
    """

    def inventory(self) -> tuple[str, ...]:
        """This process's accelerator devices (``("cuda:0", "cuda:1")``), empty without CUDA."""
        if not torch.cuda.is_available():
            return ()
        return tuple(f"cuda:{index}" for index in range(torch.cuda.device_count()))

    def make_current(self, device: torch.device) -> None:
        """Make ``device`` the thread's current device."""
        torch.cuda.set_device(device)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Start copying ``tensor`` into pinned host memory; valid after :meth:`synchronize` of its device."""
        host = torch.empty_like(tensor, device="cpu", pin_memory=torch.cuda.is_available())
        host.copy_(tensor, non_blocking=True)
        return host

    def synchronize(self, device: torch.device) -> None:
        """Wait until what was queued on ``device``'s current stream (copies to the host) has finished."""
        torch.cuda.current_stream(device).synchronize()

    def stages_in_chunks(self, tensor: torch.Tensor) -> bool:
        """Whether :meth:`copy_in_chunks` can copy ``tensor`` to the host (a CUDA tensor)."""
        return tensor.is_cuda

    def copy_in_chunks(self, tensor: torch.Tensor, target: torch.Tensor, strides: list[int], chunk: int) -> list[Any]:
        """Queue copies of ``tensor`` into the host bytes ``target``, laid out with ``strides``, ``chunk`` bytes each.

        The copies go on the tensor's device's current stream, in order; an
        event is recorded after each. Returns the events (each has
        ``synchronize()``), one per chunk.

        Raises:
            RuntimeError: CUDA refused a copy.
        """
        if tensor.is_conj() or tensor.is_neg():  # its memory holds the values before the flip
            tensor = tensor.resolve_conj().resolve_neg()
        if list(tensor.stride()) != strides:  # not one dense block: made one on the device first
            tensor = torch.empty_strided(tensor.shape, strides, dtype=tensor.dtype, device=tensor.device).copy_(tensor)
        extent = target.numel()
        source = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(
            tensor.untyped_storage(), tensor.storage_offset() * tensor.element_size(), (extent,), (1,)
        )
        stream = torch.cuda.current_stream(tensor.device)
        events: list[Any] = []
        for start in range(0, extent, chunk):
            end = min(start + chunk, extent)
            target[start:end].copy_(source[start:end], non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
            events.append(event)
        return events

    def to_device_in_chunks(
        self, host: torch.Tensor, raw: torch.Tensor, device: torch.device, chunk: int, ready: Callable[[int], None]
    ) -> torch.Tensor:
        """``host`` (a tensor over the host bytes ``raw``) copied to ``device`` chunk by chunk, each once ``ready``.

        ``ready(i)`` returns once chunk ``i`` of ``raw`` may be read; the copy
        of each is queued then, so the copies overlap the chunks still landing.
        Returns once every copy is done (``raw`` may be let go).
        """
        extent = raw.numel()
        out = torch.empty(extent, dtype=torch.uint8, device=device)
        for index, start in enumerate(range(0, extent, chunk)):
            ready(index)
            end = min(start + chunk, extent)
            out[start:end].copy_(raw[start:end], non_blocking=True)
        torch.cuda.current_stream(device).synchronize()
        return out.view(host.dtype).as_strided(host.shape, host.stride(), 0)

    def wait_landed(self, received: Iterable[Any]) -> None:
        """Wait until the CUDA tensors among ``received`` have landed on the current streams of this thread.

        torch RPC receives tensors through a device map on streams of its own,
        current while its thread runs; the event loop's thread would read them
        on its own streams, unordered with those copies.
        """
        devices = {item.device for item in received if isinstance(item, torch.Tensor) and item.device.type == "cuda"}
        for device in devices:
            torch.cuda.current_stream(device).synchronize()

    def to_device(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``tensor`` (on the host) copied to ``device``."""
        return tensor.to(device)


_accelerator = Accelerator()


def accelerator() -> Accelerator:
    """The accelerator the runtime uses."""
    return _accelerator


def use_accelerator(replacement: Accelerator) -> Accelerator:
    """Install ``replacement`` as the runtime's accelerator (tests of the staging logic); return the previous one."""
    global _accelerator
    previous, _accelerator = _accelerator, replacement
    return previous


def on_device(awaitable: Awaitable[T], device: torch.device | None) -> Awaitable[T]:
    """``awaitable`` with ``device`` current during each of its steps; unchanged for the CPU or None.

    Other actors of the node may make another device current while it waits.
    """
    if device is None or device.type == "cpu":
        return awaitable
    return stepwise(awaitable, lambda: _accelerator.make_current(device))
