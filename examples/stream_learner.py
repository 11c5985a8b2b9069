"""A learner reads a replay buffer's sample stream while explorers fill it, following the learner's policy.

Run it with ``python examples/stream_learner.py`` (``--quick`` for a short run).
Rank 1 hosts a ``ReplayBuffer`` and a ``ParameterServer`` holding a linear model
of a contextual bandit's rewards. Ranks 1 and 2 each host an explorer that
plays the bandit greedily under the newest model (with some random actions),
which it follows through ``ParameterServer.watch`` instead of polling, and
writes what it sees to the buffer. Rank 0 is the learner: it consumes
``ReplayBuffer.sample_stream`` (no polling, no waiting on each sample), fits
the model to each batch and pushes the gradients to the server, whose new
version reaches the explorers through their watch streams. It prints progress
and a summary: samples per second, versions the explorers saw, and how their
reward grew as the model learned.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import torch
from torch import nn

import actorch
from actorch import ReplayBuffer
from actorch.params import Parameters, ParameterServer

STATE, ACTIONS = 8, 4


def true_rewards() -> torch.Tensor:
    """The bandit's hidden reward weights, the same on every node."""
    return torch.randn(STATE, ACTIONS, generator=torch.Generator().manual_seed(0))


def make_model() -> nn.Linear:
    """The learner's model of the rewards: one linear map from state to each action's reward."""
    model = nn.Linear(STATE, ACTIONS, bias=False)
    nn.init.zeros_(model.weight)
    return model


class Explorer(actorch.Actor):
    """Plays the bandit under the newest model it has seen and writes the transitions to the buffer."""

    max_concurrency = 2  # explore runs until stop is called

    def __init__(self, buffer: actorch.ActorRef[ReplayBuffer], server: actorch.ActorRef[ParameterServer]) -> None:
        self.buffer = buffer
        self.server = server
        self.weights = true_rewards()
        self.model = torch.zeros(ACTIONS, STATE)
        self.generator = torch.Generator().manual_seed(self.system.rank)
        self.versions: list[int] = []
        self.stopped = asyncio.Event()

    async def explore(self, batch: int = 64, epsilon: float = 0.1) -> dict[str, Any]:
        """Write batches until :meth:`stop`; return what was written and the mean reward early and late."""
        follower = asyncio.ensure_future(self.follow())
        written, rewards = 0, []
        try:
            while not self.stopped.is_set():
                state = torch.randn(batch, STATE, generator=self.generator)
                greedy = (state @ self.model.T).argmax(1)
                explore = torch.rand(batch, generator=self.generator) < epsilon
                random = torch.randint(ACTIONS, (batch,), generator=self.generator)
                action = torch.where(explore, random, greedy)
                reward = (state @ self.weights).gather(1, action[:, None]).squeeze(1)
                reward += 0.1 * torch.randn(batch, generator=self.generator)
                await self.buffer.call(ReplayBuffer.extend, {"state": state, "action": action, "reward": reward})
                written += batch
                rewards.append(reward.mean().item())
                await asyncio.sleep(0.005)  # an environment takes time
        finally:
            follower.cancel()
        tenth = max(1, len(rewards) // 10)
        return {
            "written": written,
            "versions": len(self.versions),
            "last_version": self.versions[-1] if self.versions else None,
            "early_reward": sum(rewards[:tenth]) / tenth,
            "late_reward": sum(rewards[-tenth:]) / tenth,
        }

    async def follow(self) -> None:
        """Act on each new version of the model as the server makes it (window 1: always the newest)."""
        async with self.server.stream(ParameterServer.watch, device="cpu").with_window(1) as versions:
            async for params in versions:
                self.model = params.tensors["weight"]
                self.versions.append(params.version)

    async def stop(self) -> None:
        """End :meth:`explore` after the batch it is writing."""
        self.stopped.set()


async def learn(
    buffer: actorch.ActorRef[ReplayBuffer], server: actorch.ActorRef[ParameterServer], steps: int, batch_size: int
) -> dict[str, float]:
    """Fit the model to ``steps`` samples from the buffer's stream, pushing each step's gradients to the server."""
    model = make_model()
    started = last = time.monotonic()
    loss_value = float("nan")
    stream = buffer.stream(ReplayBuffer.sample_stream, batch_size, min_size=4 * batch_size, device="cpu")
    async with stream.with_window(2) as samples:  # two batches on their way while the learner works
        step = 0
        async for sample in samples:
            if step == 0:
                started = last = time.monotonic()  # from the first sample: the stream waited for the warm-up
            predicted = model(sample.data["state"]).gather(1, sample.data["action"][:, None]).squeeze(1)
            loss = (predicted - sample.data["reward"]).pow(2).mean()
            model.zero_grad()
            loss.backward()
            grads = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
            params: Parameters = await server.call(ParameterServer.push, grads, device="cpu")
            model.load_state_dict(params.tensors)
            loss_value = loss.item()
            step += 1
            if time.monotonic() - last >= 1.0 or step == steps:
                last = time.monotonic()
                print(f"  step {step:5,}  version {params.version:5,}  held {sample.size:7,}  loss {loss_value:.4f}")
            if step == steps:
                break
    elapsed = time.monotonic() - started
    distance = (model.weight.detach().T - true_rewards()).norm().item()
    return {"samples_per_s": steps * batch_size / elapsed, "loss": loss_value, "distance": distance}


async def main(system: actorch.ActorSystem) -> None:
    args = parser().parse_args()
    steps = 150 if args.quick else args.steps
    home = 1 % system.world_size
    buffer = await system.spawn(ReplayBuffer, args=(args.capacity,), kwargs={"seed": 0}, name="replay", on=home)
    server = await system.spawn(
        ParameterServer, args=(make_model,), kwargs={"optimizer_kwargs": {"lr": 0.1}}, name="ps", on=home
    )
    ranks = list(range(1, system.world_size)) or [0]
    explorers = [await system.spawn(Explorer, args=(buffer, server), on=rank) for rank in ranks]
    print(
        f"{len(explorers)} explorers on nodes {ranks} write to the buffer on node {home}; the learner on node "
        f"{system.rank} reads its sample stream (batch {args.batch_size}) for {steps:,} steps"
    )
    started = time.monotonic()
    exploring = [asyncio.ensure_future(explorer.call(Explorer.explore)) for explorer in explorers]
    result = await learn(buffer, server, steps, args.batch_size)
    for explorer in explorers:
        await explorer.call(Explorer.stop)
    reports = await asyncio.gather(*exploring)
    elapsed = time.monotonic() - started
    written = sum(report["written"] for report in reports)
    statistics = await buffer.call(ReplayBuffer.statistics)
    print(
        f"done in {elapsed:.1f} s: {steps:,} learning steps, {result['samples_per_s']:,.0f} samples/s from the "
        f"stream, {written:,} transitions written, final loss {result['loss']:.4f}, "
        f"|model - true weights| = {result['distance']:.3f}"
    )
    print(f"  buffer: holds {statistics['size']:,}, {statistics['samples']:,} samples drawn")
    for explorer, report in zip(explorers, reports, strict=True):
        print(
            f"  explorer on node {explorer.rank}: followed {report['versions']:,} versions through watch "
            f"(last {report['last_version']}), mean reward {report['early_reward']:.2f} early, "
            f"{report['late_reward']:.2f} late"
        )


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parsed.add_argument("--steps", type=int, default=2000)
    parsed.add_argument("--quick", action="store_true", help="150 learning steps")
    parsed.add_argument("--batch-size", type=int, default=128)
    parsed.add_argument("--capacity", type=int, default=50_000)
    parsed.add_argument("--world-size", type=int, default=3)
    return parsed


if __name__ == "__main__":
    actorch.run(main, world_size=parser().parse_args().world_size)
