"""``Agent`` and ``Observer``: the many-observers, one-learner pattern of the torch RPC tutorials.

Observers each own an environment on their node and play it against the
agent: they send states, the agent answers actions (one policy forward per
state, or one per batch of all observers' states), and at the end of a run
each observer returns what it saw. The agent then learns (REINFORCE by default).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from actorch._actors.actor import Actor
from actorch._actors.ref import ActorRef
from actorch._base.codec import serializable
from actorch._base.errors import ActorNotFoundError
from actorch._engine.batching import batched
from actorch._stock.group import ActorGroup
from actorch._stock.parameter_server import _resolve

__all__ = ["Agent", "EpisodeStats", "Observer", "Rollout"]

Observation = tuple[str, torch.Tensor | None]
"""What an observer sends for an action: its key and its state (None: its run has ended)."""


@serializable(19)
@dataclass
class Rollout:
    """What one observer saw in one run.

    Attributes:
        observer: The key the observer sent its states under (its name, if it has one).
        rewards: One reward per step, float32.
        dones: Whether an episode ended at each step (terminated or truncated).
        episode_rewards: The total reward of each episode that ended in the run.
    """

    observer: str
    rewards: torch.Tensor = field(repr=False)
    dones: torch.Tensor = field(repr=False)
    episode_rewards: list[float]


@serializable(20)
@dataclass
class EpisodeStats:
    """How one episode of the agent went.

    Attributes:
        episode: Episodes run so far, this one included.
        reward: The mean over observers of their first episode's total reward
            (in a fixed-length run, of the steps played if no episode ended).
        running_reward: An exponential moving average of ``reward``.
        loss: The learning step's loss.
        steps: Actions taken by all observers together.
        observers: How many observers played.
        seconds: Wall time of the episode, learning included.
    """

    episode: int
    reward: float
    running_reward: float
    loss: float
    steps: int
    observers: int
    seconds: float


class Observer(Actor):
    """Plays an environment against an agent: sends states, receives actions, returns rewards.

    Args:
        env: A function returning the environment (any object with Gymnasium's
            ``reset(seed=...) -> (obs, info)`` and ``step(action) -> (obs,
            reward, terminated, truncated, info)``), or its ``"module:function"`` path.
        seed: Seed of the environment's first reset.
        max_steps: Longest single episode, for environments that never end.
    """

    def __init__(self, env: Callable[[], Any] | str, *, seed: int | None = None, max_steps: int = 10_000) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, not {max_steps!r}")
        self.env = _resolve(env, "environment factory")()
        self.seed = seed
        self.max_steps = max_steps
        self.key = self.name or f"{type(self).__name__}#{self.ref.rank}:{id(self):x}"

    async def run(self, agent: ActorRef[Agent], steps: int | None = None, *, batch: bool = True) -> Rollout:
        """Play against ``agent`` and return what was seen.

        Args:
            agent: The agent that chooses actions.
            steps: None plays one episode (at most ``max_steps``); a number plays
                exactly that many steps, resetting the environment whenever an
                episode ends, as the batch tutorial's observers do.
            batch: Ask for actions through the agent's batched endpoint.
        """
        if steps is not None and steps < 1:
            raise ValueError(f"steps must be >= 1 or None, not {steps!r}")
        limit = self.max_steps if steps is None else steps
        rewards: list[float] = []
        dones: list[bool] = []
        episodes: list[float] = []
        episode_reward = 0.0
        state = self.reset()
        try:
            for step in range(limit):
                action = await self._ask(agent, (self.key, state), batch)
                raw, reward, terminated, truncated, _ = self.env.step(self.to_env(action))
                rewards.append(float(reward))
                episode_reward += float(reward)
                done = bool(terminated or truncated) or (steps is None and step + 1 == limit)
                dones.append(done)
                if done:
                    episodes.append(episode_reward)
                    episode_reward = 0.0
                    if steps is None:
                        break
                    state = self.reset()
                else:
                    state = self.to_state(raw)
        except Exception:
            with contextlib.suppress(Exception):  # the run's own error is the one to raise
                await self._ask(agent, (self.key, None), batch)
            raise
        await self._ask(agent, (self.key, None), batch)  # the agent counts this observer out of its batches
        return Rollout(self.key, torch.tensor(rewards, dtype=torch.float32), torch.tensor(dones), episodes)

    @staticmethod
    async def _ask(agent: ActorRef[Agent], observation: Observation, batch: bool) -> Any:
        if batch:
            return await agent.call(Agent.select_action_batch, observation)
        return await agent.call(Agent.select_action, observation)

    def reset(self) -> torch.Tensor:
        """Reset the environment (seeded the first time) and return the state."""
        raw, _ = self.env.reset(seed=self.seed) if self.seed is not None else self.env.reset()
        self.seed = None
        return self.to_state(raw)

    def to_state(self, observation: Any) -> torch.Tensor:
        """The environment's observation as the float32 tensor the agent's policy takes."""
        return torch.as_tensor(observation, dtype=torch.float32)

    def to_env(self, action: Any) -> Any:
        """The agent's action as the environment takes it: a number, or a tensor as a NumPy array."""
        return action.numpy() if isinstance(action, torch.Tensor) else action


class Agent(Actor):
    """Owns the policy: answers observers' states with actions, then learns from their rollouts.

    Each :meth:`run_episode` finds the observers by name pattern (so observers
    added later join the next episode), has them all play at once, and runs
    :meth:`learn` on what they saw. Subclasses change the algorithm through the
    hooks :meth:`act`, :meth:`returns` and :meth:`learn`.

    Args:
        policy: A module mapping states ``[batch, *state]`` to action
            probabilities ``[batch, actions]``, or a function (or
            ``"module:function"`` path) building it on the agent's node.
        observers: Glob pattern of the observers' names.
        optimizer: Optimizer class or its path, given the policy's parameters and ``lr``.
        lr: Learning rate.
        gamma: Discount factor of the returns.
        batch: Whether observers ask for actions through the batched endpoint
            (one policy forward for all observers' states per step).
        smoothing: Weight of the newest episode in ``running_reward``.
        seed: Seeds the policy's initial weights and the action sampling.
    """

    def __init__(
        self,
        policy: nn.Module | Callable[[], nn.Module] | str,
        *,
        observers: str = "rl/observers/*",
        optimizer: type[torch.optim.Optimizer] | str = "torch.optim:Adam",
        lr: float = 1e-2,
        gamma: float = 0.99,
        batch: bool = True,
        smoothing: float = 0.1,
        seed: int | None = None,
    ) -> None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be within [0, 1], not {gamma!r}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be within (0, 1], not {smoothing!r}")
        if isinstance(policy, nn.Module):
            self.policy = policy
        else:
            with torch.random.fork_rng():
                if seed is not None:
                    torch.manual_seed(seed)
                self.policy = _resolve(policy, "policy factory")()
        self.optimizer = _resolve(optimizer, "optimizer")(self.policy.parameters(), lr=lr)
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        self.pattern = observers
        self.gamma = gamma
        self.batch = batch
        self.smoothing = smoothing
        self.episodes = 0
        self.actions = 0
        self.running_reward: float | None = None
        self._log_probs: dict[str, list[torch.Tensor]] = {}
        self._stepping = 0  # observers still playing: the size of a full batch

    async def run_episode(self, steps: int | None = None) -> EpisodeStats:
        """Have every observer play (one episode, or ``steps`` steps each), then learn.

        Raises:
            ActorNotFoundError: No observer matches the pattern.
            GroupError: Observers failed (it names them); no learning step was taken.
                A remote caller gets it as a ``RemoteError`` with the same message.
        """
        refs = await self.system.lookup_all(self.pattern)
        if not refs:
            raise ActorNotFoundError(f"no observers match {self.pattern!r} (agent {self.name or self.ref})")
        started = time.perf_counter()
        self._log_probs = {}
        self._stepping = len(refs)
        try:
            rollouts: list[Rollout] = await ActorGroup(refs).call(Observer.run, self.ref, steps, batch=self.batch)
        finally:
            self._stepping = 0
        log_probs = [torch.stack(self._log_probs.pop(rollout.observer, [])) for rollout in rollouts]
        loss = self.learn(rollouts, log_probs)
        reward = sum(_first_episode(rollout) for rollout in rollouts) / len(rollouts)
        if self.running_reward is None:
            self.running_reward = reward
        else:
            self.running_reward += self.smoothing * (reward - self.running_reward)
        self.episodes += 1
        steps_taken = sum(len(rollout.rewards) for rollout in rollouts)
        self.actions += steps_taken
        seconds = time.perf_counter() - started
        return EpisodeStats(self.episodes, reward, self.running_reward, loss, steps_taken, len(rollouts), seconds)

    async def select_action(self, observation: Observation) -> Any:
        """One observer's action for its state (one policy forward per call)."""
        key, state = observation
        if state is None:
            self._stepping -= 1
            return None
        actions, log_probs = self.act(state.unsqueeze(0))
        self._log_probs.setdefault(key, []).append(log_probs[0])
        return _to_wire(actions[0])

    @batched(max_batch=lambda self: self._stepping, max_wait=0.05)
    async def select_action_batch(self, observations: list[Observation]) -> list[Any]:
        """Actions for the states of all observers that asked, in one policy forward."""
        live = [(index, key, state) for index, (key, state) in enumerate(observations) if state is not None]
        self._stepping -= len(observations) - len(live)
        answers: list[Any] = [None] * len(observations)
        if live:
            actions, log_probs = self.act(torch.stack([state for _, _, state in live]))
            for row, (index, key, _) in enumerate(live):
                self._log_probs.setdefault(key, []).append(log_probs[row])
                answers[index] = _to_wire(actions[row])
        return answers

    async def observers(self) -> list[str]:
        """The names of the observers the pattern finds now."""
        return [ref.name or repr(ref) for ref in await self.system.lookup_all(self.pattern)]

    async def statistics(self) -> dict[str, Any]:
        """Episodes run, actions taken, running reward, pattern and whether actions are batched."""
        return {
            "episodes": self.episodes,
            "actions": self.actions,
            "running_reward": self.running_reward,
            "observers": self.pattern,
            "batch": self.batch,
        }

    def act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one action per state and return ``(actions, log_probs)``, each ``[batch]``."""
        probs = self.policy(states)
        actions = torch.multinomial(probs.detach(), 1, generator=self.generator).squeeze(1)
        log_probs = torch.log(probs.gather(1, actions.unsqueeze(1)).squeeze(1).clamp_min(1e-12))
        return actions, log_probs

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
        """REINFORCE: one optimizer step on ``-sum(log_prob * normalized return)``; returns the loss."""
        returns = torch.cat([self.returns(rollout) for rollout in rollouts])
        if returns.numel() > 1:
            returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        loss = -(torch.cat(log_probs) * returns).sum()
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return float(loss.detach())


def _first_episode(rollout: Rollout) -> float:
    """The reward of an observer's first episode, or of all it played if none ended."""
    return rollout.episode_rewards[0] if rollout.episode_rewards else float(rollout.rewards.sum())


def _to_wire(action: torch.Tensor) -> Any:
    """A scalar action as a Python number, any other as its tensor."""
    return action.item() if action.numel() == 1 and action.dim() == 0 else action
