"""A pretend accelerator for tests of device logic on machines without a GPU.

It lists the devices it is given, records the devices made current and the
devices synchronised, stages a tensor as a host copy full of 7s, and "moves" a
host tensor to a device by adding 100, so a test sees which path a tensor took.
``meta`` tensors stand for GPU tensors: they are off the CPU and no map covers them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
