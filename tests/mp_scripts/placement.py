"""GPU placement between real processes: fake inventories met at the rendezvous, ``spawn(gpus=)`` across them.

Usage: ``python placement.py``. Every node installs a fake accelerator in
``setup``: node 1 has one pretend GPU, node 0 none. Two spawns asking for a GPU
at once both find node 1 free; its host lends the GPU to one and refuses the
other, which then finds no node left.
"""

from __future__ import annotations

import asyncio

from actors import attempt, emit
from fake_gpus import FakeAccelerator

import actorch
from actorch._base.devices import use_accelerator


def one_gpu_on_node_one(rank: int) -> None:
    """Node 1 has one pretend GPU, node 0 none."""
    use_accelerator(FakeAccelerator(("cuda:0",) if rank == 1 else ()))


class Learner(actorch.Actor):
    async def where(self) -> tuple[int, str]:
        return self.system.rank, str(self.device)


async def main(system: actorch.ActorSystem) -> None:
    async with asyncio.timeout(20):
        both = await asyncio.gather(
            attempt(system.spawn(Learner, gpus=1, name="learner/a")),
            attempt(system.spawn(Learner, gpus=1, name="learner/b")),
        )
        placed = [outcome["value"] for outcome in both if "value" in outcome]
        where = [await ref.call(Learner.where) for ref in placed]
        for ref in placed:
            await ref.stop()
        again = await system.spawn(Learner, gpus=1)
        where_again = await again.call(Learner.where)
    emit(
        "placement",
        devices=[list(node.devices) for node in system.nodes],
        refused=[outcome["error"] for outcome in both if "error" in outcome],
        where=where,
        where_again=where_again,
    )


if __name__ == "__main__":
    actorch.run(main, world_size=2, setup=one_gpu_on_node_one, transport=actorch.TorchRpc(device_maps=None))
