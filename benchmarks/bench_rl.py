"""Actions per second of one agent and N observers: actorch batched and not, against the raw tutorial agent.

    python benchmarks/bench_rl.py                  # 8 observers, 3 rounds
    python benchmarks/bench_rl.py --quick          # a smoke run

Four sides play the same fixed-length episodes (the batch tutorial's
``n_steps`` runs) with the same policy against the same cheap, deterministic
CartPole-shaped environment, so the figures measure the runtimes rather than
the physics:

- ``actorch batched``: the stock ``Agent`` / ``Observer``, ``select_action_batch``;
- ``actorch unbatched``: the same, one policy forward per state;
- ``raw batched``: the batch RPC tutorial's agent, written here from its text
  (``@rpc.functions.async_execution``, a lock, a shared ``torch.futures.Future``,
  a states tensor indexed by observer id; observers call ``rpc_sync`` per step);
- ``raw unbatched``: the tutorial's plain ``select_action``.

Each round launches one world per runtime (1 + N processes), runs a warm-up
episode and then times ``--episodes`` episodes per mode, learning step
included; rounds alternate the runtimes, and the table gives medians over the
rounds and each side's ratio to the raw batched agent. Process start-up is not
timed. Every process of both runtimes runs torch with ``--threads`` intra-op
threads (``OMP_NUM_THREADS``; default 1, as N + 1 processes share the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import nn
from torch.distributions import Categorical

import actorch
from actorch import Agent, Observer

SIDES = ("actorch batched", "actorch unbatched", "raw batched", "raw unbatched")


class FakePole:
    """CartPole's shapes (4 floats in, 2 actions), none of its physics; an episode lasts ``length`` steps."""

    def __init__(self, length: int = 200) -> None:
        self.length = length
        self.steps = 0

    def reset(self, seed: int | None = None) -> tuple[list[float], dict[str, Any]]:
        self.steps = 0
        return [0.0, 0.0, 0.0, 0.0], {}

    def step(self, action: int) -> tuple[list[float], float, bool, bool, dict[str, Any]]:
        self.steps += 1
        x = self.steps / self.length
        return [x, -x, 0.5 * x, float(action)], 1.0, False, self.steps >= self.length, {}


class Policy(nn.Module):
    """The tutorials' policy; ``dim`` is the softmax dimension (2 for the raw batch agent's ``[n, 1, 4]``)."""

    def __init__(self, hidden: int = 128, dim: int = -1) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, hidden)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(hidden, 2)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.affine2(torch.relu(self.dropout(self.affine1(x)))), dim=self.dim)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --------------------------------------------------------------------------- actorch side


def make_policy() -> nn.Module:
    return Policy(int(os.environ["BENCH_RL_HIDDEN"]))


def run_actorch(args: argparse.Namespace) -> dict[str, float]:
    async def main(system: actorch.ActorSystem) -> dict[str, float]:
        for rank in range(1, system.world_size):
            await system.spawn(Observer, args=(FakePole,), name=f"bench/observers/{rank}", on=rank)
        seconds = {}
        for batch in (True, False):
            agent = await system.spawn(
                Agent, args=(make_policy,), kwargs={"observers": "bench/observers/*", "batch": batch}
            )
            await agent.call(Agent.run_episode, args.steps)  # warm-up
            started = time.perf_counter()
            for _ in range(args.episodes):
                await agent.call(Agent.run_episode, args.steps)
            seconds["actorch batched" if batch else "actorch unbatched"] = time.perf_counter() - started
            await agent.stop()
        return seconds

    os.environ["BENCH_RL_HIDDEN"] = str(args.hidden)
    return actorch.run(main, world_size=args.observers + 1, configure_logs=False)


# --------------------------------------------------------------------------- the raw tutorial side


class RawObserver:
    def __init__(self, batch: bool) -> None:
        self.id = rpc.get_worker_info().id - 1
        self.env = FakePole()
        self.select_action = RawAgent.select_action_batch if batch else RawAgent.select_action

    def run_episode(self, agent_rref: Any, n_steps: int) -> torch.Tensor:
        state, _ = self.env.reset()
        rewards = torch.zeros(n_steps)
        for step in range(n_steps):
            tensor = torch.tensor(state, dtype=torch.float32).unsqueeze(0)
            action = rpc.rpc_sync(agent_rref.owner(), self.select_action, args=(agent_rref, self.id, tensor))
            state, reward, terminated, truncated, _ = self.env.step(action)
            rewards[step] = reward
            if terminated or truncated:
                state, _ = self.env.reset()
        return rewards


class RawAgent:
    def __init__(self, world_size: int, batch: bool, hidden: int) -> None:
        self.ob_rrefs = [rpc.remote(f"observer{rank}", RawObserver, args=(batch,)) for rank in range(1, world_size)]
        self.agent_rref = rpc.RRef(self)
        self.policy = Policy(hidden, dim=2 if batch else 1)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-2)
        self.batch = batch
        self.reset()
        self.lock = threading.Lock()

    def reset(self) -> None:
        count = len(self.ob_rrefs)
        self.states = torch.zeros(count, 1, 4)
        self.saved_log_probs: Any = [] if self.batch else {k: [] for k in range(count)}
        self.future_actions: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self.pending_states = count

    @staticmethod
    def select_action(agent_rref: Any, ob_id: int, state: torch.Tensor) -> int:
        self = agent_rref.local_value()
        probs = self.policy(state)
        m = Categorical(probs)
        action = m.sample()
        self.saved_log_probs[ob_id].append(m.log_prob(action))
        return int(action.item())

    @staticmethod
    @rpc.functions.async_execution
    def select_action_batch(agent_rref: Any, ob_id: int, state: torch.Tensor) -> torch.futures.Future[int]:
        self = agent_rref.local_value()
        self.states[ob_id].copy_(state)
        future_action = self.future_actions.then(lambda future_actions: int(future_actions.wait()[ob_id].item()))
        with self.lock:
            self.pending_states -= 1
            if self.pending_states == 0:
                self.pending_states = len(self.ob_rrefs)
                probs = self.policy(self.states.clone())  # the tutorial's .cuda() copy: states change in place
                m = Categorical(probs)
                actions = m.sample()
                self.saved_log_probs.append(m.log_prob(actions).t()[0])
                future_actions = self.future_actions
                self.future_actions = torch.futures.Future()
                future_actions.set_result(actions)
        return future_action

    def run_episode(self, n_steps: int) -> None:
        futures = [ob_rref.rpc_async().run_episode(self.agent_rref, n_steps) for ob_rref in self.ob_rrefs]
        rets = torch.futures.wait_all(futures)
        rewards = torch.stack(rets).t()
        if self.batch:
            probs = torch.stack(self.saved_log_probs)
        else:
            probs = torch.stack([torch.stack(self.saved_log_probs[i]) for i in range(len(rets))]).squeeze(-1).t()
        policy_loss = -probs * rewards / len(rets)
        policy_loss.sum().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.reset()


def raw_worker(rank: int, world_size: int, port: int, args: argparse.Namespace, out: Any) -> None:
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"])
    name = "agent" if rank == 0 else f"observer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    if rank == 0:
        seconds = {}
        for batch in (True, False):
            agent = RawAgent(world_size, batch, args.hidden)
            agent.run_episode(args.steps)  # warm-up
            started = time.perf_counter()
            for _ in range(args.episodes):
                agent.run_episode(args.steps)
            seconds["raw batched" if batch else "raw unbatched"] = time.perf_counter() - started
        out.put(seconds)
    rpc.shutdown()


def run_raw(args: argparse.Namespace) -> dict[str, float]:
    context = mp.get_context("spawn")
    out = context.SimpleQueue()
    mp.start_processes(
        raw_worker,
        args=(args.observers + 1, free_port(), args, out),
        nprocs=args.observers + 1,
        join=True,
        start_method="spawn",
    )
    result: dict[str, float] = out.get()
    return result


# --------------------------------------------------------------------------- the driver


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--observers", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=3, help="timed episodes per mode and round")
    parser.add_argument("--steps", type=int, default=200, help="steps per observer per episode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128, help="policy width (the tutorial's: 128)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process (default 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 observers, 1 round, short episodes")
    parser.add_argument("--side", choices=("actorch", "raw"), help=argparse.SUPPRESS)  # one world, in a child
    parser.add_argument("--json", help="also write the medians to this file")
    args = parser.parse_args()
    if args.quick:
        args.observers, args.episodes, args.steps, args.rounds = 2, 1, 20, 1
    return args


def one_world(side: str, args: argparse.Namespace) -> dict[str, float]:
    """Run one runtime's world in a child process (a fresh torch RPC per world) and read its seconds."""
    argv = [sys.executable, __file__, "--side", side, "--observers", str(args.observers), "--episodes"]
    argv += [str(args.episodes), "--steps", str(args.steps), "--hidden", str(args.hidden)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("SECONDS ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{side} world failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    seconds: dict[str, float] = json.loads(lines[-1].removeprefix("SECONDS "))
    return seconds


def main() -> None:
    args = parse_args()
    if args.side is not None:
        seconds = run_actorch(args) if args.side == "actorch" else run_raw(args)
        print("SECONDS " + json.dumps(seconds), flush=True)
        return
    actions = args.observers * args.steps * args.episodes
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs; {args.observers} observers x {args.steps} steps x "
        f"{args.episodes} episodes = {actions} actions per side and round; policy width {args.hidden}; "
        f"{args.threads} torch thread(s) per process; {args.rounds} rounds"
    )
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    for round_index in range(args.rounds):
        order = ("raw", "actorch") if round_index % 2 == 0 else ("actorch", "raw")
        for side in order:
            for name, seconds in one_world(side, args).items():
                rates[name].append(actions / seconds)
        print(
            f"round {round_index + 1}: " + ", ".join(f"{side} {rates[side][-1]:,.0f}/s" for side in SIDES), flush=True
        )
    medians = {side: statistics.median(values) for side, values in rates.items()}
    reference = medians["raw batched"]
    print(f"\n{'side':<20} {'actions/s':>10} {'vs raw batched':>15}")
    for side in SIDES:
        print(f"{side:<20} {medians[side]:>10,.0f} {medians[side] / reference:>14.2f}x")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"medians": medians, "rates": rates, "args": vars(args)}, file, indent=2)


if __name__ == "__main__":
    main()
