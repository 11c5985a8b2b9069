"""Frames of RL experience per second delivered to one learner: actorch's designs, TorchRL's collectors, and the limit.

    python benchmarks/bench_collect.py                       # both workloads, 2 and 4 workers, 3 rounds
    python benchmarks/bench_collect.py --workload cartpole   # one workload
    python benchmarks/bench_collect.py --quick               # a smoke run: one short round, 2 workers
    pip install -e '.[bench]'                                # TorchRL, for its sides

Two workloads, the same on every side:

- ``cartpole``: Gymnasium's CartPole-v1 with an MLP 4 -> 128 -> 2 giving
  logits (the action sampled from them), batches of ``--frames-per-batch``
  (1,024) frames per worker;
- ``pixels``: an environment with Atari's observations (uint8, 4 x 84 x 84)
  and steps that cost next to nothing, with a small convolutional policy (two
  convolutions and two linear layers, its input cast to float in its
  forward), batches of 256 frames per worker.

Every process runs one torch thread. Each side runs 1 + N processes, N
workers and one learner that receives the experience and counts it (no
learning step, so the figures measure collection), or, for the limit, only
the workers. The sides (K is the number of environments per worker):

- ``limit K``: the machine's limit. A plain loop in one process, with no
  messaging at all: the same K environments and policy, the batch written in
  place, and the malloc settings a collector's process takes (it keeps the
  memory each step frees; see ``Collector``). It runs in as many processes at once as the cores allow
  (``min(N, cores)``), since the learner here takes next to no CPU, so its
  frames per second are the plain loop's per process times the cores left
  for collection, measured under the same load as the other sides;
- ``collector K``: actorch's ``Collector`` s, each with a copy of the policy
  and K environments, streaming batches to one ``Collection`` on the learner
  (on one host, through slots of shared memory the batches name);
- ``collector by value K`` (pixels): the same with ``Collection(...,
  shared_memory=False)``: every batch by value, over TensorPipe (its own
  shared memory with ``--transport shm``);
- ``agent K``: actorch's ``Agent`` and ``Observer`` s (the policy on the
  learner, one message per observer step carrying K states; ``Agent.collect``);
- ``torchrl multiasync K``: TorchRL's ``MultiAsyncCollector`` (shared memory);
- ``torchrl rpc K``: TorchRL's ``RPCCollector`` (torch RPC, ``launcher="mp"``,
  asynchronous).

TorchRL's K environments per worker take the fastest of the forms it offers
(``SerialEnv(K, ...)``, a synchronous Gymnasium vector environment in a
``GymWrapper``, or ``GymEnv(..., num_envs=K)``, whose environments run in
processes of their own): before the rounds, each form runs once as
``torchrl multiasync K`` and the fastest is used for every TorchRL side of K
environments; the output names it.

What is counted: only the frames delivered to the learner (for the limit,
written into a finished batch) after a warm-up of ``--warmup`` frames, over
``--seconds``. CPU per frame is the CPU time of every process of the side (the
learner, the workers and whatever they started), read from ``/proc`` over the
same span, divided by those frames, and so are the minor page faults of
those processes (``faults``); the learner's cores are its own CPU time
over the span's wall time. Each round runs every side once, in a process of
its own, one after the other; the tables give medians over the rounds, each
side's fraction of the limit of the same K measured in the same rounds, and
the load average (``/proc/loadavg``) the rounds saw. Absolute figures move
with the machine and its load; fractions and ratios of the same run are what
compare. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

HIDDEN = 128
PIXELS = (4, 84, 84)
PIXEL_ACTIONS = 4
PIXEL_EPISODE = 400  # mean steps of a pixel episode (its end is drawn, so that episodes differ)
ENV_FORMS = ("serial", "vector", "async")
RUN_OPTIONS = {"liveness_timeout": 60.0}
"""A loaded machine may starve a node for seconds: the bench measures collection, not failure detection."""
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    frames_per_batch: int
    sides: tuple[str, ...]
    env_forms: tuple[str, ...]


WORKLOADS = {
    "cartpole": Workload(
        "cartpole",
        1024,
        (
            "limit K=1",
            "limit K=8",
            "agent K=1",
            "agent K=8",
            "collector K=8",
            "torchrl multiasync K=1",
            "torchrl multiasync K=8",
            "torchrl rpc K=1",
            "torchrl rpc K=8",
        ),
        ENV_FORMS,
    ),
    "pixels": Workload(
        "pixels",
        256,
        (
            "limit K=8",
            "agent K=8",
            "collector K=8",
            "collector by value K=8",
            "torchrl multiasync K=8",
            "torchrl rpc K=8",
        ),
        ("serial", "vector"),
    ),
}


MINE = ("collector", "agent")
BASE = " @base"
"""The mark of a side run from the checkout ``--compare`` names."""


def split_side(side: str) -> tuple[str, int]:
    kind, _, envs = side.removesuffix(BASE).rpartition(" K=")
    return kind, int(envs)


# --------------------------------------------------------------------------- the workloads


def make_cartpole() -> Any:
    import gymnasium  # noqa: PLC0415 - a side process imports what its side needs

    return gymnasium.make("CartPole-v1")


def cartpole_policy(probabilities: bool = True) -> Any:
    from torch import nn  # noqa: PLC0415

    layers = [nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2)]
    return nn.Sequential(*layers, nn.Softmax(dim=-1)) if probabilities else nn.Sequential(*layers)


def pixel_env_class() -> type:
    import gymnasium  # noqa: PLC0415
    import numpy  # noqa: PLC0415

    class PixelEnv(gymnasium.Env):  # type: ignore[misc]
        """Atari-shaped observations from a bank of random frames; a step costs a frame's copy and little more."""

        def __init__(self) -> None:
            self.observation_space = gymnasium.spaces.Box(0, 255, PIXELS, numpy.uint8)
            self.action_space = gymnasium.spaces.Discrete(PIXEL_ACTIONS)
            self.bank = numpy.random.default_rng(0).integers(0, 256, (16, *PIXELS), dtype=numpy.uint8)
            self.t = 0

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
            super().reset(seed=seed)
            self.t = int(self.np_random.integers(16))
            return self.bank[self.t].copy(), {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
            self.t += 1
            ended = bool(self.np_random.random() < 1 / PIXEL_EPISODE)
            return self.bank[self.t % 16].copy(), 1.0, ended, False, {}

    return PixelEnv


def make_pixels() -> Any:
    return pixel_env_class()()


def pixel_policy(probabilities: bool = True) -> Any:
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    class PixelPolicy(nn.Module):
        """Two convolutions and two linear layers over uint8 frames, cast to float here, not in the batch."""

        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv2d(4, 16, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(16, 32, 4, stride=2),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(32 * 9 * 9, 256),
                nn.ReLU(),
                nn.Linear(256, PIXEL_ACTIONS),
            )

        def forward(self, frames: torch.Tensor) -> torch.Tensor:
            logits = self.net(frames.float() / 255)
            return logits.softmax(-1) if probabilities else logits

    return PixelPolicy()


def make_env(workload: str) -> Any:
    return make_cartpole() if workload == "cartpole" else make_pixels()


def make_policy(workload: str) -> Any:
    return cartpole_policy() if workload == "cartpole" else pixel_policy()


def cartpole_env() -> Any:
    return make_cartpole()


def cartpole_probabilities() -> Any:
    return cartpole_policy()


def pixel_env() -> Any:
    return make_pixels()


def pixel_probabilities() -> Any:
    return pixel_policy()


FACTORIES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "cartpole": (cartpole_env, cartpole_probabilities),
    "pixels": (pixel_env, pixel_probabilities),
}
"""Module-level functions (they travel to the workers by reference): the environment and the actorch policy."""


# --------------------------------------------------------------------------- measuring


def process_cpu() -> float:
    times = os.times()
    return times.user + times.system


def tree_usage() -> dict[int, tuple[float, int]]:
    """CPU seconds and minor page faults of this process and every process descending from it, by pid (``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    usage: dict[int, tuple[float, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        usage[int(entry)] = ((int(fields[11]) + int(fields[12])) / ticks, int(fields[7]))
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return {pid: usage[pid] for pid in mine}


def spent(before: dict[int, tuple[float, int]], after: dict[int, tuple[float, int]]) -> tuple[float, int]:
    """CPU seconds and minor faults of a process tree between two readings (processes started since count whole)."""
    cpu = sum(seconds - before.get(pid, (0.0, 0))[0] for pid, (seconds, _) in after.items())
    faults = sum(count - before.get(pid, (0.0, 0))[1] for pid, (_, count) in after.items())
    return cpu, faults


def load_average() -> float:
    with open("/proc/loadavg") as loadavg:
        return float(loadavg.read().split()[0])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cores() -> int:
    return len(os.sched_getaffinity(0))


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a batch (a dataclass of tensors, a TensorDict, a list of rollouts)."""
    import torch  # noqa: PLC0415

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if hasattr(value, "bytes") and callable(value.bytes):  # a TensorDict
        return int(value.bytes())
    if dataclasses.is_dataclass(value):
        return sum(tensor_bytes(getattr(value, field.name)) for field in dataclasses.fields(value))
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(item) for item in value)
    return 0


class Meter:
    """Counts frames delivered after a warm-up, for ``seconds``; CPU of the process tree and of the learner."""

    def __init__(self, warmup: int, seconds: float) -> None:
        self.warmup = warmup
        self.seconds = seconds
        self.frames = 0
        self.bytes = 0
        self.started: float | None = None
        self.tree: dict[int, tuple[float, int]] = {}
        self.learner = 0.0
        self.result: dict[str, float] | None = None

    def add(self, frames: int, batch: Any = None) -> bool:
        """Count a delivered batch of ``frames``; True once the measured span is over."""
        if self.started is None:
            self.warmup -= frames
            if self.warmup <= 0:
                self.tree, self.learner = tree_usage(), process_cpu()
                self.started = time.perf_counter()
            return False
        self.frames += frames
        if batch is not None:
            self.bytes += tensor_bytes(batch)
        elapsed = time.perf_counter() - self.started
        if elapsed < self.seconds:
            return False
        learner = process_cpu() - self.learner
        now = tree_usage()
        cpu, faults = spent(self.tree, now)
        self.result = {
            "fps": self.frames / elapsed,
            "cpu_us": cpu / self.frames * 1e6,
            "faults": faults / self.frames,
            "cores": cpu / elapsed,
            "learner_cores": learner / elapsed,
            "bytes_per_s": self.bytes / elapsed,
            "frames": self.frames,
            "processes": len(now),
            "load": load_average(),
        }
        return True


# --------------------------------------------------------------------------- the limit: a plain loop, no messaging


def plain_batches(workload: str, envs: int, frames_per_batch: int, seed: int) -> Iterator[int]:
    """Play ``envs`` environments with the policy in this process, writing each batch in place; yield frames."""
    import numpy  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from actorch._stock.policies import sample_categorical  # noqa: PLC0415 - the sampling the collector uses

    played = [make_env(workload) for _ in range(envs)]
    policy = make_policy(workload)
    policy.requires_grad_(False)
    generator = torch.Generator()
    generator.manual_seed(seed)
    states = numpy.stack([env.reset(seed=seed + index)[0] for index, env in enumerate(played)])
    steps = frames_per_batch // envs
    while True:
        observations = torch.empty((steps, *states.shape), dtype=torch.from_numpy(states).dtype)
        finals = torch.empty_like(observations)
        rewards = torch.empty((steps, envs))
        terminated = torch.zeros((steps, envs), dtype=torch.bool)
        truncated = torch.zeros((steps, envs), dtype=torch.bool)
        seen, final, reward, ended, cut = (t.numpy() for t in (observations, finals, rewards, terminated, truncated))
        seen[0] = states
        actions, log_probs = [], []
        for step in range(steps):
            with torch.no_grad():
                action, log_prob = sample_categorical(policy(observations[step]), generator)
            actions.append(action)
            log_probs.append(log_prob)
            finished = []
            for index, (env, chosen) in enumerate(zip(played, action.tolist(), strict=True)):
                observation, reward[step, index], ended[step, index], cut[step, index], _ = env.step(chosen)
                final[step, index] = observation
                if ended[step, index] or cut[step, index]:
                    finished.append(index)
            following = seen[step + 1] if step + 1 < steps else states
            following[:] = final[step]
            for index in finished:
                following[index] = played[index].reset()[0]
        torch.stack(actions)
        torch.stack(log_probs)
        yield frames_per_batch


def plain_process(args: dict[str, Any], seed: int, ready: Any, results: Any) -> None:
    import torch  # noqa: PLC0415

    from actorch._stock.heap import keep_freed_memory  # noqa: PLC0415 - the malloc settings a collector runs with

    torch.set_num_threads(1)
    keep_freed_memory()
    batches = plain_batches(args["workload"], args["envs"], args["frames_per_batch"], seed)
    warmup = args["warmup"]
    while warmup > 0:
        warmup -= next(batches)
    ready.wait()
    frames, started, cpu = 0, time.perf_counter(), process_cpu()
    while time.perf_counter() - started < args["seconds"]:
        frames += next(batches)
    results.put((frames, time.perf_counter() - started, process_cpu() - cpu))


def run_limit(args: argparse.Namespace, envs: int) -> dict[str, float]:
    """``min(workers, cores)`` plain loops at once, each in a process of its own; their frames summed."""
    count = min(args.workers, cores())
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(count + 1)
    results = context.Queue()
    plain = {
        "workload": args.workload,
        "envs": envs,
        "frames_per_batch": args.frames_per_batch,
        "warmup": args.warmup // count,
        "seconds": args.seconds,
    }
    processes = [context.Process(target=plain_process, args=(plain, rank, ready, results)) for rank in range(count)]
    for process in processes:
        process.start()
    ready.wait()
    tree, learner, started = tree_usage(), process_cpu(), time.perf_counter()
    outcomes = [results.get(timeout=args.seconds * 10 + 120) for _ in processes]
    elapsed = time.perf_counter() - started
    now = tree_usage()
    for process in processes:
        process.join()
    frames = sum(frames for frames, _, _ in outcomes)
    fps = sum(frames / seconds for frames, seconds, _ in outcomes)
    cpu, faults = spent(tree, now)
    return {
        "fps": fps,
        "cpu_us": cpu / frames * 1e6,
        "faults": faults / frames,
        "cores": cpu / elapsed,
        "learner_cores": (process_cpu() - learner) / elapsed,
        "bytes_per_s": 0.0,
        "frames": frames,
        "processes": count,
        "per_process_fps": fps / count,
        "load": load_average(),
    }


# --------------------------------------------------------------------------- actorch sides


def run_agent(args: argparse.Namespace, envs: int) -> dict[str, float]:
    import actorch  # noqa: PLC0415

    make, policy = FACTORIES[args.workload]

    async def main(system: actorch.ActorSystem) -> dict[str, float]:
        for rank in range(1, system.world_size):
            kwargs = {"num_envs": envs, "seed": rank}
            await system.spawn(actorch.Observer, args=(make,), kwargs=kwargs, name=f"bench/observers/{rank}", on=rank)
        agent = await system.spawn(actorch.Agent, args=(policy,), kwargs={"observers": "bench/observers/*", "seed": 0})
        meter = Meter(args.warmup, args.seconds)
        steps = max(args.frames_per_batch // envs, 1)
        while True:
            rollouts = await agent.call(actorch.Agent.collect, steps)
            if meter.add(sum(len(rollout.rewards) for rollout in rollouts), rollouts):
                assert meter.result is not None
                return meter.result

    return actorch.run(
        main,
        world_size=args.workers + 1,
        configure_logs=False,
        **RUN_OPTIONS,
        transport=actorch.TorchRpc(tensorpipe=args.transport),
    )


def run_collector(args: argparse.Namespace, envs: int, *, shared_memory: bool = True) -> dict[str, float]:
    import actorch  # noqa: PLC0415

    make, policy = FACTORIES[args.workload]

    async def main(system: actorch.ActorSystem) -> dict[str, float]:
        collectors = []
        for rank in range(1, system.world_size):
            kwargs = {"num_envs": envs, "frames_per_batch": args.frames_per_batch, "seed": rank}
            name = f"bench/collectors/{rank}"
            collectors.append(
                await system.spawn(actorch.rl.Collector, args=(make, policy), kwargs=kwargs, name=name, on=rank)
            )
        meter = Meter(args.warmup, args.seconds)
        options = {} if shared_memory else {"shared_memory": False}  # a --compare base may predate the option
        async with actorch.rl.Collection(collectors, window=args.window, **options) as collection:
            async for batch in collection:
                if meter.add(batch.frames, batch):
                    break
        assert meter.result is not None
        return meter.result

    return actorch.run(
        main,
        world_size=args.workers + 1,
        configure_logs=False,
        **RUN_OPTIONS,
        transport=actorch.TorchRpc(tensorpipe=args.transport),
    )


# --------------------------------------------------------------------------- TorchRL sides


def torchrl_single(workload: str) -> Any:
    from torchrl.envs import GymEnv, GymWrapper  # noqa: PLC0415

    if workload == "cartpole":
        return GymEnv("CartPole-v1", categorical_action_encoding=True)
    return GymWrapper(make_pixels(), categorical_action_encoding=True)


def torchrl_env(workload: str, envs: int, form: str) -> Any:
    """TorchRL's environment of ``envs`` sub-environments in ``form`` (see the module's documentation)."""
    from torchrl.envs import GymEnv, GymWrapper, SerialEnv  # noqa: PLC0415

    if envs == 1:
        return torchrl_single(workload)
    if form == "serial":
        return SerialEnv(envs, functools.partial(torchrl_single, workload))
    if form == "async":
        assert workload == "cartpole"
        return GymEnv("CartPole-v1", num_envs=envs, categorical_action_encoding=True)
    import gymnasium  # noqa: PLC0415

    # TorchRL takes a vector environment that resets only when told to (it resets finished ones itself).
    disabled = gymnasium.vector.AutoresetMode.DISABLED
    vector = gymnasium.vector.SyncVectorEnv([functools.partial(make_env, workload)] * envs, autoreset_mode=disabled)
    return GymWrapper(vector, categorical_action_encoding=True)


def torchrl_policy(workload: str) -> Any:
    from tensordict.nn import TensorDictModule  # noqa: PLC0415
    from torch.distributions import Categorical  # noqa: PLC0415
    from torchrl.modules import ProbabilisticActor  # noqa: PLC0415

    # The same network; TorchRL's actor samples from logits, so the softmax is the distribution's.
    net = cartpole_policy(probabilities=False) if workload == "cartpole" else pixel_policy(probabilities=False)
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(module, in_keys=["logits"], out_keys=["action"], distribution_class=Categorical)


def run_torchrl(args: argparse.Namespace, kind: str, envs: int) -> dict[str, float]:
    make = [functools.partial(torchrl_env, args.workload, envs, args.env_form)] * args.workers
    policy = functools.partial(torchrl_policy, args.workload)
    if kind == "torchrl rpc":
        from torchrl.collectors.distributed import RPCCollector  # noqa: PLC0415

        collector = RPCCollector(
            make,
            policy_factory=policy,
            frames_per_batch=args.frames_per_batch,
            total_frames=10**12,  # RPCCollector takes no endless run (-1)
            launcher="mp",
            sync=False,
            tcp_port=free_port(),
        )
    else:
        from torchrl.collectors import MultiAsyncCollector  # noqa: PLC0415

        collector = MultiAsyncCollector(
            make, policy_factory=policy, frames_per_batch=args.frames_per_batch, total_frames=-1
        )
    meter = Meter(args.warmup, args.seconds)
    try:
        for batch in collector:
            if meter.add(batch.numel(), batch):
                break
    finally:
        collector.shutdown()
    assert meter.result is not None
    return meter.result


def run_side(args: argparse.Namespace) -> None:
    os.environ.update(ONE_THREAD)  # before torch is imported here and in every process this side starts
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    kind, envs = split_side(args.side)
    if kind == "limit":
        result = run_limit(args, envs)
    elif kind == "agent":
        result = run_agent(args, envs)
    elif kind == "collector":
        result = run_collector(args, envs)
    elif kind == "collector by value":
        result = run_collector(args, envs, shared_memory=False)
    else:
        result = run_torchrl(args, kind, envs)
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- the driver


def has_torchrl(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import torchrl, tensordict, gymnasium"], capture_output=True, check=False)
    return probe.returncode == 0


def measure(
    args: argparse.Namespace, workload: Workload, side: str, workers: int, seconds: float, form: str = "serial"
) -> dict[str, float] | None:
    python = args.torchrl_python if side.startswith("torchrl") else sys.executable
    env = {**os.environ, **ONE_THREAD}
    # A side runs in the checkout whose code it measures, which also comes first on its path: the workers'
    # forkserver imports actorch from its current directory before the path it was given (Python 3.11 ignores
    # that path), so a side run elsewhere would measure that directory's actorch in its workers.
    checkout = os.path.abspath(args.compare) if side.endswith(BASE) else REPO
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [checkout, env.get("PYTHONPATH")]))
    command = [
        python,
        os.path.abspath(__file__),
        "--side",
        side.removesuffix(BASE),
        "--workload",
        workload.name,
        "--workers",
        str(workers),
        "--seconds",
        str(seconds),
        "--warmup",
        str(args.warmup),
        "--frames-per-batch",
        str(args.frames_per_batch or workload.frames_per_batch),
        "--window",
        str(args.window),
        "--transport",
        args.transport,
        "--env-form",
        form,
    ]
    try:
        ran = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=checkout, timeout=seconds * 10 + 240, check=False
        )
    except subprocess.TimeoutExpired:
        print(f"  {workload.name}, {side} with {workers} workers timed out", file=sys.stderr)
        return None
    for line in ran.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    print(
        f"  {workload.name}, {side} with {workers} workers failed (exit {ran.returncode}):\n{ran.stderr[-3000:]}",
        file=sys.stderr,
    )
    return None


def pick_env_form(args: argparse.Namespace, workload: Workload, envs: int) -> str:
    """The fastest of TorchRL's forms of ``envs`` environments, each run once as ``torchrl multiasync``."""
    workers = args.workers[0]
    speeds: dict[str, float] = {}
    for form in workload.env_forms:
        outcome = measure(args, workload, f"torchrl multiasync K={envs}", workers, args.seconds / 2, form)
        if outcome is not None:
            speeds[form] = outcome["fps"]
    if not speeds:
        return "serial"
    best = max(speeds, key=lambda form: speeds[form])
    tried = ", ".join(f"{form} {fps:,.0f}" for form, fps in speeds.items())
    print(f"{workload.name}: TorchRL's {envs} environments per worker as {best} (frames/s, {workers} workers: {tried})")
    return best


def median(rows: list[dict[str, float]], key: str) -> float | None:
    values = [row[key] for row in rows if key in row]
    return statistics.median(values) if values else None


def quiet_shares(results: dict[tuple[str, int], list[dict[str, float]]], sides: list[str], count: int) -> list[str]:
    """Each side's median fraction of the limit over the rounds in which neither was crowded by other work.

    On a shared machine a side that runs beside other work gets less than every core, and its frames/s
    fall with what it got; a round in which the side and the limit both used nearly every core compares them
    as the machine allows.
    """
    full = 0.95 * cores()
    shares = []
    for side in sides:
        if side.startswith("limit"):
            continue
        limits = {
            row["round"]: row
            for row in results.get((f"limit K={split_side(side)[1]}", count), [])
            if row["cores"] >= full
        }
        rounds = [
            row["fps"] / limits[row["round"]]["fps"]
            for row in results.get((side, count), [])
            if row["cores"] >= full and row["round"] in limits
        ]
        if rounds:
            shares.append(f"{side} {statistics.median(rounds):.0%} ({len(rounds)} of the rounds)")
    return shares


def report(
    workload: Workload,
    results: dict[tuple[str, int], list[dict[str, float]]],
    sides: list[str],
    workers: list[int],
    forms: dict[int, str],
) -> None:
    pixels = workload.name == "pixels"
    loads = [row["load"] for rows in results.values() for row in rows]
    rounds = max((len(rows) for rows in results.values()), default=0)
    print(
        f"\n{workload.name}: frames/s delivered to the learner after warm-up, medians of {rounds} rounds; "
        f"load average {min(loads, default=0):.1f} to {max(loads, default=0):.1f}; {cores()} cores"
    )
    for form_envs, form in forms.items():
        print(f"  TorchRL's K={form_envs} environments per worker: {form}")
    for count in workers:
        print(f"\n{count} workers")
        header = (
            f"{'side':32}{'frames/s':>10}{'of limit':>10}{'CPU/frame':>12}{'x plain':>9}{'faults':>8}{'cores':>7}"
            f"{'learner':>9}"
        )
        print(header + (f"{'MB/s':>8}" if pixels else ""))
        for side in sides:
            rows = results.get((side, count), [])
            fps, cpu, learner = median(rows, "fps"), median(rows, "cpu_us"), median(rows, "learner_cores")
            used, faults = median(rows, "cores"), median(rows, "faults")
            if fps is None or cpu is None or learner is None or used is None or faults is None:
                print(f"{side:32}{'-':>10}")
                continue
            limits = results.get((f"limit K={split_side(side)[1]}", count), [])
            limit, plain = median(limits, "fps"), median(limits, "cpu_us")
            share = f"{fps / limit:.0%}" if limit else "-"
            times = f"{cpu / plain:.2f}" if plain else "-"
            line = f"{side:32}{fps:>10,.0f}{share:>10}{cpu:>9.0f} us{times:>9}{faults:>8.1f}{used:>7.2f}{learner:>9.2f}"
            if pixels:
                line += f"{(median(rows, 'bytes_per_s') or 0) / 1e6:>8.0f}"
            print(line)
        for base in ("torchrl multiasync", "torchrl rpc"):
            ratios = []
            for side in sides:
                kind, envs = split_side(side)
                reference = median(results.get((f"{base} K={envs}", count), []), "fps")
                fps = median(results.get((side, count), []), "fps")
                if kind in ("collector", "agent") and reference and fps:
                    ratios.append(f"{side} {fps / reference:.2f}x")
            if ratios:
                print(f"against {base} (same K): " + ", ".join(ratios))
        per_process = [median(results.get((side, count), []), "per_process_fps") for side in sides]
        limits = [
            f"{side} {value:,.0f}"
            for side, value in zip(sides, per_process, strict=True)
            if value is not None and side.startswith("limit")
        ]
        if limits:
            print(f"the limit per process (x {min(count, cores())} cores): " + ", ".join(limits))
        quiet = quiet_shares(results, sides, count)
        if quiet:
            print("of limit in the rounds where the side and the limit both had every core: " + ", ".join(quiet))
    print(
        "columns: frames/s to the learner; of limit: the fraction of the limit's frames/s with the same K, "
        "measured in the same rounds; CPU/frame: CPU time of every process of the side per frame; x plain: that "
        "over the limit's (the plain loop's); faults: minor page faults of every process of the side per frame; "
        "cores: CPU time of the side's processes over the span's wall time; "
        "learner: the learner's share of it" + ("; MB/s: tensor bytes delivered" if pixels else "")
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4], help="worker counts to measure")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per side and round")
    parser.add_argument("--warmup", type=int, default=4096, help="frames delivered before the measurement starts")
    parser.add_argument("--frames-per-batch", type=int, default=0, help="per worker (0: the workload's own)")
    parser.add_argument("--window", type=int, default=2, help="the Collection's window")
    parser.add_argument("--transport", choices=("uv", "shm"), default="uv", help="actorch's TensorPipe transport")
    parser.add_argument("--sides", nargs="+", help="sides to run (default: all of the workload's)")
    parser.add_argument("--env-form", choices=ENV_FORMS, help="TorchRL's form of K environments (default: fastest)")
    parser.add_argument("--torchrl-python", default=sys.executable, help="the interpreter of TorchRL's sides")
    parser.add_argument(
        "--compare", help="another checkout of actorch: its collector and agent sides run too, marked @base"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: one short round with 2 workers")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side is not None:
        args.workers, args.workload = args.workers[0], args.workload[0]
        args.frames_per_batch = args.frames_per_batch or WORKLOADS[args.workload].frames_per_batch
        run_side(args)
        return
    if args.quick:
        args.rounds, args.workers, args.seconds, args.warmup = 1, [2], 1.0, 512
    torchrl = has_torchrl(args.torchrl_python)
    for name in args.workload:
        workload = WORKLOADS[name]
        sides = [side for side in workload.sides if args.sides is None or side in args.sides]
        if args.compare:
            sides = [mark for side in sides for mark in (side, side + BASE)[: 2 if split_side(side)[0] in MINE else 1]]
        if not torchrl and any(side.startswith("torchrl") for side in sides):
            print(
                f"TorchRL is not installed for {args.torchrl_python}: its sides are left out.\n"
                "Install it with  pip install -e '.[bench]'  (torchrl pinned to a release that keeps torch 2.13), "
                "or name another interpreter with --torchrl-python.",
                file=sys.stderr,
            )
            sides = [side for side in sides if not side.startswith("torchrl")]
        forms: dict[int, str] = {}
        for side in sides:
            kind, envs = split_side(side)
            if kind.startswith("torchrl") and envs > 1 and envs not in forms:
                forms[envs] = args.env_form or pick_env_form(args, workload, envs)
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for round_index in range(args.rounds):
            for count in args.workers:
                for side in sides:
                    form = forms.get(split_side(side)[1], "serial")
                    outcome = measure(args, workload, side, count, args.seconds, form)
                    if outcome is None:
                        continue
                    outcome["round"] = round_index
                    results.setdefault((side, count), []).append(outcome)
                    print(
                        f"{name}, round {round_index + 1}, {count} workers, {side}: {outcome['fps']:,.0f} frames/s, "
                        f"{outcome['cpu_us']:.0f} us CPU per frame, {outcome['faults']:.1f} faults per frame, "
                        f"{outcome['cores']:.2f} cores, "
                        f"learner {outcome['learner_cores']:.2f}, "
                        f"load {outcome['load']:.1f}",
                        flush=True,
                    )
        report(workload, results, sides, args.workers, forms)


if __name__ == "__main__":
    cli()
