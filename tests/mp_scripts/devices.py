"""Tensors that torch RPC cannot carry (not on the CPU) are refused; the link stays up.

Usage: ``python devices.py``. A ``meta`` tensor stands for a GPU tensor: TensorPipe
refuses both without device maps.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from actors import attempt, emit

import actorch


class Holder(actorch.Actor):
    async def echo(self, value: Any) -> Any:
        return value

    async def off_cpu(self) -> torch.Tensor:
        return torch.empty(2, device="meta")

    async def ping(self) -> str:
        return "pong"


async def main(system: actorch.ActorSystem) -> None:
    holder = await system.spawn(Holder, on=1)
    off_cpu = torch.empty(3, device="meta")
    async with asyncio.timeout(20):
        argument = await attempt(holder.call(Holder.echo, off_cpu))
        result = await attempt(holder.call(Holder.off_cpu))
        try:
            holder.tell(Holder.echo, off_cpu)
        except actorch.SerializationError as exc:
            tell = str(exc)
        else:
            tell = "no error"
        still = await holder.call(Holder.ping)
        cpu_echo = await holder.call(Holder.echo, torch.ones(2))
    emit(
        "devices",
        argument=argument,
        result=result,
        tell=tell,
        still_serving=still,
        cpu_ok=cpu_echo.tolist(),
        lost=system.lost_nodes,
    )


if __name__ == "__main__":
    actorch.run(main, world_size=2)
