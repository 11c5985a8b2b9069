"""CartPole REINFORCE with one agent and several observers, as in PyTorch's RPC tutorials.

Run it with ``python examples/reinforce.py`` (``--no-batch`` for one policy
forward per state). Rank 0 hosts the ``Agent``; ranks 1..N each host an
``Observer`` named ``rl/observers/<rank>``, which builds Gymnasium's
``CartPole-v1`` on its own node. Every agent episode, each observer plays one
CartPole episode against the agent, asking it for an action at every step;
with batching, the agent answers all observers' states of a step with one
policy forward. The agent then takes one REINFORCE step on all the episodes.
It prints the running reward per episode and saves the reward curve; on a
terminal a progress bar counts the episodes (``--no-progress`` for none).

``--device`` puts the agent's policy on a GPU (``auto``, the default, picks
``cuda`` when there is one); the observers always play on the CPU.
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import torch
from _progress import ProgressBar
from matplotlib.figure import Figure
from torch import nn

import actorch
from actorch.rl import Agent, EpisodeStats, Observer


def make_env() -> gym.Env:
    """The environment every observer builds on its own node."""
    return gym.make("CartPole-v1")


def make_policy() -> nn.Module:
    """The tutorials' policy: state in, action probabilities out."""
    return nn.Sequential(nn.Linear(4, 128), nn.Dropout(p=0.6), nn.ReLU(), nn.Linear(128, 2), nn.Softmax(dim=-1))


def one_thread_per_process() -> None:
    """One torch thread per process, unless OMP_NUM_THREADS says otherwise: the processes share the cores.

    Several threads per process, each busy-waiting after its small matrix
    products, cost the agent several times its CPU on a small machine.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by the workers' torch when they start
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--observers", type=int, default=3, help="observer processes (default 3)")
    parser.add_argument("--episodes", type=int, default=60, help="agent episodes (default 60)")
    parser.add_argument("--steps", type=int, default=None, help="fixed-length runs of this many steps instead")
    parser.add_argument("--batch", action=argparse.BooleanOptionalAction, default=True, help="batch the forwards")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="auto", help="the agent's device: auto (default), cpu, cuda or cuda:N")
    parser.add_argument("--plot", default="reinforce.png", help="where to save the reward curve ('' for none)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar on a terminal")
    return parser.parse_args()


def plot(history: list[EpisodeStats], path: str, batch: bool) -> None:
    figure = Figure(figsize=(6, 3.5))
    axes = figure.subplots()
    episodes = [stats.episode for stats in history]
    axes.plot(episodes, [stats.reward for stats in history], alpha=0.4, label="last reward")
    axes.plot(episodes, [stats.running_reward for stats in history], label="running reward")
    axes.set(xlabel="episode", ylabel="reward", title=f"CartPole REINFORCE ({'batched' if batch else 'unbatched'})")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


async def main(system: actorch.ActorSystem) -> list[EpisodeStats]:
    args = parse_args()
    for rank in range(1, system.world_size):
        await system.spawn(
            Observer, args=(make_env,), kwargs={"seed": args.seed + rank}, name=f"rl/observers/{rank}", on=rank
        )
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    agent = await system.spawn(
        Agent,
        args=(make_policy,),
        kwargs={"lr": args.lr, "gamma": args.gamma, "batch": args.batch, "smoothing": 0.05, "seed": args.seed},
        device=device,
    )
    history = []
    started = time.perf_counter()
    with ProgressBar(args.episodes, "episodes", description="CartPole", enabled=args.progress) as bar:
        for _ in range(args.episodes):
            stats = await agent.call(Agent.run_episode, args.steps)
            history.append(stats)
            print(
                f"Episode {stats.episode}\tLast reward: {stats.reward:.2f}\tAverage reward: {stats.running_reward:.2f}"
            )
            bar.advance()
    seconds = time.perf_counter() - started
    actions = sum(stats.steps for stats in history)
    print(
        f"done: {args.episodes} episodes, {system.world_size - 1} observers, batch={args.batch}, device={device}, "
        f"running reward {history[0].running_reward:.1f} -> {history[-1].running_reward:.1f}, "
        f"{actions} actions in {seconds:.1f} s ({actions / seconds:,.0f} actions/s)"
    )
    if args.plot:
        plot(history, args.plot, args.batch)
        print(f"reward curve saved to {args.plot}")
    return history


if __name__ == "__main__":
    one_thread_per_process()
    actorch.run(main, world_size=parse_args().observers + 1)
