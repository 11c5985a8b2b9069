"""``Collector``: a worker that plays its environments with its own copy of the policy, sending batches of what it saw.

The other design of RL collection. Where the agent keeps the one policy and
answers every step of every observer (one message per step), a collector
holds a copy of a small policy and steps its K environments itself, sending
the learner (or a replay buffer) one :class:`Batch` of ``frames_per_batch``
transitions at a time: one message per batch instead of one per step. The
learner keeps the copies in sync by broadcasting its weights
(:meth:`Collection.publish <actorch.Collection.publish>`), or the collectors
pull them from a :class:`~actorch.ParameterServer`; every batch is stamped with
the version of the weights that produced all of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import numpy
import structlog
import torch

from actorch._actors.actor import Actor
from actorch._actors.ref import ActorRef
from actorch._stock.batch import Batch
from actorch._stock.envs import EnvFactory, EnvPlayer, Rows, state_dtype
from actorch._stock.handover import Handover, Slots, usable
from actorch._stock.heap import keep_freed_memory
from actorch._stock.policies import PolicyFactory, build_policy, sample_categorical
from actorch._stock.sharded_replay import ShardedReplayBuffer

__all__ = ["Collector"]

log = structlog.get_logger("actorch")

_YIELD_EVERY = 0.005
"""Seconds of stepping after which a collector lets its node's loop run (weights and other calls come in)."""


class Collector(EnvPlayer, Actor):
    """Plays K environments with its own copy of the policy and hands out batches of what it saw.

    The policy maps states ``[batch, *state]`` to action probabilities
    ``[batch, actions]``, as the agent's does, or to logits with
    ``logits=True``; override :meth:`act` for another kind. States keep the
    environment's dtype (see :meth:`~actorch.Observer.to_state`): a policy
    of pixels casts its uint8 input in its forward, so that every batch
    carries a quarter of float32's bytes. A collector's process keeps the
    memory its steps free for the next ones (glibc's malloc thresholds, fixed
    once per process unless set through ``MALLOC_*_`` or ``GLIBC_TUNABLES``):
    a policy over pixels frees and takes the same megabytes at every step,
    which glibc may otherwise hand back to the kernel and fault in again at
    every step. Each collector draws its initial weights from its own seed
    and calls them version 0: a learner publishes its own weights before the
    first batch, so that every batch it takes was played by weights it knows.
    Weights change only between batches: a batch is all one version. Hand
    batches out as a stream (:meth:`batches`, which
    :class:`~actorch.Collection` reads from many collectors at once), one at a
    time (:meth:`collect`), or straight into a replay buffer (:meth:`fill`).
    A batch given up on midway (cancelled, past its deadline, its stream
    closed) is lost, and the next one starts where the environments are.
    Batches are played one at a time, whoever asks.

    Args:
        env: An environment factory (or path), a list of them, or a factory of
            a Gymnasium vector environment, as :class:`~actorch.Observer` takes.
        policy: A function building the policy module (or its path), run on
            this node; or a module.
        num_envs: How many environments to build from ``env``.
        frames_per_batch: Transitions per batch, a multiple of the number of environments.
        seed: Seeds the environments (environment ``i`` gets ``seed + i``), the
            policy's initial weights and the action sampling.
        max_steps: Longest single episode: one that runs longer is truncated.
        logits: Whether the policy returns logits rather than probabilities
            (TorchRL's policies do); the action is sampled from their softmax.

    Raises:
        ValueError: If ``frames_per_batch`` is not a positive multiple of the
            number of environments, ``max_steps`` is below 1, or the
            environments do not add up (see :class:`~actorch.Observer`).
    """

    max_concurrency = 8  # weights and statistics come in while a stream or a fill runs

    def __init__(
        self,
        env: EnvFactory | Sequence[EnvFactory],
        policy: PolicyFactory,
        *,
        num_envs: int | None = None,
        frames_per_batch: int = 1000,
        seed: int | None = None,
        max_steps: int = 10_000,
        logits: bool = False,
    ) -> None:
        self._open_envs(env, num_envs, max_steps)
        keep_freed_memory()  # the policy's temporaries, freed and taken again at every step, stay in the process
        if not isinstance(frames_per_batch, int) or frames_per_batch < 1 or frames_per_batch % self.num_envs:
            raise ValueError(
                f"frames_per_batch must be a positive multiple of the {self.num_envs} environments, "
                f"not {frames_per_batch!r}"
            )
        self.frames_per_batch = frames_per_batch
        self.policy = build_policy(policy, self.device, seed)
        self.policy.eval()
        self.policy.requires_grad_(False)
        self.generator = torch.Generator(device=self.device)
        if seed is not None:
            self.generator.manual_seed(seed)
        self.seed = seed
        self.logits = logits
        self.version = 0
        """The version of the weights the policy holds (0: its initial ones)."""
        self.key = self.name or f"{type(self).__name__}#{self.ref.rank}:{id(self):x}"
        self._pending: tuple[Mapping[str, torch.Tensor], int] | None = None
        self._newer = asyncio.Event()  # set when weights of a new version arrive
        self._states: torch.Tensor | None = None  # the states to act on next, once the environments were reset
        self._next: torch.Tensor | None = None  # where a batch's last step writes them (the batch leaves)
        # Observations go straight from the environments into the batch unless a subclass converts them.
        self._raw = type(self).to_state is EnvPlayer.to_state
        self._wire = type(self).to_env is EnvPlayer.to_env
        self._tally = _Tally(self.num_envs, max_steps)
        self._playing = asyncio.Lock()
        self._slots: Slots | None = None  # shared memory for a reader on this host, once one asks
        self._counts = {
            "batches": 0,
            "frames": 0,
            "episodes": 0,
            "weights": 0,
            "by_reference": 0,
            "shm_refused": 0,
            "slots_busy": 0,
        }
        self._seconds = 0.0

    async def set_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> int:
        """Take the policy's weights of ``version``, from the next batch on; return the version held then.

        Weights older than (or as old as) those held are ignored, so a slow
        broadcast never rolls a collector back. ``weights`` is a state dict of
        the policy (or a part of one: the rest stay). They are copied as they
        arrive: a call from the same node passes the caller's own tensors,
        which a learner goes on training, and the version must stay the
        weights it was sent with.

        Raises:
            TypeError: If ``version`` is not an int.
        """
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version must be an int, not {type(version).__qualname__}")
        self._check_weights(weights)
        newest = self._pending[1] if self._pending is not None else self.version
        if version > newest:
            self._pending = ({name: tensor.detach().clone() for name, tensor in weights.items()}, version)
            self._newer.set()
            self._newer = asyncio.Event()
        return max(version, newest)

    async def batches(
        self, count: int | None = None, *, server: ActorRef[Any] | None = None, handover: Handover | None = None
    ) -> AsyncIterator[Batch]:
        """Collect batch after batch, yielding each as it is done: ``ref.stream(Collector.batches)``.

        The next batch is collected while the stream has room for it (its
        window), so the collector works while the learner learns.

        Args:
            count: Batches to collect, or None for as many as the consumer takes.
            server: A :class:`~actorch.ParameterServer` (of the same policy) to
                pull newer weights from before each batch.
            handover: Who reads the stream (``Handover(pid, slots)``, ``slots``
                above its window): for a reader in another process, the
                observations are written into leases of shared memory, which
                go to a reader on this host by reference, with no copy on
                their way. :class:`~actorch.Collection` asks for it.

        Raises:
            ValueError: If ``count`` is below 1.
        """
        _check_count(count)
        slots = self._slots_for(handover)
        made = 0
        while count is None or made < count:
            if server is not None:
                await self._pull(server)
            yield await self._batch(slots)
            made += 1

    async def collect(
        self, min_version: int = 0, *, server: ActorRef[Any] | None = None, handover: Handover | None = None
    ) -> Batch:
        """Collect one batch, first waiting for weights of at least ``min_version``.

        Args:
            min_version: The oldest weights the batch may be made with; the
                collector waits for newer ones to arrive (:meth:`set_weights`).
            server: A parameter server to pull newer weights from first.
            handover: As for :meth:`batches`, for a reader that asks for one batch at a time.
        """
        if server is not None:
            await self._pull(server)
        while max(self.version, self._pending[1] if self._pending is not None else 0) < min_version:
            await self._newer.wait()
        return await self._batch(self._slots_for(handover))

    async def fill(self, buffer: Any, batches: int | None = None, *, server: ActorRef[Any] | None = None) -> int:
        """Collect batches into ``buffer`` until ``batches`` are in, or for ever; return the transitions added.

        Each batch goes in as :meth:`Batch.transitions` (one ``extend`` call),
        and the next is collected while it travels.

        Args:
            buffer: A ``ReplayBuffer`` ref (or a ref to any actor with an
                ``extend`` endpoint), or a list of refs to replay buffers, the
                shards of one buffer: the collector writes them as a
                ``ShardedReplayBuffer`` would, spreading its batches over them.
            batches: Batches to add, or None until the call is cancelled or the collector stops.
            server: A parameter server to pull newer weights from before each batch.

        Raises:
            ValueError: If ``batches`` is below 1.
        """
        _check_count(batches)
        if isinstance(buffer, (list, tuple)):
            buffer = ShardedReplayBuffer(buffer)
        added = 0
        pending: asyncio.Future[Any] | None = None
        async for batch in self.batches(batches, server=server):
            if pending is not None:
                await pending
            pending = asyncio.ensure_future(_extend(buffer, batch.transitions()))
            added += batch.frames
        if pending is not None:
            await pending
        return added

    async def on_stop(self) -> None:
        """Close the environments and give the leases of shared memory back."""
        if self._slots is not None:
            self._slots.close()
            self._slots = None
        await super().on_stop()

    async def statistics(self) -> dict[str, Any]:
        """Batches, frames and episodes collected, weight versions taken, the version held, frames per second.

        ``by_reference`` counts the batches made in leases of shared memory
        (by reference to a reader on this host), ``shm_refused`` those made in
        private memory because shared memory had no room (a full ``/dev/shm``),
        ``slots_busy`` those made so because the reader still held every lease.
        """
        seconds = self._seconds
        return {
            **self._counts,
            "version": self.version,
            "envs": self.num_envs,
            "frames_per_second": self._counts["frames"] / seconds if seconds else 0.0,
        }

    def act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one action per state; return ``(actions, log_probs)``, each ``[batch]``. Runs without a graph."""
        return sample_categorical(self.policy(states), self.generator, logits=self.logits)

    # ------------------------------------------------------------------ internals

    async def _pull(self, server: ActorRef[Any]) -> None:
        held = self._pending[1] if self._pending is not None else self.version
        parameters = await server.call("pull", held, device="cpu")
        if parameters is not None:
            await self.set_weights(parameters.tensors, parameters.version)

    def _check_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Refuse weights that name no part of the policy or have another shape: they would never take effect."""
        own = self.policy.state_dict()
        unknown = [name for name in weights if name not in own]
        if unknown:
            raise ValueError(f"the policy of {self.key} has no {', '.join(map(repr, unknown))} (it has {list(own)})")
        for name, tensor in weights.items():
            if not isinstance(tensor, torch.Tensor) or tensor.shape != own[name].shape:
                shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__qualname__
                raise ValueError(f"{name!r} must be a tensor of shape {tuple(own[name].shape)}, got {shape}")

    def _install(self) -> None:
        """Load the newest weights that came, between batches."""
        if self._pending is None:
            return
        weights, version = self._pending
        self._pending = None
        self.policy.load_state_dict(dict(weights), strict=False)
        self.version = version
        self._counts["weights"] += 1

    def _slots_for(self, handover: Handover | None) -> Slots | None:
        """The leases to hand batches to this reader through, if it is another process."""
        asked = usable(handover)
        if asked is None:
            return None
        if self._slots is None or self._slots.count < asked.slots:
            if self._slots is not None:
                self._slots.close()
            self._slots = Slots(asked.slots)
        return self._slots

    def _slot(self, slots: Slots | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """Room for the next batch's observations and next observations in a lease, or None: private memory.

        A container's ``/dev/shm`` is often small (Docker's is 64 MiB): when
        no lease can be had, the batch goes by value, and the collector says
        so once.
        """
        if slots is None:
            return None
        busy = slots.busy
        room = slots.take(shape, dtype)
        if room is not None:
            return room
        if slots.busy > busy:
            self._counts["slots_busy"] += 1
            return None
        self._counts["shm_refused"] += 1
        if self._counts["shm_refused"] == 1:
            log.warning(
                "shared memory refused: batches go by value",
                collector=self.key,
                why=slots.refusal,
                hint="give /dev/shm more room (docker run --shm-size=1g), raise run(shm_pool=...), "
                "or Collection(shared_memory=False)",
            )
        return None

    async def _batch(self, slots: Slots | None = None) -> Batch:
        """One batch, its environments played by one caller at a time (streams and calls may come at once)."""
        async with self._playing:
            return await self._play_batch(slots)

    async def _play_batch(self, slots: Slots | None) -> Batch:
        """Step every environment ``frames_per_batch / envs`` times with the policy; yield to the loop now and then."""
        self._install()
        if self._states is None:
            self._begin()
        assert self._states is not None
        assert self._next is not None
        steps = self.frames_per_batch // self.num_envs
        slot = self._slot(slots, (steps, *self._states.shape), self._states.dtype)
        batch = _Rows(steps, self._states, self._next, raw=self._raw, slot=slot)
        self._tally.begin()
        started = time.perf_counter()
        step = 0
        try:
            while step < steps:
                step = self._play(batch, step, time.perf_counter() + _YIELD_EVERY)
                if step < steps:
                    await asyncio.sleep(0)
        finally:
            # A batch given up on midway leaves the states where the environments are.
            self._states = batch.observations[step] if step < steps else self._next
        self._tally.carry(batch.rewards.numpy())
        self._seconds += time.perf_counter() - started
        self._counts["batches"] += 1
        self._counts["frames"] += self.frames_per_batch
        self._counts["episodes"] += len(self._tally.returns)
        made = Batch(
            self.key,
            self.version,
            batch.observations,
            torch.stack(batch.actions),
            torch.stack(batch.log_probs),
            batch.rewards,
            batch.terminated,
            batch.truncated,
            batch.finals,
            self._tally.returns,
            self._tally.lengths,
        )
        if batch.slot is not None:
            self._counts["by_reference"] += 1
        return made

    def _play(self, batch: _Rows, step: int, pause: float) -> int:
        """Play the batch's steps from ``step`` on until it is full or ``pause`` has passed; return the next step."""
        steps = len(batch.states)
        states, actions_taken, log_probs_taken = batch.states, batch.actions, batch.log_probs
        final, following, reward, ended, cut = batch.arrays
        tally = self._tally
        with torch.no_grad():
            while step < steps:
                actions, log_probs = self.act(states[step])
                actions_taken.append(actions)
                log_probs_taken.append(log_probs)
                wire = actions.tolist() if self._wire and actions.dim() == 1 else [self.to_env(a) for a in actions]
                rows = Rows(final[step], following[step], reward[step], ended[step], cut[step])
                done = self.envs.step_into(wire, rows) if self._raw else self._step_hooked(wire, rows)
                if done or step >= tally.next_cut:
                    self._end_episodes(step, done, rows, reward)
                step += 1
                if time.perf_counter() >= pause:
                    break
        return step

    def _begin(self) -> None:
        """Reset every environment (seeded) and size the states from what they give."""
        observations = self.envs.reset(self.seed)
        if self._raw:
            try:
                dtype = state_dtype(observations[0])
                first = numpy.stack([numpy.asarray(observation, dtype=dtype) for observation in observations])
            except (TypeError, ValueError):  # not arrays of one shape (a dict, ragged): to_state converts
                self._raw = False
            else:
                if dtype.kind != "O":
                    self._states = torch.from_numpy(first)
                    self._next = torch.empty_like(self._states)
                    return
                self._raw = False
        self._states = torch.stack([self.to_state(observation) for observation in observations])
        self._next = torch.empty_like(self._states)

    def _step_hooked(self, actions: list[Any], rows: Rows) -> list[int]:
        """A step whose observations go through :meth:`to_state`, written into the batch's rows."""
        outcome = self.envs.step(actions, range(self.num_envs))
        rows.final[...] = torch.stack([self.to_state(observation) for observation in outcome.final])
        rows.following[...] = torch.stack([self.to_state(observation) for observation in outcome.observations])
        rows.rewards[...] = outcome.rewards
        rows.terminated[...] = outcome.terminated
        rows.truncated[...] = outcome.truncated
        ends = zip(outcome.terminated, outcome.truncated, strict=True)
        return [index for index, (terminated, truncated) in enumerate(ends) if terminated or truncated]

    def _end_episodes(self, step: int, done: list[int], rows: Rows, rewards: Any) -> None:
        """Record the episodes that ended at ``step``, cutting (and resetting) those that reach ``max_steps``."""
        tally = self._tally
        cut = [index for index in tally.due(step) if index not in done]
        for index in cut:
            rows.truncated[index] = True
            observation = self.envs.reset_one(index)
            rows.following[index] = observation if self._raw else self.to_state(observation)
        for index in sorted(done + cut):
            tally.end(index, step, rewards)


class _Rows:
    """A batch being played: its tensors, made before the first step, and the rows each step writes.

    With ``raw`` the environments' observations are written through NumPy
    views of the tensors (one copy, no conversion); without, as the tensors
    :meth:`~Collector.to_state` makes. A step's next states are the next
    step's observations, and the last step's go to ``following``, the
    collector's own, since the batch leaves.
    """

    def __init__(
        self, steps: int, states: torch.Tensor, following: torch.Tensor, *, raw: bool, slot: torch.Tensor | None
    ) -> None:
        count = len(states)
        shape = (steps, *states.shape)
        self.slot = slot
        if slot is None:
            self.observations = torch.empty(shape, dtype=states.dtype)
            self.finals = torch.empty_like(self.observations)
        else:  # both in a lease of shared memory: they are written where the reader will read them
            self.observations, self.finals = slot[0], slot[1]
        self.rewards = torch.zeros((steps, count), dtype=torch.float32)
        self.terminated = torch.zeros((steps, count), dtype=torch.bool)
        self.truncated = torch.zeros((steps, count), dtype=torch.bool)
        self.observations[0] = states
        self.states = self.observations.unbind(0)
        self.actions: list[torch.Tensor] = []
        self.log_probs: list[torch.Tensor] = []
        flags = [tensor.numpy() for tensor in (self.rewards, self.terminated, self.truncated)]
        if raw:
            seen = self.observations.numpy()
            self.arrays: tuple[Any, ...] = (self.finals.numpy(), [*seen[1:], following.numpy()], *flags)
        else:
            self.arrays = (self.finals, [*self.states[1:], following], *flags)


class _Tally:
    """Each environment's episode so far, counted per episode and per batch rather than per step.

    An episode's return and length come from the batch's rewards when it
    ends (plus what earlier batches carried), so the playing loop does no
    bookkeeping per step: one comparison tells it when an episode is due to
    be cut at ``max_steps``.
    """

    def __init__(self, count: int, max_steps: int) -> None:
        self.max_steps = max_steps
        self.carried_returns = [0.0] * count  # of each episode under way, from earlier batches
        self.carried_lengths = [0] * count
        self.starts = [0] * count  # the row of this batch where each episode under way began
        self.cuts = [max_steps - 1] * count  # the row at which each would reach max_steps
        self.next_cut = max_steps - 1
        self.returns: list[float] = []
        self.lengths: list[int] = []

    def begin(self) -> None:
        """A new batch: rows count from 0 again."""
        self.returns, self.lengths = [], []
        self.starts = [0] * len(self.starts)
        self.cuts = [self.max_steps - 1 - length for length in self.carried_lengths]
        self.next_cut = min(self.cuts)

    def due(self, step: int) -> list[int]:
        """The environments whose episode reaches ``max_steps`` at ``step``."""
        if step < self.next_cut:
            return []
        return [index for index, row in enumerate(self.cuts) if row <= step]

    def end(self, index: int, step: int, rewards: Any) -> None:
        """Environment ``index``'s episode ended at ``step``: record it; the next one starts on the row after."""
        start = self.starts[index]
        self.returns.append(self.carried_returns[index] + float(rewards[start : step + 1, index].sum()))
        self.lengths.append(self.carried_lengths[index] + step + 1 - start)
        self.carried_returns[index], self.carried_lengths[index] = 0.0, 0
        self.starts[index] = step + 1
        self.cuts[index] = step + self.max_steps
        self.next_cut = min(self.cuts)

    def carry(self, rewards: Any) -> None:
        """The batch is done: carry each episode under way into the next."""
        steps = len(rewards)
        for index, start in enumerate(self.starts):
            self.carried_returns[index] += float(rewards[start:, index].sum())
            self.carried_lengths[index] += steps - start


async def _extend(buffer: Any, transitions: dict[str, torch.Tensor]) -> Any:
    if isinstance(buffer, ActorRef):
        return await buffer.call("extend", transitions)
    return await buffer.extend(transitions)


def _check_count(count: int | None) -> None:
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise ValueError(f"count must be an int >= 1 or None, not {count!r}")
