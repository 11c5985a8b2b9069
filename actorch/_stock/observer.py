"""``Observer``: the actor that plays an environment against an agent, and ``Rollout``, what it saw.

Each observer owns an environment on its node. In a run it sends the agent its
states, one at a time or through the agent's batched endpoint, applies the
actions it gets back, and at the end returns a :class:`Rollout` of the rewards
and episode ends it saw. Or it streams its rollouts (:meth:`Observer.episodes`),
one per episode, playing on until the agent has enough. The agent that drives the observers lives in
``agent.py``; this module knows it only as the type of a ref, and calls its
endpoints by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from actorch._actors.actor import Actor
from actorch._actors.ref import ActorRef
from actorch._base.codec import serializable
from actorch._stock.import_paths import resolve

__all__ = ["Observer", "Rollout"]

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
        self.env = resolve(env, "environment factory")()
        self.seed = seed
        self.max_steps = max_steps
        self.key = self.name or f"{type(self).__name__}#{self.ref.rank}:{id(self):x}"

    async def run(self, agent: ActorRef[Any], steps: int | None = None, *, batch: bool = True) -> Rollout:
        """Play against ``agent`` and return what was seen.

        Args:
            agent: The agent that chooses actions.
            steps: None plays one episode (at most ``max_steps``); a number plays
                exactly that many steps, resetting the environment whenever an
                episode ends, as the batch tutorial's observers do.
            batch: Ask for actions through the agent's batched endpoint.
        """
        _check_steps(steps)
        async with self._signing_off(agent, batch):
            return await self._play(agent, steps, batch)

    async def episodes(
        self, agent: ActorRef[Any], steps: int | None = None, *, batch: bool = True, count: int | None = None
    ) -> AsyncIterator[Rollout]:
        """Play against ``agent`` run after run, yielding each run's :class:`Rollout` as it ends.

        A stream: ``agent.stream(Observer.episodes, ...)`` from the agent (see
        :meth:`Agent.train_streaming`). Each item is what :meth:`run` with the
        same ``steps`` returns, and the next run starts as soon as the stream
        has room for it (its window), so the observer keeps playing while the
        agent learns. The stream ends after ``count`` runs, or when the
        consumer leaves; an error of the environment or the agent ends it with
        that error.

        Args:
            agent: The agent that chooses actions.
            steps: Steps per run, as for :meth:`run` (None: one episode).
            batch: Ask for actions through the agent's batched endpoint.
            count: Runs to play, or None for as many as the consumer takes.

        Raises:
            ValueError: If ``steps`` or ``count`` is below 1.
        """
        _check_steps(steps)
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise ValueError(f"count must be an int >= 1 or None, not {count!r}")
        played = 0
        async with self._signing_off(agent, batch):
            while count is None or played < count:
                rollout = await self._play(agent, steps, batch)
                played += 1
                yield rollout

    @contextlib.asynccontextmanager
    async def _signing_off(self, agent: ActorRef[Any], batch: bool) -> AsyncIterator[None]:
        """Tell the agent this observer stops asking (it counts it out of its batches) when the block ends.

        Not when the block is cancelled or its stream closed: then the agent
        left, and counts its observers out itself.
        """
        try:
            yield
        except Exception:
            with contextlib.suppress(Exception):  # the block's own error is the one to raise
                await self._ask(agent, (self.key, None), batch)
            raise
        await self._ask(agent, (self.key, None), batch)

    async def _play(self, agent: ActorRef[Any], steps: int | None, batch: bool) -> Rollout:
        """One run's steps, without signing off from the agent's batches."""
        limit = self.max_steps if steps is None else steps
        rewards: list[float] = []
        dones: list[bool] = []
        episodes: list[float] = []
        episode_reward = 0.0
        state = self.reset()
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
        return Rollout(self.key, torch.tensor(rewards, dtype=torch.float32), torch.tensor(dones), episodes)

    @staticmethod
    async def _ask(agent: ActorRef[Any], observation: Observation, batch: bool) -> Any:
        # By name: agent.py imports this module, so this one cannot name Agent (no cycles, even for types).
        if batch:
            return await agent.call("select_action_batch", observation)
        return await agent.call("select_action", observation)

    def reset(self) -> torch.Tensor:
        """Reset the environment (seeded the first time) and return the state."""
        raw, _ = self.env.reset(seed=self.seed) if self.seed is not None else self.env.reset()
        self.seed = None
        return self.to_state(raw)

    def to_state(self, observation: Any) -> torch.Tensor:
        """The environment's observation as the float32 tensor the agent's policy takes."""
        return torch.as_tensor(observation, dtype=torch.float32)

    def to_env(self, action: Any) -> Any:
        """The agent's action as the environment takes it: a number, or a tensor as a NumPy array (from any device)."""
        return action.numpy(force=True) if isinstance(action, torch.Tensor) else action


def _check_steps(steps: int | None) -> None:
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1 or None, not {steps!r}")
