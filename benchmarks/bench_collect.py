"""Frames of RL experience per second delivered to one learner: actorch's two designs against TorchRL's collectors.

    python benchmarks/bench_collect.py                    # 2 and 4 workers, 3 rounds
    python benchmarks/bench_collect.py --quick            # a smoke run: one short round, 2 workers
    pip install -e '.[bench]'                             # TorchRL, for its two sides

Every side plays Gymnasium's CartPole-v1 with the same policy (an MLP 4 -> 128
-> 2 giving action probabilities, the action sampled), on the CPU with one
torch thread per process, in 1 + N processes: N workers and one learner, which
receives the experience and counts it (no learning step, so that the figures
measure collection). The sides:

- ``agent K=1``: actorch's stock ``Agent`` and ``Observer`` s, the RL guide's
  design for big policies: the policy lives on the learner, which answers every
  observer's state each step in one batched forward (``Agent.collect``);
- ``agent K=8``: the same with 8 environments per observer, so one message
  carries 8 states and its reply 8 actions;
- ``local K=8``: actorch's ``Collector`` s, each with a copy of the policy and 8
  environments, streaming batches of ``--frames-per-batch`` transitions to a
  ``Collection`` on the learner (the design for small policies);
- ``torchrl rpc``: TorchRL's ``RPCCollector`` (``launcher="mp"``, asynchronous),
  one environment per worker;
- ``torchrl multiasync``: TorchRL's ``MultiAsyncCollector`` (shared memory, one box).

Each side runs in a process of its own (``--side``), alternating in every
round; a side warms up, then counts the frames delivered in ``--seconds`` and
the CPU time the learner's process spent meanwhile. The table gives medians
over the rounds, frames per second, learner CPU per frame, and each side's
ratio to ``torchrl rpc`` (and to ``torchrl multiasync`` for the local
collector). TorchRL is optional: without it (``pip install -e '.[bench]'``, or
``--torchrl-python`` naming an interpreter that has it) the actorch sides run alone.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

SIDES = ("agent K=1", "agent K=8", "local K=8", "torchrl rpc", "torchrl multiasync")
TORCHRL_SIDES = ("torchrl rpc", "torchrl multiasync")
HIDDEN = 128


def make_env() -> Any:
    import gymnasium  # noqa: PLC0415 - a side process imports what its side needs

    return gymnasium.make("CartPole-v1")


def make_policy() -> Any:
    from torch import nn  # noqa: PLC0415

    return nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2), nn.Softmax(dim=-1))


def process_cpu() -> float:
    times = os.times()
    return times.user + times.system


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Meter:
    """Counts frames after a warm-up, for ``seconds``; reads this process's CPU over the same span."""

    def __init__(self, warmup: int, seconds: float) -> None:
        self.warmup = warmup
        self.seconds = seconds
        self.frames = 0
        self.started: float | None = None
        self.cpu = 0.0
        self.result: dict[str, float] | None = None

    def add(self, frames: int) -> bool:
        """Count ``frames``; True once the measured span is over."""
        if self.started is None:
            self.warmup -= frames
            if self.warmup <= 0:
                self.started, self.cpu = time.perf_counter(), process_cpu()
            return False
        self.frames += frames
        elapsed = time.perf_counter() - self.started
        if elapsed < self.seconds:
            return False
        cpu = process_cpu() - self.cpu
        self.result = {"fps": self.frames / elapsed, "cpu_us": cpu / self.frames * 1e6, "frames": self.frames}
        return True


# --------------------------------------------------------------------------- actorch sides


def run_agent(args: argparse.Namespace, envs: int) -> dict[str, float]:
    import actorch  # noqa: PLC0415

    async def main(system: actorch.ActorSystem) -> dict[str, float]:
        for rank in range(1, system.world_size):
            kwargs = {"num_envs": envs, "seed": rank}
            await system.spawn(
                actorch.Observer, args=(make_env,), kwargs=kwargs, name=f"bench/observers/{rank}", on=rank
            )
        agent = await system.spawn(
            actorch.Agent, args=(make_policy,), kwargs={"observers": "bench/observers/*", "seed": 0}
        )
        meter = Meter(args.warmup, args.seconds)
        steps = max(args.frames_per_batch // envs, 1)
        while True:
            rollouts = await agent.call(actorch.Agent.collect, steps)
            if meter.add(sum(len(rollout.rewards) for rollout in rollouts)):
                assert meter.result is not None
                return meter.result

    return actorch.run(main, world_size=args.workers + 1, configure_logs=False)


def run_local(args: argparse.Namespace, envs: int) -> dict[str, float]:
    import actorch  # noqa: PLC0415

    async def main(system: actorch.ActorSystem) -> dict[str, float]:
        collectors = []
        for rank in range(1, system.world_size):
            kwargs = {"num_envs": envs, "frames_per_batch": args.frames_per_batch, "seed": rank}
            name = f"bench/collectors/{rank}"
            collectors.append(
                await system.spawn(actorch.Collector, args=(make_env, make_policy), kwargs=kwargs, name=name, on=rank)
            )
        meter = Meter(args.warmup, args.seconds)
        async with actorch.Collection(collectors, window=2) as collection:
            async for batch in collection:
                if meter.add(batch.frames):
                    break
        assert meter.result is not None
        return meter.result

    return actorch.run(main, world_size=args.workers + 1, configure_logs=False)


# --------------------------------------------------------------------------- TorchRL sides


def torchrl_env() -> Any:
    from torchrl.envs import GymEnv  # noqa: PLC0415

    return GymEnv("CartPole-v1", categorical_action_encoding=True)


def torchrl_policy() -> Any:
    from tensordict.nn import TensorDictModule  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415
    from torch.distributions import Categorical  # noqa: PLC0415
    from torchrl.modules import ProbabilisticActor  # noqa: PLC0415

    # The same MLP; TorchRL's actor samples from logits, so the softmax is the distribution's.
    net = nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(module, in_keys=["logits"], out_keys=["action"], distribution_class=Categorical)


def run_torchrl(args: argparse.Namespace, side: str) -> dict[str, float]:
    if side == "torchrl rpc":
        from torchrl.collectors.distributed import RPCCollector  # noqa: PLC0415

        collector = RPCCollector(
            [torchrl_env] * args.workers,
            policy_factory=torchrl_policy,
            frames_per_batch=args.frames_per_batch,
            total_frames=10**12,  # RPCCollector takes no endless run (-1)
            launcher="mp",
            sync=False,
            tcp_port=free_port(),
        )
    else:
        from torchrl.collectors import MultiAsyncCollector  # noqa: PLC0415

        collector = MultiAsyncCollector(
            [torchrl_env] * args.workers,
            policy_factory=torchrl_policy,
            frames_per_batch=args.frames_per_batch,
            total_frames=-1,
        )
    meter = Meter(args.warmup, args.seconds)
    try:
        for batch in collector:
            if meter.add(batch.numel()):
                break
    finally:
        collector.shutdown()
    assert meter.result is not None
    return meter.result


def run_side(args: argparse.Namespace) -> None:
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    side = args.side
    if side.startswith("agent"):
        result = run_agent(args, int(side.split("=")[1]))
    elif side.startswith("local"):
        result = run_local(args, int(side.split("=")[1]))
    else:
        result = run_torchrl(args, side)
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- the driver


def has_torchrl(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import torchrl, tensordict, gymnasium"], capture_output=True, check=False)
    return probe.returncode == 0


def measure(args: argparse.Namespace, side: str, workers: int) -> dict[str, float] | None:
    python = args.torchrl_python if side in TORCHRL_SIDES else sys.executable
    command = [
        python,
        os.path.abspath(__file__),
        "--side",
        side,
        "--workers",
        str(workers),
        "--seconds",
        str(args.seconds),
        "--warmup",
        str(args.warmup),
        "--frames-per-batch",
        str(args.frames_per_batch),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    ran = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.seconds * 10 + 180, check=False)
    for line in ran.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    print(f"  {side} with {workers} workers failed (exit {ran.returncode}):\n{ran.stderr[-2000:]}", file=sys.stderr)
    return None


def report(results: dict[tuple[str, int], list[dict[str, float]]], sides: list[str], workers: list[int]) -> None:
    def median(side: str, count: int, key: str) -> float | None:
        rows = results.get((side, count), [])
        return statistics.median(row[key] for row in rows) if rows else None

    print()
    header = f"{'side':22}" + "".join(f"{f'fps, {count} workers':>20}{'learner CPU/frame':>19}" for count in workers)
    print(header)
    for side in sides:
        cells = ""
        for count in workers:
            fps, cpu = median(side, count, "fps"), median(side, count, "cpu_us")
            cells += f"{fps:>20,.0f}{cpu:>16.0f} us" if fps is not None and cpu is not None else f"{'-':>20}{'-':>19}"
        print(f"{side:22}{cells}")
    print()
    for base in TORCHRL_SIDES:
        for count in workers:
            reference = median(base, count, "fps")
            if reference is None:
                continue
            ratios = []
            for side in sides:
                fps = median(side, count, "fps")
                if fps is not None and side not in TORCHRL_SIDES:
                    ratios.append(f"{side} {fps / reference:.2f}x")
            print(f"against {base}, {count} workers: " + ", ".join(ratios))


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4], help="worker counts to measure")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per side and round")
    parser.add_argument("--warmup", type=int, default=4000, help="frames delivered before the measurement starts")
    parser.add_argument("--frames-per-batch", type=int, default=1024)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--torchrl-python", default=sys.executable, help="the interpreter of TorchRL's sides")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one short round with 2 workers")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side is not None:
        args.workers = args.workers[0]
        run_side(args)
        return
    if args.quick:
        args.rounds, args.workers, args.seconds, args.warmup, args.frames_per_batch = 1, [2], 1.0, 500, 256
    sides = list(args.sides)
    if any(side in TORCHRL_SIDES for side in sides) and not has_torchrl(args.torchrl_python):
        print(
            f"TorchRL is not installed for {args.torchrl_python}: its sides are left out.\n"
            "Install it with  pip install -e '.[bench]'  (torchrl pinned to a release that keeps torch 2.13), "
            "or name another interpreter with --torchrl-python.",
            file=sys.stderr,
        )
        sides = [side for side in sides if side not in TORCHRL_SIDES]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for round_index in range(args.rounds):
        for count in args.workers:
            for side in sides:
                outcome = measure(args, side, count)
                if outcome is not None:
                    results.setdefault((side, count), []).append(outcome)
                    print(
                        f"round {round_index + 1}, {count} workers, {side}: {outcome['fps']:,.0f} frames/s, "
                        f"learner {outcome['cpu_us']:.0f} us CPU per frame",
                        flush=True,
                    )
    print(
        f"\nmedians of {args.rounds} rounds, {args.seconds:g} s each, CartPole-v1, MLP 4-{HIDDEN}-2, one torch thread"
    )
    report(results, sides, args.workers)


if __name__ == "__main__":
    cli()
