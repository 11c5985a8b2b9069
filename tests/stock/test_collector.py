"""Collector and Collection in an in-process world: batches, weights and versions, lag, buffers, failures."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, ClassVar

import pytest
import structlog
import torch
from _mp import SCRIPTS
from torch import nn

import actorch
from actorch import ParameterServer, ReplayBuffer
from actorch.rl import Batch, Collection, Collector
from actorch.testing import LocalWorld

sys.path.insert(0, str(SCRIPTS))
from corridor import Corridor, FramePolicy, Pixels, broken_corridor, corridor, drift


def policy() -> nn.Module:
    """Two observation features to two action probabilities."""
    return nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2), nn.Softmax(dim=-1))


class AlwaysRight(nn.Module):
    """A policy with one weight: the probability of action 1 is ``sigmoid(weight)``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        right = torch.sigmoid(self.weight).expand(len(states))
        return torch.stack([1 - right, right], dim=1)


def always_right() -> nn.Module:
    return AlwaysRight()


class SlowCorridor(Corridor):
    """A corridor of 1,000 cells whose every step takes a millisecond: a batch given up on stops midway."""

    made: ClassVar[list[SlowCorridor]] = []

    def __init__(self) -> None:
        super().__init__(length=1000)
        self.stepped = asyncio.Event()
        SlowCorridor.made.append(self)

    def step(self, action: Any) -> tuple[list[float], float, bool, bool, dict[str, Any]]:
        time.sleep(0.001)
        self.stepped.set()
        return super().step(action)


async def spawn(world: LocalWorld, count: int = 2, **kwargs: Any) -> list[actorch.ActorRef[Collector]]:
    options = {"num_envs": 2, "frames_per_batch": 8, "seed": 0, **kwargs}
    env = options.pop("env", corridor)
    made = options.pop("policy", policy)
    return [
        await world[0].spawn(
            Collector, args=(env, made), kwargs=options, name=f"rl/collectors/{index}", on=1 + index % 2
        )
        for index in range(count)
    ]


async def test_collector_batch_holds_every_step_of_every_environment_time_major(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, num_envs=3, frames_per_batch=30, env=drift)
    batch = await collector.call(Collector.collect)
    assert isinstance(batch, Batch)
    assert batch.collector == "rl/collectors/0"
    assert batch.version == 0
    assert batch.frames == 30
    assert batch.observations.shape == (10, 3, 2)
    assert batch.next_observations.shape == (10, 3, 2)
    for field in (batch.actions, batch.log_probs, batch.rewards, batch.terminated, batch.truncated):
        assert field.shape == (10, 3)
    assert batch.terminated.dtype == torch.bool
    assert bool(batch.dones.any()), "drift's episodes last 3 to 6 steps"
    # a step's next state is the state acted on next, except where the episode ended (its environment was reset)
    same = (batch.next_observations[:-1] == batch.observations[1:]).all(dim=2)
    assert bool((same | batch.dones[:-1]).all())
    assert len(batch.episode_returns) == int(batch.dones.sum()) == len(batch.episode_lengths)
    assert all(3 <= length <= 6 for length in batch.episode_lengths[:1])  # the first episodes began in this batch
    probabilities = batch.log_probs.exp()
    assert bool(((probabilities > 0) & (probabilities <= 1)).all())


async def test_collector_goes_on_where_its_last_batch_ended(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, frames_per_batch=4)
    first = await collector.call(Collector.collect)
    second = await collector.call(Collector.collect)
    assert torch.equal(second.observations[0], first.next_observations[-1])  # the corridor lasts 8 steps: no reset yet
    statistics = await collector.call(Collector.statistics)
    assert statistics["batches"] == 2
    assert statistics["frames"] == 8
    assert statistics["frames_per_second"] > 0


async def test_collector_goes_on_from_where_its_environments_are_after_a_batch_given_up(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, num_envs=1, frames_per_batch=200, env=SlowCorridor, policy=always_right)
    await collector.call(Collector.set_weights, {"weight": torch.tensor([50.0])}, 1)  # always steps right
    given_up = asyncio.ensure_future(collector.call(Collector.collect))  # 200 steps: 0.2 s at least
    async with asyncio.timeout(10):
        await SlowCorridor.made[-1].stepped.wait()
    given_up.cancel()  # midway: the handler is cancelled where it lets the loop run
    with pytest.raises(asyncio.CancelledError):
        await given_up
    batch = await collector.call(Collector.collect)
    cells = (batch.observations[:, 0, 0] * 1000).round()
    following = (batch.next_observations[:, 0, 0] * 1000).round()
    assert torch.equal(following - cells, torch.ones(200)), "every transition is one cell right of the state acted on"
    assert cells[0] > 0, "the batch starts where the cancelled one left the environment"


async def test_collector_counts_episode_returns_across_batches(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, num_envs=1, frames_per_batch=3, policy=always_right)
    await collector.call(Collector.set_weights, {"weight": torch.tensor([50.0])}, 1)  # always steps right
    batches = [await collector.call(Collector.collect) for _ in range(4)]  # 12 steps: one corridor of 8, then 4
    assert [batch.episode_returns for batch in batches] == [[], [], [8.0], []]
    assert [batch.episode_lengths for batch in batches] == [[], [], [8], []]
    assert [batch.version for batch in batches] == [1, 1, 1, 1]


async def test_collector_takes_new_weights_between_batches_and_stamps_their_version(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, num_envs=1, frames_per_batch=8, policy=always_right)
    assert await collector.call(Collector.set_weights, {"weight": torch.tensor([-50.0])}, 3) == 3
    stays = await collector.call(Collector.collect)
    assert stays.version == 3
    assert stays.actions.sum() == 0
    assert await collector.call(Collector.set_weights, {"weight": torch.tensor([50.0])}, 2) == 3  # older: ignored
    assert (await collector.call(Collector.collect)).actions.sum() == 0
    await collector.call(Collector.set_weights, {"weight": torch.tensor([50.0])}, 4)
    moves = await collector.call(Collector.collect)
    assert moves.version == 4
    assert moves.actions.sum() == 8


async def test_collector_keeps_the_weights_of_a_version_while_the_learner_trains_on(world: LocalWorld) -> None:
    # On the learner's own node the call passes the learner's tensors themselves, not a copy.
    collector = await world[0].spawn(
        Collector, args=(corridor, always_right), kwargs={"num_envs": 1, "frames_per_batch": 8}, on=0
    )
    learner = AlwaysRight()
    with torch.no_grad():
        learner.weight.fill_(-50.0)
    async with Collection([collector]) as collection:
        await collection.publish(learner)
        with torch.no_grad():
            learner.weight.fill_(50.0)  # a learning step in place, after version 1 was published
        batch = await collector.call(Collector.collect)
    assert batch.version == 1
    assert batch.actions.sum() == 0, "version 1 never steps right"


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"nope": torch.zeros(1)}, r"has no 'nope'"),
        ({"weight": torch.zeros(3)}, r"'weight' must be a tensor of shape \(1,\), got \(3,\)"),
    ],
)
async def test_collector_refuses_weights_that_would_never_take_effect(
    world: LocalWorld, weights: dict[str, torch.Tensor], message: str
) -> None:
    [collector] = await spawn(world, 1, policy=always_right)
    with pytest.raises(ValueError, match=message):
        await collector.call(Collector.set_weights, weights, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"frames_per_batch": 7}, "frames_per_batch must be a positive multiple of the 2 environments"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
        ({"num_envs": 0}, "num_envs must be an int >= 1"),
    ],
)
async def test_collector_refuses_bad_options(world: LocalWorld, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await spawn(world, 1, **kwargs)


async def test_collector_truncates_episodes_at_max_steps(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, num_envs=1, frames_per_batch=10, max_steps=3, policy=always_right)
    batch = await collector.call(Collector.collect)
    assert batch.truncated[:, 0].tolist() == [False, False, True] * 3 + [False]
    assert batch.episode_lengths == [3, 3, 3]
    assert batch.observations[3, 0, 0] == 0.0  # the environment was reset after the cut


async def test_collector_truncates_at_max_steps_across_batches(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, num_envs=1, frames_per_batch=2, max_steps=3, policy=always_right)
    batches = [await collector.call(Collector.collect) for _ in range(5)]
    assert torch.cat([batch.truncated[:, 0] for batch in batches]).tolist() == [False, False, True] * 3 + [False]
    assert [length for batch in batches for length in batch.episode_lengths] == [3, 3, 3]
    rewards = torch.cat([batch.rewards[:, 0] for batch in batches])
    returns = [total for batch in batches for total in batch.episode_returns]
    assert returns == [float(rewards[start : start + 3].sum()) for start in (0, 3, 6)]


async def test_collector_keeps_the_environments_dtype_in_its_batch(world: LocalWorld) -> None:
    [pixels] = await spawn(world, 1, env=Pixels, policy=FramePolicy, logits=True)
    batch = await pixels.call(Collector.collect)
    assert batch.observations.dtype == batch.next_observations.dtype == torch.uint8
    assert batch.observations.shape == (4, 2, 2, 3)
    assert torch.equal(batch.next_observations[:-1], batch.observations[1:])
    floats = await world[0].spawn(Collector, args=(corridor, policy), kwargs={"num_envs": 2, "frames_per_batch": 8})
    assert (await floats.call(Collector.collect)).observations.dtype == torch.float32  # lists of Python floats


class Scaled(Collector):
    """Converts its observations itself: the batch holds what ``to_state`` makes."""

    def to_state(self, observation: Any) -> torch.Tensor:
        return torch.tensor([observation[0] * 10, observation[1]], dtype=torch.float64)


async def test_collector_batch_holds_what_an_overridden_to_state_makes(world: LocalWorld) -> None:
    collector = await world[0].spawn(
        Scaled, args=(corridor, always_right), kwargs={"num_envs": 2, "frames_per_batch": 20, "max_steps": 4}, on=1
    )
    await collector.call(Collector.set_weights, {"weight": torch.tensor([50.0])}, 1)  # always steps right
    batch = await collector.call(Collector.collect)
    assert batch.observations.dtype == torch.float64
    assert batch.observations[:4, 0, 0].tolist() == [0.0, 1.25, 2.5, 3.75]  # one cell of eight a step, times 10
    assert batch.observations[4, 0, 0] == 0.0, "cut at max_steps and reset"
    assert batch.next_observations[3, 0, 0] == 5.0, "the last state of the cut episode"
    assert batch.episode_lengths == [4, 4, 4, 4]


class Logits(nn.Module):
    """Logits that make action 1 all but certain."""

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return torch.tensor([[-20.0, 20.0]]).expand(len(states), 2)


async def test_collector_samples_from_logits_when_told(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, policy=Logits, logits=True)
    batch = await collector.call(Collector.collect)
    assert bool((batch.actions == 1).all())
    assert bool((batch.log_probs > -1e-6).all()), "log-probabilities of a softmax, not of the logits themselves"


def cartpole_vector(mode: str) -> Any:
    import gymnasium  # noqa: PLC0415 - only this test needs it

    autoreset = getattr(gymnasium.vector.AutoresetMode, mode)
    return gymnasium.make_vec(
        "CartPole-v1", num_envs=3, vectorization_mode="sync", vector_kwargs={"autoreset_mode": autoreset}
    )


def cartpole() -> Any:
    import gymnasium  # noqa: PLC0415

    return gymnasium.make("CartPole-v1")


def cartpole_policy() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2), nn.Softmax(dim=-1))


@pytest.mark.parametrize("mode", ["SAME_STEP", "DISABLED"])
async def test_collector_plays_a_gymnasium_vector_env_as_it_plays_separate_ones(world: LocalWorld, mode: str) -> None:
    pytest.importorskip("gymnasium")
    options = {"frames_per_batch": 150, "seed": 4}
    vector = await world[0].spawn(Collector, args=(lambda: cartpole_vector(mode), cartpole_policy), kwargs=options)
    separate = await world[0].spawn(Collector, args=([cartpole] * 3, cartpole_policy), kwargs=options)
    left, right = [await collector.call(Collector.collect) for collector in (vector, separate)]
    assert left.episode_returns, "episodes ended and their environments were reset"
    for field in ("observations", "actions", "rewards", "terminated", "truncated", "next_observations"):
        assert torch.equal(getattr(left, field), getattr(right, field)), field
    assert left.episode_returns == right.episode_returns
    assert left.episode_lengths == right.episode_lengths


async def test_collector_fills_a_replay_buffer_with_flat_transitions(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1)
    buffer = await world[0].spawn(ReplayBuffer, args=(100,), on=2)
    assert await collector.call(Collector.fill, buffer, 3) == 24
    assert await buffer.call(ReplayBuffer.size) == 24
    sample = await buffer.call(ReplayBuffer.sample, 5)
    assert sample.data["observations"].shape == (5, 2)
    assert sample.data["next_observations"].shape == (5, 2)
    with pytest.raises(ValueError, match="count must be an int >= 1 or None"):
        await collector.call(Collector.fill, buffer, 0)


async def test_collector_fills_the_shards_of_a_sharded_replay_buffer(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1)
    shards = [await world[0].spawn(ReplayBuffer, args=(100,), on=rank) for rank in (0, 2)]
    assert await collector.call(Collector.fill, shards, 4) == 32
    sizes = [await shard.call(ReplayBuffer.size) for shard in shards]
    assert sum(sizes) == 32
    assert min(sizes) > 0, "the batches were spread over the shards"


async def test_collector_pulls_newer_weights_from_a_parameter_server(world: LocalWorld) -> None:
    server = await world[0].spawn(ParameterServer, args=(always_right,), kwargs={"optimizer_kwargs": {"lr": 1.0}}, on=2)
    [collector] = await spawn(world, 1, num_envs=1, policy=always_right)
    assert (await collector.call(Collector.collect, server=server)).version == 0
    await server.call(ParameterServer.push, {"weight": torch.tensor([-50.0])})  # one step: weight 50
    batch = await collector.call(Collector.collect, server=server)
    assert batch.version == 1
    assert batch.actions.sum() == 8


async def test_collection_reads_every_collector_and_publishes_to_all(world: LocalWorld) -> None:
    refs = await spawn(world, 3, policy=always_right)
    learner = AlwaysRight()
    # A collector whose batches are always ready first must not starve the others.
    async with asyncio.timeout(10), Collection(refs, window=2) as collection:
        seen: set[str] = set()
        async for batch in collection:
            seen.add(batch.collector)
            if len(seen) == 3:
                break
        with torch.no_grad():
            learner.weight.fill_(50.0)
        assert await collection.publish(learner) == 1
        assert collection.version == 1
        async for batch in collection:
            if batch.version == 1:
                assert batch.actions.sum() == 8
                break
        statistics = collection.statistics()
    assert seen == {"rl/collectors/0", "rl/collectors/1", "rl/collectors/2"}
    assert statistics["published"] == 1
    assert statistics["batches"] >= 4
    assert statistics["frames"] == 8 * statistics["batches"]


@pytest.mark.parametrize("on_lag", ["drop", "wait"])
async def test_collection_never_hands_out_a_batch_older_than_max_lag(world: LocalWorld, on_lag: Any) -> None:
    refs = await spawn(world, 2, policy=always_right)
    learner = AlwaysRight()
    lags = []
    async with Collection(refs, max_lag=0, on_lag=on_lag, window=2) as collection:
        taken = 0
        async for batch in collection:
            lags.append(collection.version - batch.version)
            taken += 1
            await collection.publish(learner)  # every batch taken moves the learner on
            if taken == 6:
                break
        statistics = collection.statistics()
    assert lags == [0] * 6
    set_aside = statistics["dropped"] + statistics["asked_again"]
    assert set_aside > 0, "two collectors and a publish per batch: some batches fell behind"
    assert statistics["dropped" if on_lag == "wait" else "asked_again"] == 0


async def test_collection_asks_collectors_in_wait_mode_for_fresh_enough_weights(world: LocalWorld) -> None:
    [collector] = await spawn(world, 1, policy=always_right)
    async with Collection([collector], max_lag=1, on_lag="wait", version=5) as collection:
        waiting = collection.__anext__()  # asks for weights of version 4 at least: none came yet
        learner = AlwaysRight()
        with torch.no_grad():
            learner.weight.fill_(50.0)
        task: asyncio.Task[Batch] = asyncio.ensure_future(waiting)
        await asyncio.sleep(0.05)
        assert not task.done(), "the collector waits for weights it may act with"
        await collection.publish(learner, 4)
        batch = await task
    assert batch.version == 4
    assert batch.actions.sum() == 8


async def test_collection_leaves_out_a_failing_collector_and_goes_on(world: LocalWorld) -> None:
    good = await spawn(world, 1, env=corridor)
    broken = await world[0].spawn(
        Collector, args=(broken_corridor, policy), kwargs={"frames_per_batch": 8}, name="rl/collectors/broken", on=2
    )
    async with Collection([*good, broken]) as collection:
        with pytest.raises(actorch.RemoteError, match="collapsed") as caught:
            async for _ in collection:
                pass
        assert any("rl/collectors/broken" in note for note in getattr(caught.value, "__notes__", []))
        batch = await collection.__anext__()
        assert batch.collector == "rl/collectors/0"
        assert collection.statistics()["collectors"] == 1
        assert collection.statistics()["failed"] == 1


async def test_collection_ends_when_every_stream_has_ended(world: LocalWorld) -> None:
    refs = await spawn(world, 2)
    collection = Collection(refs)
    for source, count in zip(collection._sources, (2, 3), strict=True):
        source.stream = source.ref.stream(Collector.batches, count)  # streams of two and three batches
    assert len([batch async for batch in collection]) == 5
    await collection.aclose()


async def test_collection_leaves_its_collectors_idle_on_exit_or_stops_them_when_told(world: LocalWorld) -> None:
    kept, stopped = await spawn(world, 2)
    async with Collection([kept]) as collection:
        await collection.__anext__()
    assert (await kept.call(Collector.statistics))["batches"] >= 1, "the collector is still there, idle"
    async with Collection([kept, stopped], stop_collectors=True) as collection:
        await collection.__anext__()
        await stopped.stop()  # one already gone is passed over
    with pytest.raises(actorch.ActorStoppedError):
        await kept.call(Collector.statistics)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_lag": -1}, "max_lag must be an int >= 0 or None"),
        ({"on_lag": "skip"}, "on_lag must be 'drop' or 'wait'"),
        ({"on_lag": "wait"}, "on_lag='wait' needs a max_lag"),
        ({"window": 0}, "window must be an int >= 1"),
    ],
)
async def test_collection_refuses_bad_options(world: LocalWorld, kwargs: dict[str, Any], message: str) -> None:
    refs = await spawn(world, 1)
    with pytest.raises(ValueError, match=message):
        Collection(refs, **kwargs)
    with pytest.raises(ValueError, match="at least one collector"):
        Collection([])


async def test_collection_iterated_before_any_publish_warns_once(world: LocalWorld) -> None:
    collector = await world[0].spawn(
        Collector, args=(corridor, always_right), kwargs={"num_envs": 1, "frames_per_batch": 4}, on=1
    )
    with structlog.testing.capture_logs() as logs:
        async with Collection([collector]) as collection:
            taken = 0
            async for batch in collection:
                assert batch.version == 0
                taken += 1
                if taken == 3:
                    break
            await collection.publish(AlwaysRight())
            await anext(collection)
    said = [entry for entry in logs if entry["event"].startswith("batches handed out before any publish")]
    assert len(said) == 1
    assert said[0]["log_level"] == "warning"
