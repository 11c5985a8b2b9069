"""``Observer``: the actor that plays environments against an agent, and ``Rollout``, what one of them saw.

Each observer owns one environment, or K of them, on its node. In a run it
sends the agent the states of all its environments in one message (one at a
time or through the agent's batched endpoint), applies the actions it gets
back, and at the end returns one :class:`Rollout` per environment: the rewards
and episode ends it saw. Or it streams its runs (:meth:`Observer.plays`), one
per run, playing on until the agent has enough. With K environments a message
and its reply carry K states and K actions, so the runtime's cost per message
is shared by K steps. The agent that drives the observers lives in
``agent.py``; this module knows it only as the type of a ref, and calls its
endpoints by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from actorch._actors.actor import Actor
from actorch._actors.ref import ActorRef
from actorch._base.codec import serializable
from actorch._stock.envs import EnvFactory, EnvPlayer

__all__ = ["Observation", "Observer", "Rollout"]

Observation = tuple[str, torch.Tensor | None, list[int] | None]
"""What an observer sends for actions.

Its key; the states of the environments it asks for, stacked (``[n, *state]``;
None: its run has ended); and which of its environments they are (None: all,
in order).
"""


@serializable()
@dataclass
class Rollout:
    """What one environment of an observer saw in one run.

    Attributes:
        observer: The key the observer sent its states under (its name, if it has one).
        rewards: One reward per step, float32.
        dones: Whether an episode ended at each step (terminated or truncated).
        episode_rewards: The total reward of each episode that ended in the run.
        env: Which of the observer's environments played it (0 with one environment).
        states: The state acted on at each step, ``[steps, *state]``, when the
            run recorded them (``Agent.collect`` does); else None.
        actions: The action taken at each step, ``[steps, *action]``, when recorded.
    """

    observer: str
    rewards: torch.Tensor = field(repr=False)
    dones: torch.Tensor = field(repr=False)
    episode_rewards: list[float]
    env: int = 0
    states: torch.Tensor | None = field(default=None, repr=False)
    actions: torch.Tensor | None = field(default=None, repr=False)


class Observer(EnvPlayer, Actor):
    """Plays environments against an agent: sends states, receives actions, returns what each saw.

    Args:
        env: A function returning the environment (any object with Gymnasium's
            ``reset(seed=...) -> (obs, info)`` and ``step(action) -> (obs,
            reward, terminated, truncated, info)``), or its ``"module:function"``
            path; a list of them, for several environments; or a function
            returning a Gymnasium vector environment whose ``autoreset_mode`` is
            ``SAME_STEP`` or ``DISABLED``.
        num_envs: How many environments to build from ``env`` (None: one, or as
            many as the list or the vector environment has).
        seed: Seed of the first reset: environment ``i`` gets ``seed + i``.
        max_steps: Longest single episode, for environments that never end.

    Raises:
        ValueError: If ``max_steps`` or ``num_envs`` is below 1, or the
            environments given disagree with ``num_envs``.
    """

    def __init__(
        self,
        env: EnvFactory | Sequence[EnvFactory],
        *,
        num_envs: int | None = None,
        seed: int | None = None,
        max_steps: int = 10_000,
    ) -> None:
        self._open_envs(env, num_envs, max_steps)
        self.env: Any = self.envs.vector if self.envs.vector is not None else self.envs.envs[0]
        """The environment (the first one, or the vector environment)."""
        self.seed = seed
        self.key = self.name or f"{type(self).__name__}#{self.ref.rank}:{id(self):x}"

    async def run(self, agent: ActorRef[Any], steps: int | None = None, *, batch: bool = True) -> Rollout:
        """Play one environment against ``agent`` and return what was seen.

        Args:
            agent: The agent that chooses actions.
            steps: None plays one episode (at most ``max_steps``); a number plays
                exactly that many steps, resetting the environment whenever an
                episode ends, as the batch tutorial's observers do.
            batch: Ask for actions through the agent's batched endpoint.

        Raises:
            ValueError: If ``steps`` is below 1, or the observer has several
                environments (:meth:`play` returns one rollout each).
        """
        self._check_single("run", "play")
        [rollout] = await self.play(agent, steps, batch=batch)
        return rollout

    async def play(
        self, agent: ActorRef[Any], steps: int | None = None, *, batch: bool = True, record: bool = False
    ) -> list[Rollout]:
        """Play every environment against ``agent``; return one :class:`Rollout` per environment, in order.

        Each message to the agent carries the states of all the environments
        still playing, and its reply their actions.

        Args:
            agent: The agent that chooses actions.
            steps: None: each environment plays one episode (at most
                ``max_steps``) and the run ends when all have; a number: each
                plays exactly that many steps, reset whenever an episode ends.
            batch: Ask for actions through the agent's batched endpoint.
            record: Keep the states and actions in the rollouts.

        Raises:
            ValueError: If ``steps`` is below 1.
        """
        _check_steps(steps)
        async with self._signing_off(agent, batch):
            return await self._play(agent, steps, batch, record)

    async def episodes(
        self, agent: ActorRef[Any], steps: int | None = None, *, batch: bool = True, count: int | None = None
    ) -> AsyncIterator[Rollout]:
        """Play one environment against ``agent`` run after run, yielding each run's :class:`Rollout` as it ends.

        :meth:`plays` for an observer of one environment.

        Raises:
            ValueError: If ``steps`` or ``count`` is below 1, or the observer
                has several environments (:meth:`plays` yields a list per run).
        """
        self._check_single("episodes", "plays")
        async for rollouts in self.plays(agent, steps, batch=batch, count=count):
            yield rollouts[0]

    async def plays(
        self,
        agent: ActorRef[Any],
        steps: int | None = None,
        *,
        batch: bool = True,
        record: bool = False,
        count: int | None = None,
    ) -> AsyncIterator[list[Rollout]]:
        """Play against ``agent`` run after run, yielding each run's rollouts (one per environment) as it ends.

        A stream: ``agent.stream(Observer.plays, ...)`` from the agent (see
        :meth:`Agent.train_streaming`). Each item is what :meth:`play` with the
        same ``steps`` returns, and the next run starts as soon as the stream
        has room for it (its window), so the observer keeps playing while the
        agent learns. The stream ends after ``count`` runs, or when the
        consumer leaves; an error of an environment or the agent ends it with
        that error.

        Args:
            agent: The agent that chooses actions.
            steps: Steps per run, as for :meth:`play` (None: one episode each).
            batch: Ask for actions through the agent's batched endpoint.
            record: Keep the states and actions in the rollouts.
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
                rollouts = await self._play(agent, steps, batch, record)
                played += 1
                yield rollouts

    def _check_single(self, endpoint: str, instead: str) -> None:
        if self.num_envs != 1:
            raise ValueError(
                f"{endpoint!r} plays one environment and {self.key} has {self.num_envs}: "
                f"call Observer.{instead}, which gives one Rollout per environment"
            )

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
                await self._ask(agent, (self.key, None, None), batch)
            raise
        await self._ask(agent, (self.key, None, None), batch)

    async def _play(self, agent: ActorRef[Any], steps: int | None, batch: bool, record: bool) -> list[Rollout]:
        """One run's steps in every environment, without signing off from the agent's batches."""
        count = self.num_envs
        limit = self.max_steps if steps is None else steps
        rewards: list[list[float]] = [[] for _ in range(count)]
        dones: list[list[bool]] = [[] for _ in range(count)]
        episodes: list[list[float]] = [[] for _ in range(count)]
        seen: list[list[torch.Tensor]] = [[] for _ in range(count)]
        taken: list[list[Any]] = [[] for _ in range(count)]
        episode_reward = [0.0] * count
        reset = self.reset()
        states = reset.unsqueeze(0) if count == 1 else reset
        playing = list(range(count))
        while playing:
            every = len(playing) == count
            replies = await self._ask(agent, (self.key, states, None if every else list(playing)), batch)
            actions = _split_actions(replies)
            steps_seen = self.envs.step([self.to_env(action) for action in actions], playing)
            still: list[int] = []
            next_states: list[torch.Tensor] = []
            for row, index in enumerate(playing):
                reward = steps_seen.rewards[row]
                rewards[index].append(reward)
                episode_reward[index] += reward
                played = len(rewards[index])
                ended = steps_seen.terminated[row] or steps_seen.truncated[row]
                done = ended or (steps is None and played == limit)
                dones[index].append(done)
                if record:
                    seen[index].append(states[row])
                    taken[index].append(actions[row])
                if done:
                    episodes[index].append(episode_reward[index])
                    episode_reward[index] = 0.0
                if played < limit and not (done and steps is None):  # an ended episode's environment was reset
                    still.append(index)
                    next_states.append(self.to_state(steps_seen.observations[row]))
            playing = still
            if playing:
                states = torch.stack(next_states)
        return [
            Rollout(
                self.key,
                torch.tensor(rewards[index], dtype=torch.float32),
                torch.tensor(dones[index]),
                episodes[index],
                index,
                torch.stack(seen[index]) if record else None,
                _stack_actions(taken[index]) if record else None,
            )
            for index in range(count)
        ]

    @staticmethod
    async def _ask(agent: ActorRef[Any], observation: Observation, batch: bool) -> Any:
        # By name: agent.py imports this module, so this one cannot name Agent (no cycles, even for types).
        if batch:
            return await agent.call("select_action_batch", observation)
        return await agent.call("select_action", observation)

    def reset(self) -> torch.Tensor:
        """Reset every environment (seeded the first time); return the state, or the states stacked if several."""
        observations = self.envs.reset(self.seed)
        self.seed = None
        if self.num_envs == 1:
            return self.to_state(observations[0])
        return torch.stack([self.to_state(observation) for observation in observations])


def _split_actions(replies: Any) -> list[Any]:
    """One action per environment asked for, from the agent's reply: a list of numbers, or a tensor of rows."""
    if isinstance(replies, torch.Tensor):
        return list(replies.unbind(0))
    return list(replies)


def _stack_actions(actions: list[Any]) -> torch.Tensor:
    if actions and isinstance(actions[0], torch.Tensor):
        return torch.stack([action.cpu() for action in actions])
    return torch.tensor(actions)


def _check_steps(steps: int | None) -> None:
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1 or None, not {steps!r}")
