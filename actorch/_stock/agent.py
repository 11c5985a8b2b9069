"""``Agent``: the learner of the many-observers, one-learner pattern of the torch RPC tutorials.

The agent owns the policy. Each episode it finds the observers by name pattern,
has them all play at once, answers their states with actions (one policy
forward per message, or one per batch of all observers' messages; an observer
of K environments sends their K states in one message), and then learns from
their rollouts (REINFORCE by default), reporting :class:`EpisodeStats`; or it
only collects (:meth:`Agent.collect`). Subclasses change the algorithm through
the hooks ``act``, ``returns`` and ``learn``.

The policy lives on the agent's device (``spawn(..., device="cuda:0")``) while
the observers play on the CPU: a batch of states goes to the device in one copy
and its actions come back in one, however many observers asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import torch
from torch import nn

from actorch._actors.actor import Actor
from actorch._base.errors import ActorNotFoundError
from actorch._engine.batching import batched
from actorch._stock.episodes import EpisodeStats, by_observer, first_episode, raise_failures, rows_by_env
from actorch._stock.group import ActorGroup
from actorch._stock.import_paths import resolve
from actorch._stock.observer import Observation, Observer, Rollout
from actorch._stock.policies import PolicyFactory, build_policy, sample_categorical

__all__ = ["Agent", "EpisodeStats"]

_HOST = torch.device("cpu")


class Agent(Actor):
    """Owns the policy: answers observers' states with actions, then learns from their rollouts.

    Each :meth:`run_episode` finds the observers by name pattern (so observers
    added later join the next episode), has them all play at once, and runs
    :meth:`learn` on what they saw. Subclasses change the algorithm through the
    hooks :meth:`act`, :meth:`returns` and :meth:`learn`.

    The policy and the optimizer's state live on the agent's device
    (``self.device``, set by ``spawn(..., device=...)``). States arrive from the
    observers on the CPU; the batched endpoint stacks a step's states there and
    moves them to the device in one copy, runs one forward, and brings the
    actions back in one copy before answering each observer. Every such copy
    goes through :meth:`transfer`.

    Args:
        policy: A module mapping states ``[batch, *state]`` to action
            probabilities ``[batch, actions]`` (or logits, with ``logits``), or a function (or
            ``"module:function"`` path) building it on the agent's node.
        observers: Glob pattern of the observers' names.
        optimizer: Optimizer class or its path, given the policy's parameters and ``lr``.
        lr: Learning rate.
        gamma: Discount factor of the returns.
        batch: Whether observers ask for actions through the batched endpoint
            (one policy forward for all observers' states per step).
        smoothing: Weight of the newest episode in ``running_reward``.
        seed: Seeds the policy's initial weights (drawn on the CPU, then moved,
            so they are the same on every device) and the action sampling.
        logits: Whether the policy returns logits rather than probabilities
            (TorchRL's policies do); the action is sampled from their softmax.
    """

    def __init__(
        self,
        policy: PolicyFactory,
        *,
        observers: str = "rl/observers/*",
        optimizer: type[torch.optim.Optimizer] | str = "torch.optim:Adam",
        lr: float = 1e-2,
        gamma: float = 0.99,
        batch: bool = True,
        smoothing: float = 0.1,
        seed: int | None = None,
        logits: bool = False,
    ) -> None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be within [0, 1], not {gamma!r}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be within (0, 1], not {smoothing!r}")
        self.policy: nn.Module = build_policy(
            policy, self.device, seed
        )  # before the optimizer, which keeps state beside it
        self.optimizer = resolve(optimizer, "optimizer")(self.policy.parameters(), lr=lr)
        self.generator = torch.Generator(device=self.device)
        if seed is not None:
            self.generator.manual_seed(seed)
        self.logits = logits
        self.pattern = observers
        self.gamma = gamma
        self.batch = batch
        self.smoothing = smoothing
        self.episodes = 0
        self.actions = 0
        self.running_reward: float | None = None
        # Per observer key, one record per message answered: the log-probabilities of its rows, and which
        # of the observer's environments they are (None: all, in order).
        self._log_probs: dict[str, list[tuple[torch.Tensor, list[int] | None]]] = {}
        self._learning = True  # False while collecting: no log-probabilities kept, no graph built
        self._stepping = 0  # observers still playing: the size of a full batch
        self._kept: dict[tuple[Any, ...], torch.Tensor] | None = None  # while streaming: weights kept for backward
        self._weights: set[int] = set()  # the policy's weight storages, while streaming

    async def run_episode(self, steps: int | None = None) -> EpisodeStats:
        """Have every observer play (one episode, or ``steps`` steps each), then learn.

        Raises:
            ActorNotFoundError: No observer matches the pattern.
            GroupError: Observers failed (it names them); no learning step was taken.
                A remote caller gets it as a ``RemoteError`` with the same message.
        """
        started = time.perf_counter()
        rollouts = await self._play(steps, record=False)
        log_probs: list[torch.Tensor] = []
        for key, played in by_observer(rollouts):
            log_probs.extend(rows_by_env(self._log_probs.pop(key, []), played))
        return self._learned(rollouts, log_probs, started)

    async def collect(self, steps: int | None = None) -> list[Rollout]:
        """Have every observer play (one episode, or ``steps`` steps each) and return what they saw; no learning.

        The rollouts (one per environment of each observer) carry the states
        acted on and the actions taken, for a learner of your own. The policy
        runs without building an autograd graph.

        Raises:
            ActorNotFoundError: No observer matches the pattern.
            GroupError: Observers failed (it names them).
        """
        self._learning = False
        try:
            return await self._play(steps, record=True)
        finally:
            self._learning = True

    async def _play(self, steps: int | None, *, record: bool) -> list[Rollout]:
        """Every observer's rollouts of one run, flattened in observer order."""
        refs = await self._observers()
        self._log_probs = {}
        self._stepping = len(refs)
        try:
            played: list[list[Rollout]] = await ActorGroup(refs).call(
                Observer.play, self.ref, steps, batch=self.batch, record=record
            )
        finally:
            self._stepping = 0
        return [rollout for rollouts in played for rollout in rollouts]

    async def _observers(self) -> list[Any]:
        refs = await self.system.lookup_all(self.pattern)
        if not refs:
            raise ActorNotFoundError(f"no observers match {self.pattern!r} (agent {self.name or self.ref})")
        return refs

    async def train_streaming(self, rounds: int, steps: int | None = None) -> list[EpisodeStats]:
        """Learn from episodes the observers stream: ``rounds`` learning steps, each on one run of every observer.

        Each observer found by the pattern streams its runs
        (:meth:`Observer.episodes`, one run ahead at most) and starts the next
        as soon as it has handed one over, so observers never wait for the
        learning step as they do between :meth:`run_episode` calls. A run
        may thus be played partly under the policy of the step before: its
        log-probabilities keep the weights they were computed with (a copy
        per policy version while streaming), so each step follows the
        gradient of the policy that acted. The streams close when the rounds
        are done; the observers stop at once.

        With batched actions, one policy forward may serve runs learned from
        in different rounds: a :meth:`learn` override calls ``backward`` with
        ``retain_graph=True`` here, as the default one does.

        Args:
            rounds: Learning steps to take.
            steps: Steps per run, as for :meth:`Observer.run` (None: one episode).

        Returns:
            One :class:`EpisodeStats` per learning step.

        Raises:
            ValueError: ``rounds`` is not an int of at least 1.
            ActorNotFoundError: No observer matches the pattern.
            GroupError: Observers' streams failed (it names them); the steps
                of earlier rounds stay taken, none is taken for this one.
        """
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, not {rounds!r}")
        refs = await self._observers()
        self._log_probs = {}
        self._stepping = len(refs)
        self._kept, self._weights = {}, {param.untyped_storage().data_ptr() for param in self.policy.parameters()}
        streams = [ref.stream(Observer.plays, self.ref, steps, batch=self.batch).with_window(1) for ref in refs]
        history: list[EpisodeStats] = []
        try:
            for _ in range(rounds):
                started = time.perf_counter()
                outcomes = await asyncio.gather(*(anext(stream) for stream in streams), return_exceptions=True)
                raise_failures(refs, outcomes)
                runs: list[list[Rollout]] = outcomes  # type: ignore[assignment] # none failed
                rollouts = [rollout for run in runs for rollout in run]
                log_probs = [rows for run in runs for rows in self._taken_log_probs(run)]
                history.append(self._learned(rollouts, log_probs, started))
                self._kept = {}  # a new policy version: its weights are kept afresh
        finally:
            self._stepping = 0
            self._kept, self._weights, self._log_probs = None, set(), {}
            for stream in streams:
                await stream.aclose()
        return history

    async def select_action(self, observation: Observation) -> Any:
        """One observer's actions for the states of its environments (one policy forward per call)."""
        key, states, envs = observation
        if states is None:
            self._stepping -= 1
            return None
        actions, log_probs = self._act(self.transfer(states, self.device))
        if self._learning:
            self._log_probs.setdefault(key, []).append((log_probs, envs))
        return _to_wire(self.transfer(actions, _HOST))

    @batched(max_batch=lambda self: self._stepping, max_wait=0.05)
    async def select_action_batch(self, observations: list[Observation]) -> list[Any]:
        """Actions for the states of all observers that asked (all their environments'), in one policy forward.

        The states are concatenated where they arrived and moved to the
        policy's device in one copy; the actions come back to the CPU in one
        copy, and each observer gets the rows of its own states.
        """
        live: list[tuple[int, str, torch.Tensor, list[int] | None]] = [
            (index, key, states, envs) for index, (key, states, envs) in enumerate(observations) if states is not None
        ]
        self._stepping -= len(observations) - len(live)
        answers: list[Any] = [None] * len(observations)
        if live:
            stacks = [states for _, _, states, _ in live]
            if len({states.device for states in stacks}) > 1:  # some came staged to this device, some not
                stacks = [states.to(_HOST) for states in stacks]
            actions, log_probs = self._act(self.transfer(torch.cat(stacks), self.device))
            actions = self.transfer(actions, _HOST)
            start = 0
            for index, key, states, envs in live:
                end = start + len(states)
                if self._learning:
                    self._log_probs.setdefault(key, []).append((log_probs[start:end], envs))
                answers[index] = _to_wire(actions[start:end])
                start = end
        return answers

    async def observers(self) -> list[str]:
        """The names of the observers the pattern finds now."""
        return [ref.name or repr(ref) for ref in await self.system.lookup_all(self.pattern)]

    async def statistics(self) -> dict[str, Any]:
        """Episodes run, actions taken, running reward, pattern, device and whether actions are batched."""
        return {
            "device": str(self.device),
            "episodes": self.episodes,
            "actions": self.actions,
            "running_reward": self.running_reward,
            "observers": self.pattern,
            "batch": self.batch,
        }

    def transfer(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``tensor`` on ``device`` (itself if it is there): the one way states, actions and returns move.

        The endpoints call it once per batch of states each way, and
        :meth:`learn` once per episode for the returns; a subclass may override
        it to pin memory, use a stream of its own, or count the copies.
        """
        return tensor.to(device, non_blocking=device.type == "cuda")

    def act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one action per state and return ``(actions, log_probs)``, each ``[batch]``.

        ``states`` are on the agent's device; so are the actions and log-probabilities returned.
        """
        return sample_categorical(self.policy(states), self.generator, logits=self.logits)

    def returns(self, rollout: Rollout) -> torch.Tensor:
        """Discounted returns of a rollout, restarting where an episode ended."""
        out = torch.empty_like(rollout.rewards)
        running = 0.0
        for step in range(len(rollout.rewards) - 1, -1, -1):
            if rollout.dones[step]:
                running = 0.0
            running = float(rollout.rewards[step]) + self.gamma * running
            out[step] = running
        return out

    def learn(self, rollouts: list[Rollout], log_probs: list[torch.Tensor]) -> float:
        """REINFORCE: one optimizer step on ``-sum(log_prob * normalized return)``; returns the loss.

        The returns are computed on the CPU, from the rollouts, and moved to
        the log-probabilities' device (the agent's) in one copy.
        """
        returns = torch.cat([self.returns(rollout) for rollout in rollouts])
        if returns.numel() > 1:
            returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        taken = torch.cat(log_probs)
        loss = -(taken * self.transfer(returns, taken.device)).sum()
        self.optimizer.zero_grad()
        # Streaming, one batched forward may serve runs that are learned from in different rounds.
        loss.backward(retain_graph=self._kept is not None)  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return float(loss.detach())

    # ------------------------------------------------------------------ internals

    def _learned(self, rollouts: list[Rollout], log_probs: list[torch.Tensor], started: float) -> EpisodeStats:
        """Learn from one episode's rollouts and account for it."""
        loss = self.learn(rollouts, log_probs)
        reward = sum(first_episode(rollout) for rollout in rollouts) / len(rollouts)
        if self.running_reward is None:
            self.running_reward = reward
        else:
            self.running_reward += self.smoothing * (reward - self.running_reward)
        self.episodes += 1
        steps_taken = sum(len(rollout.rewards) for rollout in rollouts)
        self.actions += steps_taken
        seconds = time.perf_counter() - started
        observers = len({rollout.observer for rollout in rollouts})
        return EpisodeStats(self.episodes, reward, self.running_reward, loss, steps_taken, observers, seconds)

    def _act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`act` on ``states``: with a graph while learning, without one while collecting."""
        if not self._learning:
            with torch.no_grad():
                return self.act(states)
        with self._keeping_weights():
            return self.act(states)

    def _taken_log_probs(self, run: list[Rollout]) -> list[torch.Tensor]:
        """One observer's run's log-probabilities per environment: the first records (its next run may have begun).

        A run sends one message per step of its longest-playing environment.
        """
        key = run[0].observer
        recorded = self._log_probs.get(key, [])
        count = max(len(rollout.rewards) for rollout in run)
        self._log_probs[key] = recorded[count:]
        return rows_by_env(recorded[:count], run)

    def _keeping_weights(self) -> contextlib.AbstractContextManager[None]:
        """While streaming: keep, for backward, the weights an action was computed with.

        The learning step changes the weights in place while observers are
        mid-run, and autograd refuses a backward through weights changed since
        the forward. Saved-tensor hooks give backward a copy instead, one per
        weight and policy version, made at its first forward.
        """
        if self._kept is None:
            return contextlib.nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(self._keep, _unpack)

    def _keep(self, tensor: torch.Tensor) -> torch.Tensor:
        kept = self._kept
        storage = tensor.untyped_storage().data_ptr()
        if kept is None or storage not in self._weights:
            return tensor
        key = (storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        copy = kept.get(key)
        if copy is None:
            copy = kept[key] = tensor.detach().clone()
        return copy


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _to_wire(actions: torch.Tensor) -> Any:
    """Actions of one observer's states: scalar ones as a list of Python numbers, others as their tensor of rows."""
    return actions.tolist() if actions.dim() == 1 else actions
