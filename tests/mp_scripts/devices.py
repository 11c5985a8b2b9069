"""Tensors off the CPU between real processes: refused under ``devices="strict"``, staged otherwise.

Usage: ``python devices.py strict|staged|both``. A ``meta`` tensor stands for a
GPU tensor: it is off the CPU and no device map covers it. ``both`` runs
``strict``, then ``staged`` as a second world of the same process (in that
order: ``staged`` installs the fake accelerator in rank 0's process too).

- ``strict``: the real accelerator (no GPU here); every send of a meta tensor
  is refused where it is made, naming its path, and the link stays up.
- ``staged``: every node installs the fake accelerator of ``fake_gpus`` in
  ``setup`` (two pretend GPUs; host copies full of 7s; a move to a device
  adds 100), so the whole
  staging path runs between processes: the sender stages, the receiver moves
  the tensor to the receiving actor's device.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import torch
from actors import attempt, attempt_now, emit
from fake_gpus import pretend_gpus

import actorch

MODE = sys.argv[1]


class Holder(actorch.Actor):
    async def echo(self, value: Any) -> Any:
        return value

    async def off_cpu(self) -> torch.Tensor:
        return torch.empty(2, device="meta")

    async def where(self) -> str:
        return str(self.device)

    async def ping(self) -> str:
        return "pong"


class Asker(actorch.Actor):
    async def ask(self, holder: actorch.ActorRef[Holder]) -> Any:
        return await holder.call(Holder.off_cpu)


async def strict(system: actorch.ActorSystem) -> None:
    holder = await system.spawn(Holder, on=1)
    off_cpu = torch.empty(3, device="meta")
    async with asyncio.timeout(20):
        argument = await attempt(holder.call(Holder.echo, {"obs": [off_cpu]}))
        result = await attempt(holder.call(Holder.off_cpu))
        tell = attempt_now(lambda: holder.tell(Holder.echo, off_cpu))
        on_missing_gpu = await attempt(system.spawn(Holder, on=1, device="cuda:0"))
        still = await holder.call(Holder.ping)
        cpu_echo = await holder.call(Holder.echo, torch.ones(2))
    emit(
        "strict",
        argument=argument,
        result=result,
        tell=tell,
        on_missing_gpu=on_missing_gpu,
        devices=[list(node.devices) for node in system.nodes],
        still_serving=still,
        cpu_ok=cpu_echo.tolist(),
        lost=system.lost_nodes,
    )


async def staged(system: actorch.ActorSystem) -> None:
    on_gpu = await system.spawn(Holder, on=1, device="cuda:1")
    on_cpu = await system.spawn(Holder, on=1)
    asker = await system.spawn(Asker, device="cuda:0")
    async with asyncio.timeout(20):
        to_gpu_actor = await on_gpu.call(Holder.echo, [torch.empty(2, device="meta"), torch.ones(1)])
        to_cpu_actor = await on_cpu.call(Holder.echo, torch.empty(2, device="meta"))
        result_to_main = await on_gpu.call(Holder.off_cpu)
        result_to_gpu_actor = await asker.call(Asker.ask, on_gpu)
        where = await on_gpu.call(Holder.where)
        big = await on_gpu.call(Holder.echo, torch.empty(1_500_000, device="meta"))  # 6 MB: two chunks
    staged_counts = system.statistics()["channels"]["staged"]
    emit(
        "staged",
        big=[big.numel(), torch.unique(big).tolist()],
        through_shared_memory=staged_counts.get("through_shared_memory"),
        to_gpu_actor=[tensor.tolist() for tensor in to_gpu_actor],
        to_cpu_actor=to_cpu_actor.tolist(),
        result_to_main=result_to_main.tolist(),
        result_to_gpu_actor=result_to_gpu_actor.tolist(),
        where=where,
        devices=[list(node.devices) for node in system.nodes],
    )


if __name__ == "__main__":
    if MODE in ("strict", "both"):
        actorch.run(strict, world_size=2, devices="strict")
    if MODE in ("staged", "both"):
        actorch.run(staged, world_size=2, setup=pretend_gpus, transport=actorch.TorchRpc(device_maps=None))
