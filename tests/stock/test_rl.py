"""Agent and Observer in an in-process world, playing the tiny deterministic corridor."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from _mp import SCRIPTS
from torch import nn

import actorch
from actorch.rl import Agent, EpisodeStats, Observer, Rollout
from actorch.testing import LocalWorld

sys.path.insert(0, str(SCRIPTS))
from corridor import Corridor, FramePolicy, Pixels, broken_corridor, corridor, drift


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
    assert "1 of 3 calls to 'play' failed: member 2 (actor 'rl/observers/broken' on node 1)" in str(caught.value)
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
    envs = [Corridor(length=2), Corridor(length=2)]
    observer = await world[0].spawn(Observer, args=([lambda: envs[0], lambda: envs[1]],), kwargs={"seed": 5})
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "none/*"})
    await observer.call(Observer.play, agent, 1)
    await observer.call(Observer.play, agent, 1)
    assert [env.seeds for env in envs] == [[5, None], [6, None]]


# --------------------------------------------------------------------------- several environments per observer


class GreedyAgent(Agent):
    """Acts without chance (right while the position is below 1), so runs depend on the seeds alone."""

    def act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actions = (states[:, 0] < 1.0).long()
        return actions, torch.zeros(len(actions))


def same_rollouts(left: Rollout, right: Rollout) -> bool:
    assert left.states is not None
    assert right.states is not None
    return (
        torch.equal(left.rewards, right.rewards)
        and torch.equal(left.dones, right.dones)
        and left.episode_rewards == right.episode_rewards
        and torch.equal(left.states, right.states)
        and torch.equal(left.actions, right.actions)  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("steps", [None, 13], ids=["one-episode-each", "fixed-steps"])
@pytest.mark.parametrize("batch", [True, False], ids=["batched", "plain"])
async def test_observer_of_several_envs_plays_each_as_a_single_observer_with_the_next_seed(
    world: LocalWorld, steps: int | None, batch: bool
) -> None:
    await world[0].spawn(Observer, args=(drift,), kwargs={"num_envs": 3, "seed": 10}, name="rl/many/0", on=1)
    for index in range(3):
        await world[0].spawn(Observer, args=(drift,), kwargs={"seed": 10 + index}, name=f"rl/single/{index}", on=2)
    options = {"batch": batch}
    many = await world[0].spawn(GreedyAgent, args=(small_policy,), kwargs={"observers": "rl/many/*", **options})
    single = await world[0].spawn(GreedyAgent, args=(small_policy,), kwargs={"observers": "rl/single/*", **options})
    together = await many.call(Agent.collect, steps)
    apart = await single.call(Agent.collect, steps)
    assert [(rollout.observer, rollout.env) for rollout in together] == [("rl/many/0", index) for index in range(3)]
    assert all(same_rollouts(left, right) for left, right in zip(together, apart, strict=True))
    lengths = {len(rollout.rewards) for rollout in together}
    if steps is None:
        assert len(lengths) > 1, "the seeds give episodes of different lengths: environments drop out one by one"
        assert all(len(rollout.episode_rewards) == 1 for rollout in together)
    else:
        assert lengths == {13}
        assert all(len(rollout.episode_rewards) >= 2 for rollout in together)


async def test_agent_answers_every_environment_of_every_observer_in_one_forward_a_step(world: LocalWorld) -> None:
    await world[0].spawn(Observer, args=(corridor,), kwargs={"num_envs": 4}, name="rl/observers/0", on=1)
    await world[0].spawn(Observer, args=(corridor,), name="rl/observers/1", on=2)
    agent = await world[0].spawn(CountingAgent, args=(small_policy,), kwargs={"seed": 0})
    stats = await agent.call(Agent.run_episode)
    assert stats.observers == 2
    assert stats.steps == 5 * 8
    assert await agent.call(CountingAgent.forward_sizes) == [5] * 8
    seen = await agent.call(CountingAgent.learned_from)
    assert seen == [(["rl/observers/0"] * 4 + ["rl/observers/1"], [8] * 5)]


class RecordingAgent(GreedyAgent):
    """Its log-probabilities are the positions acted on, which differ per environment and step."""

    def act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actions, _ = super().act(states)
        return actions, states[:, 0] + 0.0 * self.policy(states)[:, 0]

    def learn(self, rollouts: list[Rollout], log_probs: list[torch.Tensor]) -> float:
        self.checked = [
            torch.allclose(rows, rollout.states[:, 0])  # type: ignore[index]
            for rollout, rows in zip(rollouts, log_probs, strict=True)
        ]
        return 0.0

    async def checks(self) -> list[bool]:
        return self.checked


class RecordingObserver(Observer):
    """Always keeps the states it acted on."""

    async def play(self, agent: Any, steps: int | None = None, *, batch: bool = True, record: bool = False) -> Any:
        return await super().play(agent, steps, batch=batch, record=True)


async def test_agent_learns_from_the_log_probabilities_of_each_environment_in_step_order(world: LocalWorld) -> None:
    await world[0].spawn(
        RecordingObserver, args=(drift,), kwargs={"num_envs": 3, "seed": 3}, name="rl/observers/0", on=1
    )
    agent = await world[0].spawn(RecordingAgent, args=(small_policy,))
    await agent.call(Agent.run_episode)
    assert await agent.call(RecordingAgent.checks) == [True] * 3


async def test_agent_collect_plays_without_learning_and_records_what_was_seen(world: LocalWorld) -> None:
    await seat(world, 2)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"seed": 0})
    rollouts = await agent.call(Agent.collect, 5)
    assert [rollout.observer for rollout in rollouts] == ["rl/observers/0", "rl/observers/1"]
    for rollout in rollouts:
        assert rollout.states is not None
        assert rollout.states.shape == (5, 2)
        assert rollout.actions is not None
        assert rollout.actions.tolist() == [
            int(reward) for reward in rollout.rewards.tolist()
        ]  # the corridor pays the action
    assert (await agent.call(Agent.statistics))["episodes"] == 0
    assert (await agent.call(Agent.run_episode)).episode == 1  # learning goes on as before


async def test_single_environment_endpoints_name_their_several_environment_twins(world: LocalWorld) -> None:
    observer = await world[0].spawn(Observer, args=([corridor, corridor],), on=1)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "none/*"})
    with pytest.raises(ValueError, match=r"'run' plays one environment and .* has 2: call Observer.play"):
        await observer.call(Observer.run, agent)
    with pytest.raises(ValueError, match=r"'episodes' plays one environment .* call Observer.plays"):
        async for _ in observer.stream(Observer.episodes, agent):
            pass
    runs = [rollouts async for rollouts in observer.stream(Observer.plays, agent, 3, batch=False, count=2)]
    assert [[len(rollout.rewards) for rollout in run] for run in runs] == [[3, 3], [3, 3]]


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        (corridor, {"num_envs": 0}, "num_envs must be an int >= 1"),
        ([corridor, corridor], {"num_envs": 3}, "num_envs=3 disagrees with the 2 environment factories"),
        ([], {}, "the list of environment factories is empty"),
    ],
)
async def test_observer_refuses_environments_that_do_not_add_up(
    world: LocalWorld, env: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        await world[0].spawn(Observer, args=(env,), kwargs=kwargs)


async def test_agent_streams_runs_of_observers_with_several_environments(world: LocalWorld) -> None:
    await world[0].spawn(Observer, args=(corridor,), kwargs={"num_envs": 3}, name="rl/observers/0", on=1)
    await world[0].spawn(Observer, args=(corridor,), name="rl/observers/1", on=2)
    agent = await world[0].spawn(CountingAgent, args=(small_policy,), kwargs={"seed": 0})
    history = await agent.call(Agent.train_streaming, 3)
    assert [stats.steps for stats in history] == [4 * 8] * 3
    assert [lengths for _, lengths in await agent.call(CountingAgent.learned_from)] == [[8] * 4] * 3


def cartpole() -> Any:
    import gymnasium  # noqa: PLC0415 - only these tests need it

    return gymnasium.make("CartPole-v1")


def cartpole_vector(mode: str) -> Any:
    import gymnasium  # noqa: PLC0415 - only these tests need it

    autoreset = getattr(gymnasium.vector.AutoresetMode, mode)
    return gymnasium.make_vec(
        "CartPole-v1", num_envs=3, vectorization_mode="sync", vector_kwargs={"autoreset_mode": autoreset}
    )


@pytest.mark.parametrize("mode", ["SAME_STEP", "DISABLED"])
async def test_observer_plays_a_gymnasium_vector_env_as_it_plays_separate_ones(world: LocalWorld, mode: str) -> None:
    pytest.importorskip("gymnasium")
    await world[0].spawn(Observer, args=(lambda: cartpole_vector(mode),), kwargs={"seed": 4}, name="v/0")
    await world[0].spawn(Observer, args=([cartpole] * 3,), kwargs={"seed": 4}, name="s/0")
    results = []
    for pattern in ("v/*", "s/*"):
        agent = await world[0].spawn(GreedyAgent, args=(small_policy,), kwargs={"observers": pattern})
        results.append(await agent.call(Agent.collect, 30))
    assert [rollout.env for rollout in results[0]] == [0, 1, 2]
    assert all(same_rollouts(left, right) for left, right in zip(*results, strict=True))
    assert any(rollout.episode_rewards for rollout in results[0]), "an episode ended and its environment was reset"


class Logits(nn.Module):
    """Logits that make action 1 all but certain."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor([[-20.0, 20.0]]))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(len(states), 2)


async def test_agent_samples_from_logits_when_told(world: LocalWorld) -> None:
    await seat(world, 1)
    agent = await world[0].spawn(Agent, args=(Logits,), kwargs={"logits": True})
    [rollout] = await agent.call(Agent.collect, 6)
    assert rollout.actions is not None
    assert rollout.actions.tolist() == [1] * 6


async def test_observer_hands_the_agent_states_in_the_environments_dtype(world: LocalWorld) -> None:
    await world[0].spawn(Observer, args=(Pixels,), kwargs={"num_envs": 2}, name="rl/observers/0", on=1)
    agent = await world[0].spawn(Agent, args=(FramePolicy,), kwargs={"logits": True})
    rollouts = await agent.call(Agent.collect, 3)
    for rollout in rollouts:
        assert rollout.states is not None
        assert rollout.states.dtype == torch.uint8
        assert rollout.states.shape == (3, 2, 3)


async def test_observer_refuses_a_vector_env_that_resets_in_the_next_step(world: LocalWorld) -> None:
    pytest.importorskip("gymnasium")
    with pytest.raises(ValueError, match=r"AutoresetMode\.SAME_STEP"):
        await world[0].spawn(Observer, args=(lambda: cartpole_vector("NEXT_STEP"),))
