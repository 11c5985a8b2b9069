"""PyTorch's "Combining Distributed DataParallel with Distributed RPC Framework" tutorial on actorch.

Run it with ``python examples/ddp_rpc.py`` (``--quick`` for a short run); it
needs nothing beyond torch. Four processes, as in the tutorial: rank 0 is the
master and runs ``main``; rank 1 is the parameter server and hosts the sparse
part of the model, an ``EmbeddingBag`` table, as an actor; ranks 2 and 3 are
trainers. Each trainer holds the dense part, a ``Linear`` layer that
``DistributedDataParallel`` keeps in sync between them over a process group
from ``system.process_group``. A trainer's forward pass calls the table actor
inside a distributed autograd context, so ``dist_autograd.backward`` sends the
table's gradients back to it while DDP averages the dense gradients, and one
``DistributedOptimizer`` steps both the remote table and the local layer.

torch 2.13's DistributedOptimizer prints a DeprecationWarning about TorchScript
once per optimizer and node holding parameters; torch forces it past warning filters.

The tutorial's data are random; here they are learnable (each bag draws its
indices from one class of the table's rows and is labelled with that class),
so the loss printed for every epoch goes down.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
from torch import nn
from torch.distributed.optim import DistributedOptimizer
from torch.nn.parallel import DistributedDataParallel

import actorch

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16
NUM_CLASSES = 8
TRAINERS = [2, 3]
ROW_CLASS = torch.arange(NUM_EMBEDDINGS) % NUM_CLASSES  # the class each row of the table stands for


class EmbeddingTable(actorch.Actor):
    """The sparse part of the model, on the parameter server: the tutorial's ``RemoteModule``."""

    def __init__(self) -> None:
        self.table = nn.EmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode="sum")

    async def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.table(indices, offsets)

    async def parameter_rrefs(self) -> list[Any]:
        """RRefs to the table's parameters, owned by this node, for the trainers' DistributedOptimizer."""
        return [self.system.rref(p) for p in self.table.parameters()]


class Trainer(actorch.Actor):
    """The dense part, replicated by DDP across the trainers, and the training loop."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.table: actorch.ActorRef[EmbeddingTable] | None = None
        self.fc: DistributedDataParallel | None = None
        self.optimizer: DistributedOptimizer | None = None

    async def setup(self, table: actorch.ActorRef[EmbeddingTable], lr: float) -> None:
        """Join the trainers' process group, wrap the layer in DDP and build the optimizer.

        Every trainer runs this at once: the group and DDP's first broadcast need all of them.
        """
        self.table = table
        group = await self.system.process_group(TRAINERS)
        # DDP's constructor and DistributedOptimizer's block on the others: keep them off the loop.
        self.fc = await asyncio.to_thread(
            DistributedDataParallel, nn.Linear(EMBEDDING_DIM, NUM_CLASSES), process_group=group
        )
        rrefs = await table.call(EmbeddingTable.parameter_rrefs)
        rrefs += [self.system.rref(p) for p in self.fc.parameters()]
        self.optimizer = await asyncio.to_thread(DistributedOptimizer, torch.optim.SGD, rrefs, lr=lr)

    async def train_epoch(self, batches: int) -> float:
        """Train on ``batches`` fresh batches; the mean loss."""
        losses = [await actorch.in_autograd_context(self._step, *self._batch()) for _ in range(batches)]
        return sum(losses) / len(losses)

    async def weights(self) -> list[torch.Tensor]:
        """The dense layer's parameters (the same on every trainer)."""
        assert self.fc is not None
        return [p.detach().clone() for p in self.fc.parameters()]

    async def _step(self, context_id: int, indices: torch.Tensor, offsets: torch.Tensor, target: torch.Tensor) -> float:
        assert self.table is not None
        assert self.fc is not None
        assert self.optimizer is not None
        embedded = await self.table.call(EmbeddingTable.forward, indices, offsets)  # recorded in the context
        loss = nn.functional.cross_entropy(self.fc(embedded), target)
        # Both block (the backward on DDP's all-reduce with the other trainer): a worker thread keeps the loop free.
        await asyncio.to_thread(dist_autograd.backward, context_id, [loss])
        await asyncio.to_thread(self.optimizer.step, context_id)
        return loss.item()

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tutorial's batch shape (20 to 50 indices, bags of 1 to 10), with indices drawn from each bag's class."""
        g = self.generator
        count = int(torch.randint(20, 51, (1,), generator=g))
        sizes: list[int] = []
        while sum(sizes) < count:
            sizes.append(int(torch.randint(1, 11, (1,), generator=g)))
        target = torch.randint(NUM_CLASSES, (len(sizes),), generator=g)
        rows_per_class = NUM_EMBEDDINGS // NUM_CLASSES
        picks = torch.randint(rows_per_class, (sum(sizes),), generator=g)
        indices = torch.repeat_interleave(target, torch.tensor(sizes)) + NUM_CLASSES * picks
        offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0)
        return indices, offsets, target


async def main(system: actorch.ActorSystem) -> None:
    args = parser().parse_args()
    table = await system.spawn(EmbeddingTable, name="ps/embedding", on=1)
    trainers = [await system.spawn(Trainer, args=(rank,), name=f"trainer/{rank}", on=rank) for rank in TRAINERS]
    await asyncio.gather(*(trainer.call(Trainer.setup, table, args.lr) for trainer in trainers))
    print(
        f"embedding table on rank 1, trainers with DDP on ranks {TRAINERS}; chance loss is {math.log(NUM_CLASSES):.2f}"
    )
    for epoch in range(1, (4 if args.quick else args.epochs) + 1):
        losses = await asyncio.gather(*(trainer.call(Trainer.train_epoch, args.batches) for trainer in trainers))
        print(f"  epoch {epoch:2d}  loss {sum(losses) / len(losses):.3f}")
    first, second = [await trainer.call(Trainer.weights) for trainer in trainers]
    same = all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    print(f"dense layers identical on both trainers: {same}")


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parsed.add_argument("--epochs", type=int, default=20)
    parsed.add_argument("--batches", type=int, default=10, help="batches per epoch and trainer")
    parsed.add_argument("--lr", type=float, default=0.05)
    parsed.add_argument("--quick", action="store_true", help="a short run: 4 epochs")
    return parsed


if __name__ == "__main__":
    actorch.run(main, world_size=4)
