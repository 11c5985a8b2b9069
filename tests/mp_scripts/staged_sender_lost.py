"""A node dies with a staged copy half landed: its receiver refuses the tensor at once and keeps serving.

Usage: ``python staged_sender_lost.py`` (three processes on one host, each
with the pretend GPUs of ``fake_gpus``). Rank 1's copies into shared memory
never land (its fake accelerator's gate stays shut), as a GPU's would not
once its process is killed. Its actor tells a tensor staged that way to a
keeper on rank 0, then kills its own process with SIGKILL. Rank 0's keeper
must refuse the tensor as soon as it sees the sender gone (not after the
stall bound), and the node must go on serving. The script reports how long
rank 0 took to serve again after the tell, what the keeper kept, and whether
node 1 was counted lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import torch
from actors import emit, wait_lost
from fake_gpus import FakeAccelerator

import actorch
from actorch._base.channels import landing
from actorch._base.devices import use_accelerator


class Keeper(actorch.Actor):
    def __init__(self) -> None:
        self.kept = 0

    async def keep(self, tensor: torch.Tensor) -> None:
        self.kept += 1

    async def count(self) -> int:
        return self.kept


class Sender(actorch.Actor):
    async def send_and_die(self, keeper: actorch.ActorRef[Keeper]) -> None:
        keeper.tell(Keeper.keep, torch.empty(1_500_000, device="meta"))  # 6 MB: two chunks, never landing
        await asyncio.sleep(0.3)  # the tell is on the wire
        os.kill(os.getpid(), signal.SIGKILL)


def setup(rank: int) -> None:
    fake = FakeAccelerator()
    if rank == 1:
        fake.gate.clear()  # its copies never land
    use_accelerator(fake)


async def main(system: actorch.ActorSystem) -> None:
    keeper = await system.spawn(Keeper, on=0, device="cuda:0")
    sender = await system.spawn(Sender, on=1)
    started = time.monotonic()
    sender.tell(Sender.send_and_die, keeper)
    async with asyncio.timeout(30):
        await wait_lost(system, 1)
    kept = await keeper.call(Keeper.count)
    emit(
        "sender-lost",
        seconds=time.monotonic() - started,
        kept=kept,
        stall=landing.STALL,
    )


if __name__ == "__main__":
    actorch.run(main, world_size=3, setup=setup, transport=actorch.TorchRpc(device_maps=None), stop_grace=1.0)
    print("RETURNED " + json.dumps("returned"), flush=True)
