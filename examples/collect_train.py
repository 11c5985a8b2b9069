"""CartPole solved by PPO on a learner fed by collectors that play with their own copy of the policy.

Run it with ``python examples/collect_train.py``. Ranks 1..N (``--workers``)
each host a ``Collector`` named ``rl/collectors/<rank>``: it builds
``--envs`` Gymnasium ``CartPole-v1`` environments and the policy (4 -> 128 -> 2
action probabilities) on its own node, steps the environments itself with its
copy of the policy and streams time-major batches of ``--frames-per-batch``
transitions, each stamped with the version of the weights that made it.

Rank 0 is the learner. It reads every collector's batches as one
``Collection``, takes a PPO step on each batch (several epochs of clipped
updates; the value function that PPO needs lives only here, the collectors
need only the policy) and publishes the new weights to every collector in one
broadcast. The collectors play while the learner learns, so a batch comes
from weights some versions behind the learner's: with N collectors asked one
batch at a time, the learner takes the other N - 1 collectors' batches while
one collector plays, so its batch is N - 1 versions behind. ``--max-lag``
(N - 1 by default) bounds that lag: a collector waits for weights within it
before it plays, and a batch that still falls behind is played again
(``--on-lag drop`` streams batches instead and drops those that fall
behind). PPO's ratio is taken against the log-probabilities each batch was
played with, which is the importance correction for the lag.

It stops once the mean return of the last ``--window`` finished episodes
reaches ``--target`` (475 over the last 100: CartPole-v1's solved threshold),
or after ``--max-frames``, and prints the final mean return, the frames, the
wall time and the frames per second. On a terminal a progress bar counts the
frames (``--no-progress`` for none); elsewhere it prints a line a second.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import torch
from _progress import ProgressBar
from torch import nn

import actorch
from actorch.rl import Batch, Collection, Collector


def make_env() -> gym.Env:
    """The environment each collector builds ``--envs`` times on its own node."""
    return gym.make("CartPole-v1")


def make_policy() -> nn.Module:
    """The policy, built on every node: a state in, the two actions' probabilities out."""
    return nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2), nn.Softmax(dim=-1))


def make_value() -> nn.Module:
    """The state-value function PPO's advantages need; only the learner has one."""
    return nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 1))


def one_thread_per_process() -> None:
    """One torch thread per process, unless OMP_NUM_THREADS says otherwise: the processes share the cores."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by the workers' torch when they start
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="collector processes (default 2)")
    parser.add_argument("--envs", type=int, default=8, help="environments per collector (default 8)")
    parser.add_argument("--frames-per-batch", type=int, default=256, help="transitions per batch (default 256)")
    parser.add_argument("--target", type=float, default=475.0, help="mean return to reach (default 475)")
    parser.add_argument("--window", type=int, default=100, help="finished episodes averaged (default 100)")
    parser.add_argument("--max-frames", type=int, default=1_000_000, help="give up after this many (default 1M)")
    parser.add_argument("--max-lag", type=int, default=None, help="versions a batch may be behind (default N - 1)")
    parser.add_argument("--on-lag", choices=["wait", "drop"], default="wait", help="past --max-lag (default wait)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=0.98)
    parser.add_argument("--lam", type=float, default=0.8, help="GAE's lambda")
    parser.add_argument("--clip", type=float, default=0.2, help="PPO's ratio clip")
    parser.add_argument("--epochs", type=int, default=10, help="passes over each batch")
    parser.add_argument("--minibatch", type=int, default=256, help="transitions per gradient step")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar on a terminal")
    args = parser.parse_args()
    for name in ("workers", "envs", "window", "epochs", "minibatch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.frames_per_batch < 1 or args.frames_per_batch % args.envs:
        parser.error(f"--frames-per-batch must be a positive multiple of --envs ({args.envs})")
    return args


@dataclass
class PPO:
    """Clipped PPO with generalised advantage estimation, on one time-major batch at a time."""

    policy: nn.Module
    value: nn.Module
    args: argparse.Namespace

    def __post_init__(self) -> None:
        parameters = [*self.policy.parameters(), *self.value.parameters()]
        self.optimizer = torch.optim.Adam(parameters, lr=self.args.lr)
        self.generator = torch.Generator().manual_seed(self.args.seed)

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and value targets, ``[steps, envs]`` each.

        A terminated step has no future; a truncated one (a time limit) is
        bootstrapped from its next state, as is the batch's last step.
        """
        gamma, lam = self.args.gamma, self.args.lam
        with torch.no_grad():
            values = self.value(batch.observations).squeeze(-1)
            following = self.value(batch.next_observations).squeeze(-1)
        alive = (~batch.terminated).float()
        deltas = batch.rewards + gamma * following * alive - values
        carry = (~batch.dones).float()
        advantages = torch.zeros_like(deltas)
        running = torch.zeros_like(deltas[0])
        for step in reversed(range(len(deltas))):
            running = deltas[step] + gamma * lam * carry[step] * running
            advantages[step] = running
        return advantages, advantages + values

    def learn(self, batch: Batch) -> None:
        """Several epochs of clipped updates on ``batch``, its ratios taken against the policy that played it."""
        advantages, targets = self.advantages(batch)
        flat = batch.transitions()
        states, actions, played = flat["observations"], flat["actions"], flat["log_probs"]
        advantages, targets = advantages.reshape(-1), targets.reshape(-1)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        for _ in range(self.args.epochs):
            order = torch.randperm(len(states), generator=self.generator)
            for start in range(0, len(states), self.args.minibatch):
                take = order[start : start + self.args.minibatch]
                probabilities = self.policy(states[take])
                log_probs = probabilities.gather(1, actions[take].unsqueeze(1)).squeeze(1).clamp_min(1e-12).log()
                ratio = (log_probs - played[take]).exp()
                clipped = ratio.clamp(1 - self.args.clip, 1 + self.args.clip)
                policy_loss = -torch.min(ratio * advantages[take], clipped * advantages[take]).mean()
                value_loss = (self.value(states[take]).squeeze(-1) - targets[take]).pow(2).mean()
                self.optimizer.zero_grad()
                (policy_loss + 0.5 * value_loss).backward()
                nn.utils.clip_grad_norm_([*self.policy.parameters(), *self.value.parameters()], 0.5)
                self.optimizer.step()


async def spawn_collectors(system: actorch.ActorSystem, args: argparse.Namespace) -> list[actorch.ActorRef[Collector]]:
    """One collector on each rank but the learner's; environment i of rank r is seeded ``seed + 1000 r + i``."""
    options = {"num_envs": args.envs, "frames_per_batch": args.frames_per_batch}
    return [
        await system.spawn(
            Collector,
            args=(make_env, make_policy),
            kwargs={**options, "seed": args.seed + 1000 * rank},
            name=f"rl/collectors/{rank}",
            on=rank,
        )
        for rank in range(1, system.world_size)
    ]


async def main(system: actorch.ActorSystem) -> dict[str, float]:
    args = parse_args()
    torch.manual_seed(args.seed)
    collectors = await spawn_collectors(system, args)
    max_lag = max(1, len(collectors) - 1) if args.max_lag is None else args.max_lag
    ppo = PPO(make_policy(), make_value(), args)
    returns: deque[float] = deque(maxlen=args.window)
    mean = float("nan")
    frames = episodes = 0
    solved = False
    started = last_line = time.perf_counter()
    async with Collection(collectors, max_lag=max_lag, on_lag=args.on_lag) as collection:
        # Each collector drew initial weights of its own (its version 0): the learner's, as version 1, reach
        # every collector before the first batch is asked for, so every batch is played with the learner's weights.
        await collection.publish(ppo.policy)
        with ProgressBar(args.max_frames, "frames", description="CartPole", enabled=args.progress) as bar:
            async for batch in collection:
                ppo.learn(batch)
                await collection.publish(ppo.policy)
                frames += batch.frames
                episodes += len(batch.episode_returns)
                returns.extend(batch.episode_returns)
                mean = sum(returns) / len(returns) if returns else float("nan")
                solved = len(returns) == args.window and mean >= args.target
                now = time.perf_counter()
                fps = frames / (now - started)
                bar.update(description=f"CartPole return {mean:5.1f}, {fps:,.0f} fps")
                bar.advance(batch.frames)
                if now - last_line >= 1.0 or solved or frames >= args.max_frames:
                    last_line = now
                    print(
                        f"frames {frames:9,}  version {collection.version:5}  episodes {episodes:6,}  "
                        f"return {mean:6.1f} (last {len(returns)})  {now - started:6.1f} s  {fps:7,.0f} fps"
                    )
                if solved or frames >= args.max_frames:
                    break
        statistics = collection.statistics()
    seconds = time.perf_counter() - started
    print(
        f"{'reached' if solved else 'did not reach'} the target: mean return {mean:.1f} over the last "
        f"{len(returns)} episodes (target {args.target:g} over {args.window})"
    )
    plural = "s" * (len(collectors) > 1)
    print(
        f"done: mean return {mean:.1f}, {frames:,} frames, {seconds:.1f} s, {frames / seconds:,.0f} fps "
        f"({len(collectors)} collector{plural} x {args.envs} envs, {statistics['version']} versions, "
        f"max lag {max_lag}, {statistics['dropped'] + statistics['asked_again']} stale batches set aside)"
    )
    return {"return": mean, "frames": frames, "seconds": seconds, "solved": solved}


if __name__ == "__main__":
    one_thread_per_process()
    actorch.run(main, world_size=1 + parse_args().workers)
