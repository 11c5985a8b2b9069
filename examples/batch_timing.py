"""The batch RPC tutorial's experiment: time the same episodes with and without batching, per world size.

Run it with ``python examples/batch_timing.py``. For every world size from 2 to
``--max-world-size`` (one agent plus 1, 2, ... observers), one agent with a
batched ``select_action_batch`` and one answering each state on its own play the
same fixed-length episodes of CartPole against the same observers; the table
gives the seconds each took and the figure plots them against the world size.

One world of the largest size serves every row: the observers of a row are
named ``timing/<world size>/<rank>`` and each agent finds its row's observers by
that pattern. Only the episodes are timed, not process start-up (the tutorial
timed whole ``mp.spawn`` runs). The policy is the tutorial's, with ``--hidden``
units per layer and ``--layers`` hidden layers: on a CPU, a wide policy stands
in for the per-forward cost that batching saves on a GPU. On a terminal a
progress bar counts the episodes played (``--no-progress`` for none).
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
from actorch import Agent, Observer

ARGS: argparse.Namespace


def make_env() -> gym.Env:
    """The environment every observer builds on its own node."""
    return gym.make("CartPole-v1")


def make_policy() -> nn.Module:
    """The tutorial's policy, ``--layers`` hidden layers of ``--hidden`` units."""
    layers: list[nn.Module] = []
    width = 4
    for _ in range(ARGS.layers):
        layers += [nn.Linear(width, ARGS.hidden), nn.Dropout(p=0.6), nn.ReLU()]
        width = ARGS.hidden
    return nn.Sequential(*layers, nn.Linear(width, 2), nn.Softmax(dim=-1))


def one_thread_per_process() -> None:
    """One torch thread per process, unless OMP_NUM_THREADS says otherwise: the processes share the cores.

    Several threads per process, each busy-waiting after its small matrix
    products, cost the agent several times its CPU on a small machine.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by the workers' torch when they start
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-world-size", type=int, default=6, help="largest world: agent + observers (default 6)")
    parser.add_argument("--episodes", type=int, default=3, help="timed episodes per row and mode (default 3)")
    parser.add_argument("--steps", type=int, default=100, help="steps per observer per episode (default 100)")
    parser.add_argument("--hidden", type=int, default=2048, help="units per hidden layer (tutorial: 128)")
    parser.add_argument("--layers", type=int, default=2, help="hidden layers (tutorial: 1)")
    parser.add_argument("--plot", default="batch_timing.png", help="where to save the figure ('' for none)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar on a terminal")
    args = parser.parse_args()
    if args.max_world_size < 2:
        parser.error("--max-world-size must be at least 2 (an agent and an observer)")
    return args


async def time_episodes(agent: actorch.ActorRef[Agent], bar: ProgressBar) -> float:
    await agent.call(Agent.run_episode, ARGS.steps)  # warm-up: first forwards, first messages
    bar.advance()
    started = time.perf_counter()
    for _ in range(ARGS.episodes):
        await agent.call(Agent.run_episode, ARGS.steps)
        bar.advance()
    return time.perf_counter() - started


async def time_row(system: actorch.ActorSystem, size: int, bar: ProgressBar) -> tuple[int, float, float]:
    """One row of the table: spawn the observers of world size ``size`` and two agents, time both agents."""
    pattern = f"timing/{size}/*"
    for rank in range(1, size):
        await system.spawn(Observer, args=(make_env,), kwargs={"seed": rank}, name=f"timing/{size}/{rank}", on=rank)
    batched = await system.spawn(Agent, args=(make_policy,), kwargs={"observers": pattern, "seed": 0})
    plain = await system.spawn(Agent, args=(make_policy,), kwargs={"observers": pattern, "batch": False, "seed": 0})
    return size, await time_episodes(batched, bar), await time_episodes(plain, bar)


def plot(rows: list[tuple[int, float, float]], path: str) -> None:
    figure = Figure(figsize=(6, 3.5))
    axes = figure.subplots()
    sizes = [size for size, _, _ in rows]
    axes.plot(sizes, [batched for _, batched, _ in rows], marker="o", label="batched")
    axes.plot(sizes, [plain for _, _, plain in rows], marker="o", label="not batched")
    axes.set(xlabel="world size (agent + observers)", ylabel="seconds", title="The same episodes, batched or not")
    axes.set_xticks(sizes)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


async def main(system: actorch.ActorSystem) -> list[tuple[int, float, float]]:
    print(
        f"{ARGS.episodes} episodes x {ARGS.steps} steps per observer, policy {ARGS.layers} x {ARGS.hidden} units; "
        "episodes timed, process start-up excluded"
    )
    print(f"{'world size':>10}  {'batched s':>10}  {'unbatched s':>11}  {'speed-up':>8}")
    rows = []
    episodes = (system.world_size - 1) * 2 * (1 + ARGS.episodes)  # per row: two agents, warm-up included
    with ProgressBar(episodes, "episodes", enabled=ARGS.progress) as bar:
        for size in range(2, system.world_size + 1):
            bar.update(description=f"world size {size}")
            row = await time_row(system, size, bar)
            rows.append(row)
            print(f"{size:>10}  {row[1]:>10.2f}  {row[2]:>11.2f}  {row[2] / row[1]:>7.2f}x", flush=True)
    if ARGS.plot:
        plot(rows, ARGS.plot)
        print(f"figure saved to {ARGS.plot}")
    return rows


if __name__ == "__main__":
    ARGS = parse_args()
    one_thread_per_process()
    actorch.run(main, world_size=ARGS.max_world_size)
