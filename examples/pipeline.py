"""The distributed ResNet pipeline of PyTorch's RPC tutorial: two model shards on two nodes, micro-batches in flight.

Run it with ``python examples/pipeline.py`` (``--quick`` for a short run); it
needs nothing beyond torch. Three processes, as in the tutorial
("Distributed Pipeline Parallelism Using RPC"): rank 0 drives training, the
first shard of a small ResNet lives on rank 1 and the second on rank 2, each
as an actor. Every batch is split into micro-batches that go to shard 1
concurrently; shard 1 sends each result on to shard 2 itself, so while shard 2
works on one micro-batch shard 1 already works on the next. The outputs are
concatenated on rank 0, and distributed autograd with a ``DistributedOptimizer``
trains both shards where they live.

The model is the tutorial's ResNet50 scaled down to fit two CPU cores (basic
residual blocks, 0.7 million parameters instead of 25 million, 32x32 images
instead of 128x128), and the data are synthetic but learnable: each class is a
fixed random image, seen through noise. For each number of micro-batches it
trains fresh shards and prints the time, as the tutorial does (here without
the first batch, which pays for warming up), the loss, and the accuracy on
each batch before it is learnt from (chance is 10 %).
docs/guides/tutorials.md compares it with the tutorial's program, and
``benchmarks/bench_pipeline.py`` measures how much the two stages overlap.

torch 2.13's DistributedOptimizer prints a DeprecationWarning about TorchScript
once per shard and number of micro-batches; torch forces it past warning filters.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
from torch import nn
from torch.distributed.optim import DistributedOptimizer

import actorch

NUM_CLASSES = 10
IMAGE = (3, 32, 32)


class Block(nn.Module):
    """A residual block of two 3x3 convolutions (ResNet's basic block)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False),
            nn.BatchNorm2d(planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, 1, 1, bias=False),
            nn.BatchNorm2d(planes),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inplanes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def shard1_layers() -> nn.Sequential:
    """The first part of the ResNet: the stem and the blocks at full and half resolution."""
    torch.manual_seed(1)
    stem = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True)]
    return nn.Sequential(*stem, Block(16, 32, stride=2), Block(32, 32))


def shard2_layers() -> nn.Sequential:
    """The second part: the deeper blocks, pooling and the classifier."""
    torch.manual_seed(2)
    blocks = [Block(32, 64, stride=2), Block(64, 64), Block(64, 128, stride=2), Block(128, 128)]
    return nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, NUM_CLASSES))


class Shard(actorch.Actor):
    """A shard of the model on its node."""

    def __init__(self, layers: nn.Sequential) -> None:
        self.layers = layers

    async def parameter_rrefs(self) -> list[Any]:
        """RRefs to this shard's parameters, owned by this node, for the DistributedOptimizer."""
        return [self.system.rref(p) for p in self.layers.parameters()]


class Shard2(Shard):
    """The second shard: the last stage of the pipeline."""

    def __init__(self) -> None:
        super().__init__(shard2_layers())

    async def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Shard1(Shard):
    """The first shard: computes a micro-batch and passes the result on to the second shard."""

    # Several micro-batches' handlers may be open at once: each computes without
    # awaiting (so they take turns, in order) and then waits on shard 2 while
    # the next one computes. The tutorial needs a lock for the same effect.
    max_concurrency = 64

    def __init__(self) -> None:
        super().__init__(shard1_layers())

    async def forward(self, x: torch.Tensor, following: actorch.ActorRef[Shard2]) -> torch.Tensor:
        return await following.call(Shard2.forward, self.layers(x))


class DistResNet:
    """The two shards as one model: splits a batch into micro-batches and sends them all at once."""

    def __init__(self, split_size: int, shard1: actorch.ActorRef[Shard1], shard2: actorch.ActorRef[Shard2]) -> None:
        self.split_size, self.shard1, self.shard2 = split_size, shard1, shard2

    async def forward(self, xs: torch.Tensor) -> torch.Tensor:
        micro = xs.split(self.split_size)
        return torch.cat(await asyncio.gather(*(self.shard1.call(Shard1.forward, x, self.shard2) for x in micro)))

    async def parameter_rrefs(self) -> list[Any]:
        first, second = await asyncio.gather(
            self.shard1.call(Shard1.parameter_rrefs), self.shard2.call(Shard2.parameter_rrefs)
        )
        return [*first, *second]


def batches(count: int, batch_size: int, noise: float = 2.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic images: each class is a fixed random image, and every sample adds its own noise."""
    generator = torch.Generator().manual_seed(0)
    classes = torch.randn(NUM_CLASSES, *IMAGE, generator=generator)
    out = []
    for _ in range(count):
        labels = torch.randint(0, NUM_CLASSES, (batch_size,), generator=generator)
        out.append((classes[labels] + noise * torch.randn(batch_size, *IMAGE, generator=generator), labels))
    return out


async def train(system: actorch.ActorSystem, splits: int, args: argparse.Namespace) -> None:
    shard1 = await system.spawn(Shard1, on=1)
    shard2 = await system.spawn(Shard2, on=2)
    model = DistResNet(-(-args.batch_size // splits), shard1, shard2)
    # DistributedOptimizer makes blocking torch RPC calls: build it off the event loop.
    rrefs = await model.parameter_rrefs()
    optimizer = await asyncio.to_thread(DistributedOptimizer, torch.optim.SGD, rrefs, lr=args.lr, momentum=0.9)
    losses, accuracies = [], []
    started = time.perf_counter()
    for index, (inputs, labels) in enumerate(batches(args.batches, args.batch_size)):
        if index == 1:
            started = time.perf_counter()  # the first batch pays for warming up: not timed
        with dist_autograd.context() as context_id:
            outputs = await model.forward(inputs)
            loss = nn.functional.cross_entropy(outputs, labels)
            # Both block on torch RPC; worker threads keep the event loop serving.
            await asyncio.to_thread(dist_autograd.backward, context_id, [loss])
            await asyncio.to_thread(optimizer.step, context_id)
        losses.append(loss.item())
        accuracies.append((outputs.argmax(1) == labels).float().mean().item())
    elapsed = time.perf_counter() - started
    per_batch = elapsed / max(1, args.batches - 1)
    last = max(1, len(losses) // 4)  # the last quarter of the batches
    print(
        f"number of splits = {splits}, execution time = {elapsed:.2f} s ({per_batch:.3f} s per batch), "
        f"loss {losses[0]:.3f} -> {sum(losses[-last:]) / last:.3f}, "
        f"accuracy {accuracies[0]:.1%} -> {sum(accuracies[-last:]) / last:.1%}"
    )
    await shard1.stop()
    await shard2.stop()


def one_thread(rank: int) -> None:
    """Run on every node before it serves: the processes share the cores, so one torch thread each."""
    torch.set_num_threads(1)


async def main(system: actorch.ActorSystem) -> None:
    args = parse_args()
    print(f"shard 1 on rank 1, shard 2 on rank 2, {args.batches} batches of {args.batch_size}; chance is 10 %")
    for splits in args.splits:
        await train(system, splits, args)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8], help="micro-batches per batch")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--quick", action="store_true", help="a short run: 1 and 4 micro-batches, 8 batches")
    args = parser.parse_args()
    if args.quick:
        args.splits, args.batches = [1, 4], 8
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad flags end here, before any process starts
    actorch.run(main, world_size=3, setup=one_thread)
