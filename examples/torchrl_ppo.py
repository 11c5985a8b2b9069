"""CartPole trained by TorchRL's PPO loss on batches from actorch's collectors.

Run it with ``python examples/torchrl_ppo.py`` (``pip install -e '.[bench]'``
brings TorchRL). Ranks 1..N (``--workers``) each host a ``Collector`` of
``--envs`` CartPole-v1 environments with a copy of the policy network (4 ->
64 -> 2 logits: the collectors take ``logits=True``). Rank 0 reads their
batches through one ``Collection``, turns each into TorchRL's layout with
``Batch.to_tensordict()`` and learns from it with TorchRL's own pieces, as a
TorchRL program does: ``GAE`` for the advantages and ``ClipPPOLoss`` for the
update. It then publishes the policy network's weights to every collector.

It stops once the mean return of the last 20 finished episodes reaches
``--target``, or after ``--max-frames``, and prints the last mean return and
the frames it took.
"""

from __future__ import annotations

import argparse
import os
from collections import deque
from typing import Any

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import Categorical
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import actorch
from actorch.rl import Collection, Collector


def make_env() -> gym.Env:
    return gym.make("CartPole-v1")


def make_policy() -> nn.Module:
    """The network every collector acts with: a state in, the two actions' logits out."""
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="collectors, one per worker process")
    parser.add_argument("--envs", type=int, default=8, help="environments per collector")
    parser.add_argument("--frames-per-batch", type=int, default=256)
    parser.add_argument("--target", type=float, default=200.0, help="mean return of the last 20 episodes to reach")
    parser.add_argument("--max-frames", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    args = parse_args()
    torch.manual_seed(args.seed)
    options = {"num_envs": args.envs, "frames_per_batch": args.frames_per_batch, "logits": True}
    collectors = [
        await system.spawn(Collector, args=(make_env, make_policy), kwargs={**options, "seed": 100 * rank}, on=rank)
        for rank in range(1, system.world_size)
    ]
    network = make_policy()
    actor = ProbabilisticActor(
        TensorDictModule(network, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=Categorical,
        return_log_prob=True,
    )
    critic = ValueOperator(nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1)), in_keys=["observation"])
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=True)
    loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01)
    optimizer = torch.optim.Adam(loss.parameters(), lr=3e-3)
    log_prob_key = loss.tensor_keys.sample_log_prob
    returns: deque[float] = deque(maxlen=20)
    frames, mean = 0, float("nan")
    async with Collection(collectors, max_lag=1, on_lag="wait", stop_collectors=True) as collection:
        await collection.publish(network)  # every batch is played with the learner's weights
        async for batch in collection:
            rollout = batch.to_tensordict(log_prob_key=log_prob_key)  # [envs, steps]: TorchRL's layout
            with torch.no_grad():
                advantage(rollout)
            flat = rollout.reshape(-1)
            for _ in range(4):
                for part in flat[torch.randperm(len(flat))].split(64):
                    losses = loss(part)
                    total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optimizer.zero_grad()
                    total.backward()
                    optimizer.step()
            await collection.publish(network)
            frames += batch.frames
            returns.extend(batch.episode_returns)
            mean = sum(returns) / len(returns) if returns else float("nan")
            if (len(returns) == returns.maxlen and mean >= args.target) or frames >= args.max_frames:
                break
    print(f"mean return {mean:.1f} over the last {len(returns)} episodes after {frames:,} frames")
    return {"return": mean, "frames": frames}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    actorch.run(main, world_size=1 + parse_args().workers)
