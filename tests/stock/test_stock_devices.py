"""The stock actors on a device: state where ``self.device`` says, tensors delivered where the caller asks.

Each end-to-end test runs on the CPU (spawned with ``device="cpu"``, as a GPU
actor would be with ``device="cuda"``) and again on a GPU where there is one
(marked ``cuda``). Without a GPU, ``meta`` tensors stand for tensors off the
CPU: asking for them shows that a ``device=`` argument is honoured, and
:meth:`Agent.transfer`, counted by a subclass, shows one copy per batch each
way, however many observers asked.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from _mp import SCRIPTS
from torch import nn

from actorch import Agent, Observer
from actorch._stock.transfer import as_device, to_device
from actorch.params import ParameterClient, Parameters, ParameterServer
from actorch.replay import PrioritizedReplayBuffer, ReplayBuffer, Sample, ShardedReplayBuffer
from actorch.testing import LocalWorld

sys.path.insert(0, str(SCRIPTS))
from corridor import corridor

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
"""Where the actors under test live: the CPU here, the first GPU where there is one."""


def where(device: str) -> str:
    """How a tensor's ``.device`` prints for a device named as ``spawn(device=...)`` takes it."""
    return str(as_device(device))


def devices_of(*tensors: torch.Tensor) -> set[str]:
    return {str(tensor.device) for tensor in tensors}


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def small_policy() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=-1))


def batch_of(values: range) -> dict[str, torch.Tensor]:
    """Transitions whose fields encode their value, to check where each one went."""
    value = torch.tensor(list(values), dtype=torch.float32)
    return {"obs": value[:, None].repeat(1, 2), "action": value.to(torch.int64)}


# --------------------------------------------------------------------------- the transfer helper


def test_to_device_moves_only_what_is_elsewhere() -> None:
    here, there = torch.ones(2), torch.empty(3, device="meta")
    moved = to_device({"here": here, "there": there}, torch.device("meta"))
    assert moved["there"] is there
    assert moved["here"].device.type == "meta"
    assert moved["here"].shape == (2,)
    assert to_device({"here": here}, torch.device("cpu"))["here"] is here


@pytest.mark.parametrize(("value", "expected"), [("cpu", "cpu"), ("cuda", "cuda:0"), (torch.device("meta"), "meta")])
def test_as_device_names_cuda_with_its_index(value: Any, expected: str) -> None:
    assert str(as_device(value)) == expected


@pytest.mark.parametrize("value", ["gpu0", 3, None])
def test_as_device_refuses_what_names_no_device(value: Any) -> None:
    with pytest.raises(ValueError, match="must be a device"):
        as_device(value)


# --------------------------------------------------------------------------- ParameterServer, ParameterClient


class PlacedParameterServer(ParameterServer):
    """Says where its parameters, their gradients and its optimizer's state are."""

    async def placement(self) -> dict[str, set[str]]:
        state = [value for slots in self._optimizer.state.values() for value in slots.values()]
        # Adam's moments sit beside their parameters; its step counts are CPU scalars wherever they are.
        moments = [value for value in state if isinstance(value, torch.Tensor) and value.dim() > 0]
        assert moments, "a step was taken: the optimizer has state"
        return {"parameters": devices_of(*self._params.values()), "optimizer": devices_of(*moments)}


async def spawn_server(world: LocalWorld, device: str, on: int = 1, **options: Any) -> Any:
    options.setdefault("optimizer", "torch.optim.Adam")
    options.setdefault("optimizer_kwargs", {"lr": 0.1})
    return await world[0].spawn(PlacedParameterServer, args=(tiny_model,), kwargs=options, on=on, device=device)


@pytest.mark.parametrize("device", DEVICES)
async def test_parameter_server_keeps_model_and_optimizer_state_on_its_device(world: LocalWorld, device: str) -> None:
    server = await spawn_server(world, device)
    pulled = await server.call(ParameterServer.pull, device="cpu")
    assert pulled is not None
    grads = {name: torch.ones_like(tensor) for name, tensor in pulled.tensors.items()}
    await server.call(ParameterServer.push, grads)
    assert await server.call(PlacedParameterServer.placement) == {
        "parameters": {where(device)},
        "optimizer": {where(device)},
    }
    assert (await server.call(ParameterServer.statistics))["device"] == where(device)


@pytest.mark.parametrize("device", DEVICES)
async def test_parameter_server_serves_cpu_trainers_from_its_device(world: LocalWorld, device: str) -> None:
    server = await spawn_server(world, device, optimizer="torch.optim.SGD")
    client = ParameterClient(server, device="cpu")
    pulled = await client.pull()
    assert pulled is not None
    expected = dict(tiny_model().named_parameters())
    for name, tensor in pulled.items():
        assert tensor.device.type == "cpu"
        assert torch.equal(tensor, expected[name])
    after = await client.push({name: torch.ones_like(tensor) for name, tensor in pulled.items()})
    assert client.versions == [1]
    for name, tensor in after.items():
        assert tensor.device.type == "cpu"
        torch.testing.assert_close(tensor, expected[name].detach() - 0.1)
    direct = await server.call(ParameterServer.pull)  # in one process, tensors arrive where they left
    assert direct is not None
    assert devices_of(*direct.tensors.values()) == {where(device)}


@pytest.mark.parametrize("on", [0, 1], ids=["same node", "other node"])
async def test_parameter_server_pull_and_push_deliver_on_the_device_asked(world: LocalWorld, on: int) -> None:
    server = await spawn_server(world, "cpu", on=on, optimizer="torch.optim.SGD")
    pulled = await server.call(ParameterServer.pull, device="meta")
    assert pulled is not None
    assert devices_of(*pulled.tensors.values()) == {"meta"}
    again = await server.call(ParameterServer.pull, device="meta")
    assert again is not None
    assert again.tensors["0.weight"] is pulled.tensors["0.weight"], "one copy per version and device"
    plain = await server.call(ParameterServer.pull)
    assert plain is not None
    assert devices_of(*plain.tensors.values()) == {"cpu"}
    grads = {name: torch.ones_like(tensor) for name, tensor in plain.tensors.items()}
    after = await server.call(ParameterServer.push, grads, device="meta")
    assert after.version == 1
    assert devices_of(*after.tensors.values()) == {"meta"}
    with pytest.raises(ValueError, match="must be a device"):
        await server.call(ParameterServer.pull, device="gpu0")


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_parameter_server_push_takes_gradients_of_any_floating_dtype(world: LocalWorld, mode: str) -> None:
    server = await spawn_server(
        world, "cpu", optimizer="torch.optim.SGD", mode=mode, trainers=2 if mode == "sync" else None
    )
    before = await server.call(ParameterServer.pull)
    assert before is not None
    halves = {name: torch.full_like(tensor, 1.0, dtype=torch.float16) for name, tensor in before.tensors.items()}
    doubles = {name: torch.full_like(tensor, 3.0, dtype=torch.float64) for name, tensor in before.tensors.items()}
    if mode == "sync":
        first = server.call(ParameterServer.push, halves)
        after = await server.call(ParameterServer.push, doubles)
        assert (await first).version == 1
        step = 0.1 * 2.0  # the mean of 1 and 3
    else:
        after = await server.call(ParameterServer.push, doubles)
        step = 0.1 * 3.0
    for name, tensor in after.tensors.items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor, before.tensors[name] - step)


async def test_sync_round_answers_each_pusher_on_the_device_it_asked(world: LocalWorld) -> None:
    server = await spawn_server(world, "cpu", optimizer="torch.optim.SGD", mode="sync", trainers=2)
    before = await server.call(ParameterServer.pull)
    assert before is not None
    grads = {name: torch.ones_like(tensor) for name, tensor in before.tensors.items()}
    on_meta = server.call(ParameterServer.push, grads, device="meta")
    on_cpu = await server.call(ParameterServer.push, grads)
    assert devices_of(*(await on_meta).tensors.values()) == {"meta"}
    assert devices_of(*on_cpu.tensors.values()) == {"cpu"}


async def test_parameter_client_moves_every_shard_to_its_device(world: LocalWorld) -> None:
    shards = [
        await world[0].spawn(ParameterServer, args=(tiny_model,), kwargs={"shard": (i, 2)}, on=i + 1) for i in range(2)
    ]
    client = ParameterClient(shards, device="meta")
    assert "device=meta" in repr(client)
    pulled = await client.pull()
    assert pulled is not None
    assert set(pulled) == set(dict(tiny_model().named_parameters()))
    assert devices_of(*pulled.values()) == {"meta"}
    after = await client.push({name: torch.ones(tensor.shape) for name, tensor in pulled.items()})
    assert devices_of(*after.values(), *client.parameters.values()) == {"meta"}
    with pytest.raises(ValueError, match="must be a device"):
        ParameterClient(shards, device="gpu0")


def test_parameters_to_returns_itself_when_already_there() -> None:
    params = Parameters(3, {"w": torch.ones(2)})
    assert params.to("cpu") is params
    moved = params.to("meta")
    assert moved.version == 3
    assert moved.tensors["w"].device.type == "meta"
    assert params.tensors["w"].device.type == "cpu"


# --------------------------------------------------------------------------- replay buffers


class PlacedReplayBuffer(ReplayBuffer):
    """Says where its storage and its random generator are."""

    async def placement(self) -> set[str]:
        return devices_of(*self._storage.values()) | {str(self._generator.device)}


class PlacedPrioritizedReplayBuffer(PrioritizedReplayBuffer):
    """Says where its storage, its sum tree and its random generator are."""

    async def placement(self) -> set[str]:
        return devices_of(*self._storage.values(), self._tree) | {str(self._generator.device)}


@pytest.mark.parametrize("device", DEVICES)
async def test_replay_buffer_stores_and_samples_on_its_device(world: LocalWorld, device: str) -> None:
    buffer = await world[0].spawn(PlacedReplayBuffer, args=(16,), kwargs={"seed": 0}, on=1, device=device)
    await buffer.call(ReplayBuffer.extend, batch_of(range(10)))
    await buffer.call(ReplayBuffer.add, {key: value[0] for key, value in batch_of(range(10, 11)).items()})
    assert await buffer.call(PlacedReplayBuffer.placement) == {where(device)}
    sample = await buffer.call(ReplayBuffer.sample, 64)
    assert devices_of(sample.indices, *sample.data.values()) == {where(device)}
    on_cpu = await buffer.call(ReplayBuffer.sample, 64, device="cpu")
    assert devices_of(on_cpu.indices, *on_cpu.data.values()) == {"cpu"}
    assert torch.equal(on_cpu.data["action"], on_cpu.indices)  # slot i holds transition i
    assert torch.equal(on_cpu.data["obs"][:, 0].to(torch.int64), on_cpu.indices)
    assert (await buffer.call(ReplayBuffer.statistics))["device"] == where(device)


@pytest.mark.parametrize("device", DEVICES)
async def test_replay_buffer_seeded_sampling_repeats_on_its_device(world: LocalWorld, device: str) -> None:
    drawn = []
    for _ in range(2):
        buffer = await world[0].spawn(ReplayBuffer, args=(16,), kwargs={"seed": 5}, on=1, device=device)
        await buffer.call(ReplayBuffer.extend, batch_of(range(16)))
        drawn.append((await buffer.call(ReplayBuffer.sample, 32, device="cpu")).indices)
    assert torch.equal(drawn[0], drawn[1])


@pytest.mark.parametrize("device", DEVICES)
async def test_prioritized_buffer_keeps_its_tree_on_its_device(world: LocalWorld, device: str) -> None:
    buffer = await world[0].spawn(
        PlacedPrioritizedReplayBuffer, args=(8,), kwargs={"seed": 0, "alpha": 1.0, "epsilon": 0.0}, on=1, device=device
    )
    await buffer.call(ReplayBuffer.extend, batch_of(range(4)))
    # From the CPU, of other dtypes: all the mass on slot 2.
    indices, priorities = torch.arange(4, dtype=torch.int32), torch.tensor([0.0, 0.0, 5.0, 0.0], dtype=torch.float16)
    await buffer.call(PrioritizedReplayBuffer.update_priorities, indices, priorities)
    assert await buffer.call(PlacedPrioritizedReplayBuffer.placement) == {where(device)}
    sample = await buffer.call(PrioritizedReplayBuffer.sample, 16)
    assert sample.weights is not None
    assert sample.probabilities is not None
    assert devices_of(sample.indices, sample.weights, sample.probabilities) == {where(device)}
    on_cpu = await buffer.call(PrioritizedReplayBuffer.sample, 16, 1.0, device="cpu")
    assert on_cpu.indices.tolist() == [2] * 16
    assert on_cpu.probabilities is not None
    assert on_cpu.probabilities.device.type == "cpu"


async def test_replay_buffers_sample_on_the_device_asked(world: LocalWorld) -> None:
    for cls in (ReplayBuffer, PrioritizedReplayBuffer):
        buffer = await world[0].spawn(cls, args=(8,), kwargs={"seed": 0}, on=1, device="cpu")
        await buffer.call(ReplayBuffer.extend, batch_of(range(4)))
        sample = await buffer.call(cls.sample, 5, device="meta")
        tensors = [sample.indices, *sample.data.values()]
        if cls is PrioritizedReplayBuffer:
            assert sample.weights is not None
            assert sample.probabilities is not None
            tensors += [sample.weights, sample.probabilities]
        assert devices_of(*tensors) == {"meta"}
        assert sample.data["obs"].shape == (5, 2)
        with pytest.raises(ValueError, match="must be a device"):
            await buffer.call(cls.sample, 5, device="gpu0")


def test_sample_to_returns_itself_when_already_there() -> None:
    sample = Sample({"x": torch.ones(2, 3)}, torch.tensor([0, 1]), None, None, 2, 2.0)
    assert sample.to("cpu") is sample
    moved = sample.to("meta")
    assert devices_of(moved.indices, moved.data["x"]) == {"meta"}
    assert (moved.weights, moved.probabilities, moved.size, moved.mass) == (None, None, 2, 2.0)


@pytest.mark.parametrize("device", DEVICES)
async def test_sharded_buffer_over_shards_on_a_device_merges_on_the_one_asked(world: LocalWorld, device: str) -> None:
    shards = [
        await world[0].spawn(PrioritizedReplayBuffer, args=(8,), kwargs={"seed": rank}, on=rank, device=placed)
        for rank, placed in ((1, device), (2, "cpu"))
    ]
    client = ShardedReplayBuffer(shards, seed=0)
    await client.extend(batch_of(range(8)))
    mixed = await client.sample(32)  # one shard's sample on the device, one on the CPU: merged on the CPU
    assert mixed.weights is not None
    assert devices_of(mixed.indices, mixed.weights, *mixed.data.values()) == {"cpu"}
    asked = await ShardedReplayBuffer(shards, seed=0, device=device).sample(32)
    assert asked.weights is not None
    assert devices_of(asked.indices, asked.weights, *asked.data.values()) == {where(device)}
    await client.update_priorities(mixed.indices, torch.ones(32))


async def test_sharded_buffer_merges_on_the_device_asked(world: LocalWorld) -> None:
    shards = [await world[0].spawn(ReplayBuffer, args=(8,), kwargs={"seed": rank}, on=rank) for rank in (1, 2)]
    client = ShardedReplayBuffer(shards, seed=0, device="meta")
    await client.extend(batch_of(range(6)))
    sample = await client.sample(10)
    assert devices_of(sample.indices, *sample.data.values()) == {"meta"}
    assert sample.data["obs"].shape == (10, 2)


# --------------------------------------------------------------------------- Agent


class TransferCountingAgent(Agent):
    """Records every copy between the host and the policy's device, and where ``act`` got its states."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.transfers: list[tuple[list[int], str]] = []
        self.acted_on: set[str] = set()

    def transfer(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        self.transfers.append((list(tensor.shape), str(device)))
        return super().transfer(tensor, device)

    def act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.acted_on.add(str(states.device))
        return super().act(states)

    async def seen(self) -> dict[str, Any]:
        return {
            "transfers": self.transfers,
            "acted_on": self.acted_on,
            "policy": devices_of(*self.policy.parameters()),
            "generator": str(self.generator.device),
        }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [True, False], ids=["batched", "plain"])
async def test_agent_moves_each_batch_to_its_device_once(world: LocalWorld, device: str, batch: bool) -> None:
    for index in range(3):
        await world[0].spawn(Observer, args=(corridor,), kwargs={"seed": index}, name=f"rl/observers/{index}", on=index)
    agent = await world[0].spawn(
        TransferCountingAgent, args=(small_policy,), kwargs={"batch": batch, "seed": 0}, device=device
    )
    stats = await agent.call(Agent.run_episode)
    assert stats.steps == 3 * 8
    seen = await agent.call(TransferCountingAgent.seen)
    assert seen["acted_on"] == seen["policy"] == {where(device)}
    assert seen["generator"] == where(device)
    states = 3 if batch else 1
    one_batch = [([states, 2], where(device)), ([states], "cpu")]  # its states in, its actions out
    returns = ([24], where(device))  # once per episode, for learn
    assert seen["transfers"] == [*one_batch * (24 // states), returns], "one copy each way per batch of states"
    assert (await agent.call(Agent.statistics))["device"] == where(device)
