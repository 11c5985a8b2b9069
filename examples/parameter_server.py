"""Trainers on several ranks train a digit classifier through a sharded parameter server.

Run it with ``python examples/parameter_server.py`` (needs scikit-learn for its
bundled digits dataset: ``pip install -e '.[examples]'``). Rank 0 spawns two
parameter-server shards and three trainers, trains in async (Hogwild) mode and
then in sync mode, and prints the test accuracy after every epoch; on a
terminal a progress bar counts the epochs (``--no-progress`` for none).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from _progress import ProgressBar
from sklearn.datasets import load_digits
from torch import nn

import actorch


def make_model() -> nn.Module:
    """The classifier; built on every node from the same seed."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 8x8 digits (shipped with the package), 80 % to train, 20 % to test."""
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(y))
    chosen = order[:cut] if split == "train" else order[cut:]
    return x[chosen], y[chosen]


class Trainer(actorch.Actor):
    """Trains on its part of the training set against the parameter server's shards."""

    def __init__(self, index: int, trainers: int, batch_size: int = 32) -> None:
        x, y = digits("train")
        per = len(y) // trainers  # equal parts: in sync mode every round needs every trainer
        self.x, self.y = x[index * per : (index + 1) * per], y[index * per : (index + 1) * per]
        self.batch_size = batch_size
        self.model = make_model()
        self.client: actorch.params.ParameterClient | None = None

    async def train_epoch(self, pattern: str) -> float:
        """One pass over this trainer's data; returns the mean loss."""
        if self.client is None:
            self.client = actorch.params.ParameterClient(await self.system.lookup_all(pattern))
        parameters = await self.client.pull() or self.client.parameters
        losses = []
        for start in range(0, len(self.y) - self.batch_size + 1, self.batch_size):
            self.model.load_state_dict(parameters)
            self.model.zero_grad()
            batch = slice(start, start + self.batch_size)
            loss = nn.functional.cross_entropy(self.model(self.x[batch]), self.y[batch])
            loss.backward()
            grads = {name: p.grad for name, p in self.model.named_parameters() if p.grad is not None}
            parameters = await self.client.push(grads)
            losses.append(loss.item())
        return sum(losses) / len(losses)


def accuracy(parameters: dict[str, torch.Tensor]) -> float:
    model = make_model()
    model.load_state_dict(parameters)
    x, y = digits("test")
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


async def train(system: actorch.ActorSystem, mode: str, epochs: int, trainers: int, bar: ProgressBar) -> float:
    shards = 2
    # A sync step averages the trainers' gradients: it moves as far as one async
    # push but happens a third as often, so it gets a larger learning rate.
    options: dict[str, object] = {"optimizer_kwargs": {"lr": 0.1}, "mode": mode}
    if mode == "sync":
        options.update(trainers=trainers, optimizer_kwargs={"lr": 0.1 * trainers})
    servers = [
        await system.spawn(
            actorch.ParameterServer,
            args=(make_model,),
            kwargs={**options, "shard": (i, shards)},
            name=f"{mode}/ps/{i}",
            on=1 + i % (system.world_size - 1),
        )
        for i in range(shards)
    ]
    workers = [
        await system.spawn(Trainer, args=(i, trainers), on=1 + i % (system.world_size - 1)) for i in range(trainers)
    ]
    client = actorch.params.ParameterClient(servers)
    print(f"{mode} mode: {shards} shards, {trainers} trainers; chance is 10 %")
    bar.update(description=f"{mode} mode")
    final = 0.0
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        losses = await asyncio.gather(*(w.call(Trainer.train_epoch, f"{mode}/ps/*") for w in workers))
        final = accuracy(await client.pull() or client.parameters)
        print(
            f"  epoch {epoch:2d}  loss {sum(losses) / len(losses):.3f}  test accuracy {final:6.1%}  "
            f"versions {client.versions}  {time.perf_counter() - started:.2f} s"
        )
        bar.advance()
    for ref in [*workers, *servers]:
        await ref.stop()
    return final


async def main(system: actorch.ActorSystem) -> None:
    args = parser().parse_args()
    modes = ["async", "sync"] if args.mode == "both" else [args.mode]
    with ProgressBar(len(modes) * args.epochs, "epochs", enabled=args.progress) as bar:
        for mode in modes:
            await train(system, mode, args.epochs, args.trainers, bar)


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parsed.add_argument("--mode", choices=["async", "sync", "both"], default="both")
    parsed.add_argument("--epochs", type=int, default=8)
    parsed.add_argument("--trainers", type=int, default=3)
    parsed.add_argument("--world-size", type=int, default=3)
    parsed.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar on a terminal")
    return parsed


if __name__ == "__main__":
    actorch.run(main, world_size=parser().parse_args().world_size)
