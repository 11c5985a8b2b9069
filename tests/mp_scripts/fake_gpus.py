"""A pretend accelerator for tests of device logic on machines without a GPU.

It lists the devices it is given, records the devices made current and the
devices synchronised, stages a tensor as a host copy full of 7s, and "moves" a
host tensor to a device by adding 100, so a test sees which path a tensor took.
``meta`` tensors stand for GPU tensors: they are off the CPU and no map covers them.

Its chunked copies into shared memory land on a thread of their own, one
chunk at a time, each after ``delay`` seconds and only once ``gate`` is set
(tests hold it clear to see a receiver wait); ``fail_at`` makes that chunk's
event raise, as a CUDA error would.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from actorch._base.devices import Accelerator, use_accelerator

STAGED = 7.0
"""Every element of a staged host copy."""
MOVED = 100.0
"""What a move to a device adds."""


class FakeAccelerator(Accelerator):
    """Pretend GPUs (see the module's docstring)."""

    def __init__(self, devices: tuple[str, ...] = ("cuda:0", "cuda:1")) -> None:
        self.devices = devices
        self.made_current: list[str] = []
        self.synced: list[str] = []
        self.staged = 0
        self.gate = threading.Event()
        self.gate.set()
        self.delay = 0.0
        self.fail_at: int | None = None
        self.chunks_landed = 0
        self.chunks_read: list[int] = []

    def inventory(self) -> tuple[str, ...]:
        return self.devices

    def make_current(self, device: torch.device) -> None:
        self.made_current.append(str(device))

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        self.staged += 1
        return torch.full(tensor.shape, STAGED)

    def synchronize(self, device: torch.device) -> None:
        self.synced.append(str(device))

    def to_device(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        return tensor + MOVED

    def stages_in_chunks(self, tensor: torch.Tensor) -> bool:
        return True

    def copy_in_chunks(self, tensor: torch.Tensor, target: torch.Tensor, strides: list[int], chunk: int) -> list[Any]:
        self.staged += 1
        pattern = torch.full((target.numel() // tensor.element_size(),), STAGED, dtype=tensor.dtype).view(torch.uint8)
        events = [_Copy() for _ in range(0, target.numel(), chunk)]
        threading.Thread(target=self._land, args=(pattern, target, chunk, events), daemon=True).start()
        return events

    def _land(self, pattern: torch.Tensor, target: torch.Tensor, chunk: int, events: list[_Copy]) -> None:
        for index, event in enumerate(events):
            self.gate.wait()
            time.sleep(self.delay)
            start = index * chunk
            target[start : start + chunk].copy_(pattern[start : start + chunk])
            event.failed = index == self.fail_at
            self.chunks_landed += 1
            event.done.set()

    def to_device_in_chunks(
        self, host: torch.Tensor, raw: torch.Tensor, device: torch.device, chunk: int, ready: Callable[[int], None]
    ) -> torch.Tensor:
        for index in range(-(-raw.numel() // chunk)):
            ready(index)
            self.chunks_read.append(index)
        return host + MOVED


class _Copy:
    """A pretend CUDA event after one chunk's copy."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.failed = False

    def synchronize(self) -> None:
        self.done.wait()
        if self.failed:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (pretend)")


@contextlib.contextmanager
def installed(fake: FakeAccelerator) -> Iterator[FakeAccelerator]:
    """``fake`` as the runtime's accelerator for the block; the previous one afterwards."""
    previous = use_accelerator(fake)
    try:
        yield fake
    finally:
        use_accelerator(previous)


def pretend_gpus(rank: int) -> None:
    """A ``run(setup=...)`` hook: every node of the world gets two pretend GPUs."""
    use_accelerator(FakeAccelerator())
