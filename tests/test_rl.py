"""Agent and Observer in an in-process world, playing the tiny deterministic corridor."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from _mp import SCRIPTS
from torch import nn

import actorch
from actorch import Agent, EpisodeStats, Observer, Rollout
from actorch.testing import LocalWorld

sys.path.insert(0, str(SCRIPTS))
from corridor import Corridor, broken_corridor, corridor


def small_policy() -> nn.Module:
    """Two observation features to two action probabilities."""
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=-1))


class CountingAgent(Agent):
    """Records the batch size of every policy forward."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forwards: list[int] = []
        self.seen: list[tuple[list[str], list[int]]] = []

    def act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.forwards.append(states.shape[0])
        return super().act(states)

    def learn(self, rollouts: list[Rollout], log_probs: list[torch.Tensor]) -> float:
        self.seen.append(([r.observer for r in rollouts], [len(p) for p in log_probs]))
        return super().learn(rollouts, log_probs)

    async def forward_sizes(self) -> list[int]:
        return self.forwards

    async def learned_from(self) -> list[tuple[list[str], list[int]]]:
        return self.seen


async def seat(world: LocalWorld, count: int, env: Any = corridor, prefix: str = "rl/observers") -> None:
    for index in range(count):
        await world[0].spawn(Observer, args=(env,), kwargs={"seed": index}, name=f"{prefix}/{index}", on=index % 3)


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "plain"])
async def test_agent_episode_plays_every_observer_once(world: LocalWorld, batch: bool) -> None:
    await seat(world, 3)
    agent = await world[0].spawn(CountingAgent, args=(small_policy,), kwargs={"batch": batch, "seed": 0})
    stats = await agent.call(Agent.run_episode)
    assert isinstance(stats, EpisodeStats)
    assert stats.episode == 1
    assert stats.observers == 3
    assert stats.steps == 3 * 8  # the corridor always lasts 8 steps
    assert 0 <= stats.reward <= 8
    seen = await agent.call(CountingAgent.learned_from)
    assert seen == [(["rl/observers/0", "rl/observers/1", "rl/observers/2"], [8, 8, 8])]
    sizes = await agent.call(CountingAgent.forward_sizes)
    assert sizes == ([3] * 8 if batch else [1] * 24), "batched: one forward per step for all observers"


async def test_agent_finds_observers_by_pattern_each_episode(world: LocalWorld) -> None:
    await seat(world, 2)
    await seat(world, 1, prefix="elsewhere")
    agent = await world[0].spawn(Agent, args=(small_policy,))
    assert (await agent.call(Agent.run_episode)).observers == 2
    await world[0].spawn(Observer, args=(corridor,), name="rl/observers/late", on=2)
    assert (await agent.call(Agent.run_episode)).observers == 3
    assert await agent.call(Agent.observers) == ["rl/observers/0", "rl/observers/1", "rl/observers/late"]


async def test_agent_with_no_observers_says_so(world: LocalWorld) -> None:
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "nobody/*"})
    with pytest.raises(actorch.ActorNotFoundError, match="no observers match 'nobody/\\*'"):
        await agent.call(Agent.run_episode)


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "plain"])
async def test_observer_fixed_length_run_resets_the_env_between_episodes(world: LocalWorld, batch: bool) -> None:
    await seat(world, 2)
    agent = await world[0].spawn(CountingAgent, args=(small_policy,), kwargs={"batch": batch})
    stats = await agent.call(Agent.run_episode, 20)
    assert stats.steps == 40
    assert (await agent.call(CountingAgent.learned_from))[0][1] == [20, 20]
    if batch:
        assert await agent.call(CountingAgent.forward_sizes) == [2] * 20


async def test_agent_learns_to_walk_the_corridor(world: LocalWorld) -> None:
    await seat(world, 3)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"seed": 1, "lr": 0.05})
    first = await agent.call(Agent.run_episode)
    for _ in range(40):
        last = await agent.call(Agent.run_episode)
    assert last.running_reward > first.reward + 2.0, (first, last)
    assert last.reward >= 7.0
    statistics = await agent.call(Agent.statistics)
    assert statistics["episodes"] == 41
    assert statistics["actions"] == 41 * 3 * 8


async def test_observer_failure_fails_the_episode_and_the_agent_goes_on(world: LocalWorld) -> None:
    await seat(world, 2)
    await world[0].spawn(Observer, args=(broken_corridor,), name="rl/observers/broken", on=1)
    agent = await world[0].spawn(Agent, args=(small_policy,))
    with pytest.raises(actorch.RemoteError) as caught:
        await agent.call(Agent.run_episode)
    assert "1 of 3 calls to 'run' failed: member 2 (actor 'rl/observers/broken' on node 1)" in str(caught.value)
    await (await world[0].lookup("rl/observers/broken")).stop()
    assert (await agent.call(Agent.run_episode)).observers == 2  # no batch waits for the broken one


async def test_observer_plays_one_episode_against_any_agent_ref(world: LocalWorld) -> None:
    observer = await world[0].spawn(Observer, args=(corridor,), kwargs={"seed": 7}, on=1)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "none/*"})
    rollout = await observer.call(Observer.run, agent, batch=False)
    assert rollout.observer.startswith("Observer#1:")
    assert rollout.rewards.dtype == torch.float32
    assert rollout.rewards.shape == (8,)
    assert rollout.dones.tolist() == [False] * 7 + [True]
    assert rollout.episode_rewards == [float(rollout.rewards.sum())]


def test_agent_returns_are_discounted_and_restart_after_each_episode() -> None:
    agent = object.__new__(Agent)
    agent.gamma = 0.5
    rollout = Rollout("o", torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([False, True, False, False]), [2.0])
    assert agent.returns(rollout).tolist() == [1.5, 1.0, 1.5, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"gamma": 1.5}, "gamma must be within"), ({"smoothing": 0.0}, "smoothing must be within")],
)
async def test_agent_refuses_bad_options(world: LocalWorld, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await world[0].spawn(Agent, args=(small_policy,), kwargs=kwargs)


async def test_observer_refuses_bad_options(world: LocalWorld) -> None:
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        await world[0].spawn(Observer, args=(corridor,), kwargs={"max_steps": 0})
    with pytest.raises(ValueError, match="cannot import the environment factory"):
        await world[0].spawn(Observer, args=("no_such_module:make",))
    observer = await world[0].spawn(Observer, args=(corridor,))
    agent = await world[0].spawn(Agent, args=(small_policy,))
    with pytest.raises(ValueError, match="steps must be >= 1 or None"):
        await observer.call(Observer.run, agent, 0)


async def test_observer_seeds_only_its_first_reset(world: LocalWorld) -> None:
    env = Corridor(length=2)
    observer = Observer.__new__(Observer)
    observer.env = env
    observer.seed = 5
    observer.reset()
    observer.reset()
    assert env.seeds == [5, None]
