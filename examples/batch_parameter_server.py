"""The batch-updating parameter server of PyTorch's batch RPC tutorial, on actorch.

Run it with ``python examples/batch_parameter_server.py``. Rank 0 hosts a
sync-mode ``ParameterServer``; each trainer on ranks 1 to N trains on random
images against its own fixed one-hot labels. It pushes its gradients and gets
the updated parameters back from the same call. The server steps once per round
of N pushes, on their average.

The tutorial trains torchvision's resnet50. This example uses a small CNN with
the same inputs and outputs (3x64x64 images, 30 classes, batches of 20), so that
it runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator

import torch
from torch import nn

import actorch

NUM_CLASSES, IMAGE_W, IMAGE_H = 30, 64, 64


def make_model() -> nn.Module:
    """A small CNN in place of the tutorial's resnet50: the same inputs and outputs."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for c_in, c_out in [(3, 32), (32, 64), (64, 128)]:  # 64x64 -> 8x8
        # GroupNorm, not BatchNorm: the server holds parameters, not buffers such as running means.
        layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.GroupNorm(8, c_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, NUM_CLASSES))


class Trainer(actorch.Actor):
    """The tutorial's trainer: random images, fixed one-hot labels, one push per batch."""

    def __init__(self, seed: int, batch_size: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.batch_size = batch_size
        self.model, self.loss_fn = make_model(), nn.MSELoss()
        self.one_hot_indices = torch.randint(0, NUM_CLASSES, (batch_size, 1), generator=self.generator)

    def _get_next_batch(self, iterations: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(iterations):
            inputs = torch.randn(self.batch_size, 3, IMAGE_W, IMAGE_H, generator=self.generator)
            labels = torch.zeros(self.batch_size, NUM_CLASSES).scatter_(1, self.one_hot_indices, 1)
            yield inputs, labels

    async def train(self, server: actorch.ActorRef[actorch.ParameterServer], iterations: int) -> list[list[float]]:
        """The tutorial's training loop; returns ``[version trained on, loss]`` per iteration."""
        params = await server.call(actorch.ParameterServer.pull)  # the initial parameters
        assert params is not None  # pull() only answers None to pull(since=the current version)
        history = []
        for inputs, labels in self._get_next_batch(iterations):
            self.model.load_state_dict(params.tensors)
            self.model.zero_grad()
            loss = self.loss_fn(self.model(inputs), labels)
            loss.backward()
            history.append([params.version, loss.item()])
            grads = {name: p.grad for name, p in self.model.named_parameters() if p.grad is not None}
            params = await server.call(actorch.ParameterServer.push, grads)  # waits for the round
        return history


async def main(system: actorch.ActorSystem) -> None:
    args = parser().parse_args()
    server = await system.spawn(
        actorch.ParameterServer,
        args=(make_model,),
        kwargs={"mode": "sync", "trainers": args.trainers, "optimizer_kwargs": {"lr": 0.001, "momentum": 0.9}},
        name="ps",
    )
    ranks = range(1, args.trainers + 1)
    trainers = [await system.spawn(Trainer, args=(rank, args.batch_size), on=rank) for rank in ranks]
    print(f"parameter server on rank 0 (sync mode), trainers on ranks {ranks[0]}-{ranks[-1]}; loss per trainer")
    started = time.perf_counter()
    histories = await asyncio.gather(*(t.call(Trainer.train, server, args.iterations) for t in trainers))
    seconds = time.perf_counter() - started
    means = []
    for iteration, steps in enumerate(zip(*histories, strict=True), 1):
        versions = ",".join(map(str, sorted({version for version, _ in steps})))  # one, unless a round broke
        losses = [loss for _, loss in steps]
        means.append(sum(losses) / len(losses))
        print(f"  iteration {iteration:2d}  version {versions:>2}  loss " + "  ".join(f"{x:.4f}" for x in losses))
    version = await server.call(actorch.ParameterServer.version)
    print(
        f"done: {args.iterations} iterations, server version {version}, "
        f"mean loss {means[0]:.4f} -> {means[-1]:.4f}, {seconds:.2f} s"
    )


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parsed.add_argument("--trainers", type=int, default=2)
    parsed.add_argument("--iterations", type=int, default=6)
    parsed.add_argument("--batch-size", type=int, default=20)
    return parsed


if __name__ == "__main__":
    actorch.run(main, world_size=parser().parse_args().trainers + 1)
