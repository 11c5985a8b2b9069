"""Distributed autograd and DistributedOptimizer against a parameter server's RRefs.

Run it with ``python examples/dist_autograd.py`` (needs scikit-learn:
``pip install -e '.[examples]'``). This is the pattern of PyTorch's RPC
parameter-server tutorial: the model lives on the server (rank 1); trainers on
ranks 1 and 2 run its forward pass there through an RRef, inside a distributed
autograd context, so ``dist_autograd.backward`` sends the gradients back to the
server's parameters and a ``DistributedOptimizer`` updates them where they live.
actorch finds the server by name and hands out the RRefs; torch's own
distributed tools do the rest.

torch 2.13's DistributedOptimizer prints a DeprecationWarning about TorchScript
once per trainer on the server's node; torch forces it past warning filters.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
from parameter_server import digits, make_model  # the same model and data as that example
from torch import nn
from torch.distributed.optim import DistributedOptimizer

import actorch


class Trainer(actorch.Actor):
    """Trains the server's model in place through distributed autograd."""

    def __init__(self, index: int, trainers: int, batch_size: int = 32) -> None:
        x, y = digits("train")
        self.x, self.y = x[index::trainers], y[index::trainers]
        self.batch_size = batch_size
        self.model_rref: Any = None
        self.optimizer: DistributedOptimizer | None = None

    async def connect(self, server_name: str, lr: float) -> None:
        """Look the server up and build a DistributedOptimizer over its parameter RRefs."""
        server = await self.system.lookup(server_name)
        self.model_rref = await server.call(actorch.ParameterServer.module_rref)
        rrefs = await server.call(actorch.ParameterServer.parameter_rrefs)
        # DistributedOptimizer blocks on torch RPC: build it off the event loop.
        self.optimizer = await asyncio.to_thread(DistributedOptimizer, torch.optim.SGD, rrefs, lr=lr)

    async def train_epoch(self) -> float:
        """One pass over this trainer's data; returns the mean loss."""
        # Each step blocks on torch RPC; a worker thread keeps the event loop free.
        # The distributed autograd context is per thread, so a whole step runs there.
        return await asyncio.to_thread(self._epoch)

    def _epoch(self) -> float:
        assert self.optimizer is not None
        losses = []
        for start in range(0, len(self.y), self.batch_size):
            x, y = self.x[start : start + self.batch_size], self.y[start : start + self.batch_size]
            with dist_autograd.context() as context_id:
                logits = self.model_rref.rpc_sync().forward(x)  # runs on the server, recorded
                loss = nn.functional.cross_entropy(logits, y)
                dist_autograd.backward(context_id, [loss])  # gradients land on the server
                self.optimizer.step(context_id)  # the server's parameters change there
            losses.append(loss.item())
        return sum(losses) / len(losses)


async def main(system: actorch.ActorSystem) -> None:
    args = parser().parse_args()
    server = await system.spawn(actorch.ParameterServer, args=(make_model,), name="ps", on=1)
    trainers = [
        await system.spawn(Trainer, args=(i, args.trainers), on=1 + i % (system.world_size - 1))
        for i in range(args.trainers)
    ]
    await asyncio.gather(*(t.call(Trainer.connect, "ps", args.lr) for t in trainers))
    x, y = digits("test")
    model = make_model()
    print(f"{args.trainers} trainers, model on rank 1; chance is 10 %")
    for epoch in range(1, args.epochs + 1):
        started = time.perf_counter()
        losses = await asyncio.gather(*(t.call(Trainer.train_epoch) for t in trainers))
        pulled = await server.call(actorch.ParameterServer.pull)
        assert pulled is not None
        model.load_state_dict(pulled.tensors)
        with torch.no_grad():
            accuracy = (model(x).argmax(1) == y).float().mean().item()
        print(
            f"  epoch {epoch:2d}  loss {sum(losses) / len(losses):.3f}  test accuracy {accuracy:6.1%}  "
            f"{time.perf_counter() - started:.2f} s"
        )
    for ref in [*trainers, server]:
        await ref.stop()


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parsed.add_argument("--epochs", type=int, default=6)
    parsed.add_argument("--trainers", type=int, default=2)
    parsed.add_argument("--lr", type=float, default=0.1)
    parsed.add_argument("--world-size", type=int, default=3)
    return parsed


if __name__ == "__main__":
    actorch.run(main, world_size=parser().parse_args().world_size)
