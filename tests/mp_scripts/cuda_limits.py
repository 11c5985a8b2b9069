"""What no path may do with a CUDA tensor: abort a process on an empty one, refuse a large one for its host bytes.

Usage: ``python cuda_limits.py CASE`` (two processes sharing ``cuda:0``), each
case in a process of its own, so that an abort in one cannot hide the others:

- ``empty-map``, ``empty-ipc``, ``empty-staged``: zero-element CUDA tensors
  (empty, a narrowed view past its storage's start, of several dtypes) through
  a device map, by CUDA IPC, and staged; TensorPipe's CUDA channel aborted the
  sending process on them before they travelled as metadata;
- ``large-1g``, ``large-4g``: 1 GiB and 4 GiB CUDA tensors with the defaults:
  device-to-device bytes do not count against ``max_message_size`` (1 GiB),
  which bounds host bytes.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import torch
from actors import emit

import actorch

CASE = sys.argv[1]
SETTINGS: dict[str, dict[str, Any]] = {
    "empty-map": {"transport": actorch.TorchRpc(device_maps="auto"), "channels": ("device_map",)},
    "empty-ipc": {"transport": actorch.TorchRpc(device_maps=None), "channels": ("cuda_ipc",)},
    "empty-staged": {"transport": actorch.TorchRpc(device_maps=None), "channels": ("staged",)},
    "large-1g": {},
    "large-4g": {},
}


class Receiver(actorch.Actor):
    async def describe(self, tensors: list[torch.Tensor]) -> list[Any]:
        return [[str(tensor.dtype), list(tensor.shape), str(tensor.device)] for tensor in tensors]

    async def checksum(self, tensor: torch.Tensor) -> list[Any]:
        return [str(tensor.device), list(tensor.shape), float(tensor[:: 1 << 20].float().sum())]


def empties() -> list[torch.Tensor]:
    wide = torch.zeros(4, 8, device="cuda:0")
    return [
        torch.empty(0, device="cuda:0"),
        torch.empty(3, 0, 2, dtype=torch.bfloat16, device="cuda:0"),
        wide.narrow(1, 5, 0),  # no elements, an offset into a storage that has some
        torch.empty(0, dtype=torch.float8_e4m3fn, device="cuda:0"),
        torch.empty(0, dtype=torch.int64, device="cuda:0"),
    ]


async def main(system: actorch.ActorSystem) -> None:
    receiver = await system.spawn(Receiver, on=1, device="cuda:0")
    async with asyncio.timeout(120):
        if CASE.startswith("empty"):
            sent = empties()
            arrived = await receiver.call(Receiver.describe, sent)
            back = await receiver.call(Receiver.describe, sent)  # and again: the node still serves
            emit(CASE, arrived=arrived, sent=[[str(t.dtype), list(t.shape), str(t.device)] for t in sent], back=back)
            return
        size = (1 if CASE == "large-1g" else 4) << 30
        tensor = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda:0")
        arrived = await receiver.call(Receiver.checksum, tensor)
        emit(CASE, arrived=arrived, expected=float(tensor[:: 1 << 20].float().sum()), elements=tensor.numel())


if __name__ == "__main__":
    actorch.run(main, world_size=2, **SETTINGS[CASE])
