"""The stock actors' streams over in-process worlds: sample streams, parameter watches, episode streams."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from _mp import SCRIPTS
from torch import nn

import actorch
from actorch import Agent, Observer
from actorch.params import Parameters, ParameterServer
from actorch.replay import PrioritizedReplayBuffer, ReplayBuffer
from actorch.testing import LocalWorld

sys.path.insert(0, str(SCRIPTS))
from corridor import broken_corridor, corridor


def batch_of(values: range | list[int]) -> dict[str, torch.Tensor]:
    """Transitions whose fields encode their value."""
    value = torch.tensor(list(values), dtype=torch.float32)
    return {"obs": value[:, None].repeat(1, 2), "action": value.to(torch.int64)}


async def spawn_buffer(
    world: LocalWorld, on: int, capacity: int = 16, cls: type[ReplayBuffer] = ReplayBuffer
) -> actorch.ActorRef[Any]:
    return await world[0].spawn(cls, args=(capacity,), kwargs={"seed": 0}, on=on)


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait (within 5 s) until ``check()`` holds: for what the other end does after a stream closes."""
    with anyio.fail_after(5):
        while True:
            if await check():
                return
            await asyncio.sleep(0.01)


async def no_sample_streams(buffer: actorch.ActorRef[Any]) -> None:
    async def closed() -> bool:
        return await buffer.call(ReplayBuffer.streams) == 0

    await eventually(closed)


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


async def spawn_server(world: LocalWorld, on: int) -> actorch.ActorRef[ParameterServer]:
    return await world[0].spawn(ParameterServer, args=(tiny_model,), kwargs={"optimizer_kwargs": {"lr": 0.1}}, on=on)


async def push_ones(server: actorch.ActorRef[ParameterServer]) -> int:
    params = await server.call(ParameterServer.pull)
    assert params is not None
    grads = {name: torch.ones_like(tensor) for name, tensor in params.tensors.items()}
    return (await server.call(ParameterServer.push, grads)).version


# --------------------------------------------------------------------------- ReplayBuffer.sample_stream


async def test_sample_stream_waits_for_enough_transitions_then_streams(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, on)
    async with buffer.stream(ReplayBuffer.sample_stream, 4) as stream:
        first = asyncio.ensure_future(anext(stream))

        async def opened() -> bool:
            return await buffer.call(ReplayBuffer.streams) == 1

        await eventually(opened)
        await buffer.call(ReplayBuffer.extend, batch_of(range(3)))  # fewer than the batch size: it still waits
        assert (await buffer.call(ReplayBuffer.statistics))["samples"] == 0
        assert not first.done()
        await buffer.call(ReplayBuffer.extend, batch_of(range(3, 5)))
        sample = await first
        assert sample.data["obs"].shape == (4, 2)
        assert sample.size == 5
        assert set(sample.data["action"].tolist()) <= set(range(5))
        for _ in range(3):
            assert len((await anext(stream)).indices) == 4
    await no_sample_streams(buffer)


async def test_sample_stream_lets_adds_in_while_it_runs(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, on, capacity=64)
    await buffer.call(ReplayBuffer.extend, batch_of(range(2)))
    sizes = []
    with anyio.fail_after(10):  # a buffer that let nothing in beside the stream would hang here
        async with buffer.stream(ReplayBuffer.sample_stream, 2).with_window(1) as stream:
            async for sample in stream:
                sizes.append(sample.size)
                if len(sizes) == 10:
                    break
                await buffer.call(ReplayBuffer.add, {"obs": torch.zeros(2), "action": torch.tensor(100)})
    assert sizes == sorted(sizes)
    assert sizes[-1] > 2, "later samples were drawn from the grown buffer"
    assert await buffer.call(ReplayBuffer.size) == 11
    await no_sample_streams(buffer)


async def test_sample_stream_draws_as_sample_does_and_is_counted(world: LocalWorld) -> None:
    streamed, called = await spawn_buffer(world, 1), await spawn_buffer(world, 2)
    for buffer in (streamed, called):
        await buffer.call(ReplayBuffer.extend, batch_of(range(16)))
    async with streamed.stream(ReplayBuffer.sample_stream, 8).with_window(1) as stream:
        for _ in range(3):
            expected = await called.call(ReplayBuffer.sample, 8)
            assert torch.equal((await anext(stream)).indices, expected.indices)  # same seed, same draws
    statistics = await streamed.call(ReplayBuffer.statistics)
    assert statistics["samples"] >= 3
    assert statistics["sampled"] == 8 * statistics["samples"]


async def test_sample_stream_waits_through_a_clear_for_new_transitions(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, on)
    await buffer.call(ReplayBuffer.extend, batch_of(range(4)))
    async with buffer.stream(ReplayBuffer.sample_stream, 2).with_window(1) as stream:
        assert "obs" in (await anext(stream)).data
        await buffer.call(ReplayBuffer.clear)
        await buffer.call(ReplayBuffer.extend, {"reward": torch.arange(3, dtype=torch.float32)})  # a new layout
        keys = [set((await anext(stream)).data) for _ in range(2)]  # one sample may have been drawn before the clear
    assert keys[-1] == {"reward"}
    await no_sample_streams(buffer)


async def test_sample_stream_min_size_waits_for_a_warm_up(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, on)
    async with buffer.stream(ReplayBuffer.sample_stream, 2, min_size=6) as stream:
        first = asyncio.ensure_future(anext(stream))
        await buffer.call(ReplayBuffer.extend, batch_of(range(4)))
        assert (await buffer.call(ReplayBuffer.statistics))["samples"] == 0
        assert not first.done()
        await buffer.call(ReplayBuffer.extend, batch_of(range(4, 6)))
        assert (await first).size == 6


async def test_sample_stream_of_a_batch_larger_than_the_capacity_waits_only_for_a_full_buffer(
    world: LocalWorld,
) -> None:
    buffer = await spawn_buffer(world, 1, capacity=4)
    await buffer.call(ReplayBuffer.extend, batch_of(range(4)))
    async with buffer.stream(ReplayBuffer.sample_stream, 10) as stream:
        assert len((await anext(stream)).indices) == 10


async def test_sample_stream_break_closes_it_on_the_buffer(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, on)
    await buffer.call(ReplayBuffer.extend, batch_of(range(8)))
    taken = 0
    async for _ in buffer.stream(ReplayBuffer.sample_stream, 4):
        taken += 1
        if taken == 3:
            break
    await no_sample_streams(buffer)


async def test_sample_stream_cancelled_while_waiting_closes_it(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, on)
    stream = buffer.stream(ReplayBuffer.sample_stream, 4)
    waiting = asyncio.ensure_future(anext(stream))

    async def opened() -> bool:
        return await buffer.call(ReplayBuffer.streams) == 1

    await eventually(opened)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await no_sample_streams(buffer)
    await buffer.call(ReplayBuffer.extend, batch_of(range(8)))  # nothing is left waiting to draw
    assert (await buffer.call(ReplayBuffer.statistics))["samples"] == 0


async def test_sample_stream_puts_samples_on_the_device_asked(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world, 0)  # same node: items arrive as they were yielded
    await buffer.call(ReplayBuffer.extend, batch_of(range(8)))
    async with buffer.stream(ReplayBuffer.sample_stream, 4, device="meta") as stream:
        sample = await anext(stream)
    assert {tensor.device.type for tensor in (*sample.data.values(), sample.indices)} == {"meta"}


async def test_sample_stream_of_host_tensors_reaches_another_node(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world, 2)
    await buffer.call(ReplayBuffer.extend, batch_of(range(8)))
    async with buffer.stream(ReplayBuffer.sample_stream, 4, device="cpu") as stream:
        sample = await anext(stream)
    assert sample.data["obs"].device.type == "cpu"


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((0,), {}, ValueError, "batch_size must be positive"),
        ((-3,), {}, ValueError, "batch_size must be positive"),
        ((True,), {}, TypeError, "batch_size must be an int"),
        ((2.5,), {}, TypeError, "batch_size must be an int"),
        ((4,), {"min_size": 0}, ValueError, r"min_size must be within \[1, 16\]"),
        ((4,), {"min_size": 17}, ValueError, r"min_size must be within \[1, 16\]"),
        ((4,), {"min_size": "3"}, TypeError, "min_size must be an int"),
        ((4,), {"device": "nowhere"}, ValueError, "device"),
    ],
)
async def test_sample_stream_refuses_bad_arguments_at_its_first_item(
    world: LocalWorld, on: int, args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    buffer = await spawn_buffer(world, on)
    with pytest.raises(error, match=message):
        async for _ in buffer.stream(ReplayBuffer.sample_stream, *args, **kwargs):
            pass
    await no_sample_streams(buffer)


async def test_sample_stream_with_a_snapshot_written_meanwhile(world: LocalWorld, tmp_path: Path) -> None:
    buffer = await spawn_buffer(world, 1)
    await buffer.call(ReplayBuffer.extend, batch_of(range(6)))
    path = str(tmp_path / "buffer.tensors")
    async with buffer.stream(ReplayBuffer.sample_stream, 2) as stream:
        await anext(stream)
        written = asyncio.ensure_future(buffer.call(ReplayBuffer.snapshot, path))
        await buffer.call(ReplayBuffer.extend, batch_of(range(6, 8)))  # waits for the snapshot, or runs before it
        assert await written > 0
        await anext(stream)
    restored = await world[0].spawn(ReplayBuffer, args=(16,), kwargs={"restore": path}, on=2)
    assert await restored.call(ReplayBuffer.size) in (6, 8)


# --------------------------------------------------------------------------- PrioritizedReplayBuffer.sample_stream


async def test_prioritized_sample_stream_weights_its_samples(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, on, cls=PrioritizedReplayBuffer)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(8)))
    async with buffer.stream(PrioritizedReplayBuffer.sample_stream, 4, 1.0).with_window(1) as stream:
        sample = await anext(stream)
        assert sample.weights is not None
        assert sample.probabilities is not None
        await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.arange(8), torch.tensor([0.0] * 7 + [5.0]))
        later = [await anext(stream) for _ in range(2)]  # the first may have been drawn before the update
    assert set(later[-1].indices.tolist()) == {7}


async def test_prioritized_sample_stream_refuses_a_bad_beta(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world, 1, cls=PrioritizedReplayBuffer)
    with pytest.raises(ValueError, match=r"beta must be a number in \[0, 1\]"):
        async for _ in buffer.stream(PrioritizedReplayBuffer.sample_stream, 4, 1.5):
            pass


async def test_prioritized_sample_stream_ends_with_the_error_of_zero_mass(world: LocalWorld) -> None:
    buffer = await world[0].spawn(PrioritizedReplayBuffer, args=(4,), kwargs={"epsilon": 0.0}, on=1)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(4)))
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.arange(4), torch.zeros(4))
    with pytest.raises(ValueError, match="every priority is zero"):
        async for _ in buffer.stream(PrioritizedReplayBuffer.sample_stream, 2):
            pass
    await no_sample_streams(buffer)


# --------------------------------------------------------------------------- ParameterServer.watch


async def test_watch_yields_the_current_version_then_each_new_one(world: LocalWorld, on: int) -> None:
    server = await spawn_server(world, on)
    async with server.stream(ParameterServer.watch) as versions:
        first = await anext(versions)
        assert isinstance(first, Parameters)
        assert first.version == 0
        for expected in (1, 2, 3):
            pushed = await push_ones(server)
            params = await anext(versions)
            assert params.version == pushed == expected
        assert (await server.call(ParameterServer.statistics))["watchers"] == 1
    pulled = await server.call(ParameterServer.pull)
    assert pulled is not None
    for name, tensor in params.tensors.items():
        assert torch.equal(tensor, pulled.tensors[name])

    async def closed() -> bool:
        return bool((await server.call(ParameterServer.statistics))["watchers"] == 0)

    await eventually(closed)


async def test_watch_gives_a_slow_watcher_the_newest_version(world: LocalWorld, on: int) -> None:
    server = await spawn_server(world, on)
    async with server.stream(ParameterServer.watch, parameters=False).with_window(1) as versions:
        assert await anext(versions) == 0
        for _ in range(5):
            await push_ones(server)
        seen = [await anext(versions)]
        while seen[-1] != 5:
            seen.append(await anext(versions))
    assert len(seen) <= 2, f"at most one version waited for the watcher: {seen}"
    assert seen == sorted(set(seen))


async def test_watch_without_parameters_streams_version_numbers(world: LocalWorld, on: int) -> None:
    server = await spawn_server(world, on)
    async with server.stream(ParameterServer.watch, parameters=False) as versions:
        assert await anext(versions) == 0
        await push_ones(server)
        assert await anext(versions) == 1


async def test_watch_since_the_current_version_waits_for_the_next(world: LocalWorld, on: int) -> None:
    server = await spawn_server(world, on)
    await push_ones(server)
    async with server.stream(ParameterServer.watch, 1) as versions:
        following = asyncio.ensure_future(anext(versions))
        assert (await server.call(ParameterServer.statistics))["watched"] == 0
        assert not following.done()
        await push_ones(server)
        assert (await following).version == 2


async def test_watch_since_an_older_or_unknown_version_answers_at_once(world: LocalWorld) -> None:
    server = await spawn_server(world, 1)
    await push_ones(server)
    for since in (0, 99):
        async with server.stream(ParameterServer.watch, since, parameters=False) as versions:
            assert await anext(versions) == 1


async def test_watch_is_woken_by_load(world: LocalWorld, on: int) -> None:
    server = await spawn_server(world, on)
    async with server.stream(ParameterServer.watch, 0) as versions:
        following = asyncio.ensure_future(anext(versions))
        await server.call(ParameterServer.load, {"bias": torch.full((2,), 7.0)})
        params = await following
    assert params.version == 1
    assert params.tensors["bias"].tolist() == [7.0, 7.0]


async def test_watch_puts_parameters_on_the_device_asked(world: LocalWorld) -> None:
    server = await spawn_server(world, 0)
    async with server.stream(ParameterServer.watch, device="meta") as versions:
        params = await anext(versions)
    assert {tensor.device.type for tensor in params.tensors.values()} == {"meta"}


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((-1,), {}, ValueError, "since must be a version >= 0"),
        (("1",), {}, TypeError, "since must be a version"),
        ((True,), {}, TypeError, "since must be a version"),
        ((), {"parameters": "yes"}, TypeError, "parameters must be a bool"),
        ((), {"device": "nowhere"}, ValueError, "device"),
    ],
)
async def test_watch_refuses_bad_arguments_at_its_first_item(
    world: LocalWorld, on: int, args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    server = await spawn_server(world, on)
    with pytest.raises(error, match=message):
        async for _ in server.stream(ParameterServer.watch, *args, **kwargs):
            pass


# --------------------------------------------------------------------------- Observer.episodes, Agent.train_streaming


def small_policy() -> nn.Module:
    """Two observation features to two action probabilities."""
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=-1))


async def seat(world: LocalWorld, count: int) -> None:
    for index in range(count):
        await world[0].spawn(
            Observer, args=(corridor,), kwargs={"seed": index}, name=f"rl/observers/{index}", on=index % 3
        )


async def test_observer_episodes_streams_one_rollout_per_run(world: LocalWorld, on: int) -> None:
    observer = await world[0].spawn(Observer, args=(corridor,), kwargs={"seed": 7}, on=on)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "none/*"})
    rollouts = [rollout async for rollout in observer.stream(Observer.episodes, agent, batch=False, count=3)]
    assert len(rollouts) == 3
    for rollout in rollouts:
        assert rollout.rewards.shape == (8,)  # the corridor always lasts 8 steps
        assert rollout.dones.tolist() == [False] * 7 + [True]
        assert rollout.episode_rewards == [float(rollout.rewards.sum())]


async def test_observer_episodes_of_fixed_length_runs_go_on_until_the_consumer_leaves(world: LocalWorld) -> None:
    observer = await world[0].spawn(Observer, args=(corridor,), on=1)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "none/*"})
    lengths = []
    async for rollout in observer.stream(Observer.episodes, agent, 5, batch=False):
        lengths.append(len(rollout.rewards))
        if len(lengths) == 4:
            break
    assert lengths == [5, 5, 5, 5]
    assert (await observer.call(Observer.run, agent, 3, batch=False)).rewards.shape == (3,)  # free again


async def test_observer_episodes_end_with_the_environments_error(world: LocalWorld, on: int) -> None:
    observer = await world[0].spawn(Observer, args=(broken_corridor,), on=on)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "none/*"})
    with pytest.raises(RuntimeError, match="collapsed"):
        async for _ in observer.stream(Observer.episodes, agent, batch=False):
            pass


@pytest.mark.parametrize(("kwargs", "message"), [({"count": 0}, "count must be"), ({"count": True}, "count must be")])
async def test_observer_episodes_refuse_a_bad_count_or_steps(
    world: LocalWorld, kwargs: dict[str, Any], message: str
) -> None:
    observer = await world[0].spawn(Observer, args=(corridor,), on=1)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "none/*"})
    with pytest.raises(ValueError, match=message):
        async for _ in observer.stream(Observer.episodes, agent, batch=False, **kwargs):
            pass
    with pytest.raises(ValueError, match="steps must be >= 1"):
        async for _ in observer.stream(Observer.episodes, agent, 0, batch=False):
            pass


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "plain"])
async def test_agent_train_streaming_takes_a_step_per_round_of_every_observers_run(
    world: LocalWorld, batch: bool
) -> None:
    await seat(world, 3)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"batch": batch, "seed": 0})
    history = await agent.call(Agent.train_streaming, 4)
    assert [stats.episode for stats in history] == [1, 2, 3, 4]
    assert {(stats.observers, stats.steps) for stats in history} == {(3, 3 * 8)}
    fixed = await agent.call(Agent.train_streaming, 2, 20)
    assert [stats.steps for stats in fixed] == [3 * 20, 3 * 20]
    assert (await agent.call(Agent.run_episode)).episode == 7  # the observers are free again


async def test_agent_train_streaming_learns_to_walk_the_corridor(world: LocalWorld) -> None:
    await seat(world, 3)
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"seed": 1, "lr": 0.05})
    history = await agent.call(Agent.train_streaming, 40)
    assert history[-1].running_reward > history[0].reward + 2.0, (history[0], history[-1])
    statistics = await agent.call(Agent.statistics)
    assert (statistics["episodes"], statistics["actions"]) == (40, 40 * 3 * 8)


async def test_agent_train_streaming_names_a_failed_observer_and_goes_on(world: LocalWorld) -> None:
    await seat(world, 2)
    await world[0].spawn(Observer, args=(broken_corridor,), name="rl/observers/broken", on=1)
    agent = await world[0].spawn(Agent, args=(small_policy,))
    with pytest.raises(actorch.RemoteError, match="1 of 3 observers' episode streams failed: observer "):
        await agent.call(Agent.train_streaming, 2)
    await (await world[0].lookup("rl/observers/broken")).stop()
    assert [stats.observers for stats in await agent.call(Agent.train_streaming, 2)] == [2, 2]


async def test_agent_train_streaming_refuses_bad_rounds_and_no_observers(world: LocalWorld) -> None:
    agent = await world[0].spawn(Agent, args=(small_policy,), kwargs={"observers": "nobody/*"})
    with pytest.raises(ValueError, match="rounds must be an int >= 1"):
        await agent.call(Agent.train_streaming, 0)
    with pytest.raises(actorch.ActorNotFoundError, match="no observers match 'nobody/\\*'"):
        await agent.call(Agent.train_streaming, 1)
