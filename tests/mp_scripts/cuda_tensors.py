"""CUDA tensors between two processes that share ``cuda:0``: by CUDA IPC, a device map, or staged through the host.

Usage: ``python cuda_tensors.py MODE``:

- ``mapped``: ``TorchRpc(device_maps="auto")`` (``cuda:0`` to ``cuda:0``: both processes
  see the GPU), channels ``device_map`` and ``staged`` (no CUDA IPC);
- ``staged``: no maps, and the ``staged`` channel alone (by the transport);
- ``staged-shm``: no maps, channels ``shm`` and ``staged``: the host copy
  lands in a pinned segment of shared memory, which the receiver maps;
- ``ipc``: every channel (CUDA IPC first), with the maps of ``"auto"``, which
  say where a tensor lands;
- ``ipc-unmapped``: every channel, no maps: a tensor lands on the receiving
  actor's device, as a staged one does.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import torch
from actors import emit

import actorch

MODE = sys.argv[1]


class Keeper(actorch.Actor):
    def __init__(self) -> None:
        self.told: list[torch.Tensor] = []

    async def echo(self, value: Any) -> Any:
        return value

    async def where(self, value: torch.Tensor) -> str:
        return str(value.device)

    async def keep(self, value: torch.Tensor) -> None:
        self.told.append(value)

    async def kept(self) -> list[list[float]]:
        return [tensor.cpu().tolist() for tensor in self.told if tensor.numel() < 100]

    async def kept_sums(self) -> list[float]:
        return [float(tensor.double().sum()) for tensor in self.told if tensor.numel() >= 100]

    async def made_here(self) -> torch.Tensor:
        return torch.arange(3.0, device="cuda:0")


async def main(system: actorch.ActorSystem) -> None:
    on_cpu = await system.spawn(Keeper, on=1)
    on_gpu = await system.spawn(Keeper, on=1, device="cuda:0")
    tensor = torch.arange(4.0, device="cuda:0")
    async with asyncio.timeout(60):
        arrived_cpu_actor = await on_cpu.call(Keeper.where, tensor)
        arrived_gpu_actor = await on_gpu.call(Keeper.where, tensor)
        nested = await on_cpu.call(Keeper.echo, {"x": [tensor, torch.ones(1)]})
        result = await on_gpu.call(Keeper.made_here)
        for _ in range(20):  # each told tensor is mutated at once: what arrives is what was told
            on_cpu.tell(Keeper.keep, tensor)
            tensor.add_(1)
        kept = await on_cpu.call(Keeper.kept)
        big = torch.randn(3, 2_500_000, device="cuda:0")  # 30 MB: several chunks of a staged copy
        sent = [big, big[:, ::3], big.t(), big.to(torch.bfloat16)]
        back = await on_gpu.call(Keeper.echo, sent)
        big_bitwise = [torch.equal(there.cpu(), here.cpu()) for there, here in zip(back, sent, strict=True)]
        told_sums = []
        for _ in range(3):  # a large told tensor mutated at once, its chunks still copying
            told_sums.append(float(big.double().sum()))
            on_gpu.tell(Keeper.keep, big)
            big.mul_(-1.5)
        kept_sums = await on_gpu.call(Keeper.kept_sums)
    channels = system.statistics()["channels"]
    emit(
        MODE,
        channels={name: counts["tensors"] for name, counts in channels.items()},
        devices=[list(node.devices) for node in system.nodes],
        arrived_cpu_actor=arrived_cpu_actor,
        arrived_gpu_actor=arrived_gpu_actor,
        nested=[str(nested["x"][0].device), nested["x"][0].cpu().tolist(), str(nested["x"][1].device)],
        result=[str(result.device), result.cpu().tolist()],
        kept=kept,
        big_bitwise=big_bitwise,
        big_told=[told_sums, kept_sums],
    )


SETTINGS: dict[str, dict[str, Any]] = {
    "mapped": {"transport": actorch.TorchRpc(device_maps="auto"), "channels": ("device_map", "staged")},
    "staged": {"transport": actorch.TorchRpc(device_maps=None), "channels": ("staged",)},
    "staged-shm": {"transport": actorch.TorchRpc(device_maps=None), "channels": ("shm", "staged")},
    "ipc": {"transport": actorch.TorchRpc(device_maps="auto")},
    "ipc-unmapped": {"transport": actorch.TorchRpc(device_maps=None)},
}


if __name__ == "__main__":
    actorch.run(main, world_size=2, **SETTINGS[MODE])
