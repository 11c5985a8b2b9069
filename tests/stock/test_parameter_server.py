"""ParameterServer and ParameterClient in an in-process world: modes, versions, shards."""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import pytest
import structlog
import torch
from torch import nn

import actorch
from actorch._actors.relocation.snapshots import SnapshotStore
from actorch._base.codec import Codec
from actorch.params import ParameterClient, Parameters, ParameterServer, assign_shards
from actorch.testing import LocalWorld, local_world


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def wide_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(8, 8) for _ in range(4)))


def not_a_model() -> int:
    return 3


def ones_like(params: dict[str, torch.Tensor], value: float = 1.0) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(p, value) for name, p in params.items()}


async def spawn(world: LocalWorld, on: int = 1, **options: Any) -> actorch.ActorRef[ParameterServer]:
    options.setdefault("optimizer_kwargs", {"lr": 0.1})
    return await world[0].spawn(ParameterServer, args=(tiny_model,), kwargs=options, on=on)


async def test_parameter_server_pull_returns_the_model_parameters(world: LocalWorld, on: int) -> None:
    server = await spawn(world, on)
    pulled = await server.call(ParameterServer.pull)
    assert isinstance(pulled, Parameters)
    assert pulled.version == 0
    expected = dict(tiny_model().named_parameters())
    assert pulled.tensors.keys() == expected.keys()
    for name, tensor in pulled.tensors.items():
        assert torch.equal(tensor, expected[name])


async def test_parameter_server_pull_since_the_current_version_returns_none(world: LocalWorld) -> None:
    server = await spawn(world)
    first = await server.call(ParameterServer.pull)
    assert first is not None
    assert await server.call(ParameterServer.pull, first.version) is None
    await server.call(ParameterServer.push, ones_like(first.tensors))
    newer = await server.call(ParameterServer.pull, since=first.version)
    assert newer is not None
    assert newer.version == 1
    stats = await server.call(ParameterServer.statistics)
    assert stats["pulls"] == 3
    assert stats["pulls_unchanged"] == 1


async def test_parameter_server_async_push_applies_at_once(world: LocalWorld, on: int) -> None:
    server = await spawn(world, on)
    before = await server.call(ParameterServer.pull)
    assert before is not None
    after = await server.call(ParameterServer.push, ones_like(before.tensors))
    assert after.version == 1
    for name, tensor in after.tensors.items():
        torch.testing.assert_close(tensor, before.tensors[name] - 0.1)
    assert await server.call(ParameterServer.version) == 1


async def test_parameter_server_pulled_tensors_do_not_change_with_later_steps(world: LocalWorld) -> None:
    server = await spawn(world, on=0)  # same node: replies are not copied on the way
    before = await server.call(ParameterServer.pull)
    assert before is not None
    kept = {name: tensor.clone() for name, tensor in before.tensors.items()}
    await server.call(ParameterServer.push, ones_like(before.tensors))
    for name, tensor in before.tensors.items():
        assert torch.equal(tensor, kept[name])


async def test_parameter_server_push_with_missing_names_leaves_those_parameters(world: LocalWorld) -> None:
    server = await spawn(world)
    before = await server.call(ParameterServer.pull)
    assert before is not None
    after = await server.call(ParameterServer.push, {"0.bias": torch.ones(4)})
    assert torch.equal(after.tensors["0.weight"], before.tensors["0.weight"])
    torch.testing.assert_close(after.tensors["0.bias"], before.tensors["0.bias"] - 0.1)


async def test_parameter_server_sync_mode_steps_once_per_round_in_any_arrival_order(world: LocalWorld) -> None:
    server = await spawn(world, mode="sync", trainers=3)
    before = await server.call(ParameterServer.pull)
    assert before is not None
    values = [1.0, 2.0, 6.0]
    random.Random(7).shuffle(values)

    async def trainer(value: float, delay: float) -> Parameters:
        await asyncio.sleep(delay)
        return await server.call(ParameterServer.push, ones_like(before.tensors, value))

    results = await asyncio.gather(*(trainer(v, d) for v, d in zip(values, [0.02, 0.0, 0.01], strict=True)))
    assert [r.version for r in results] == [1, 1, 1]
    assert results[0] is results[1] is results[2] or all(
        torch.equal(r.tensors["0.weight"], results[0].tensors["0.weight"]) for r in results
    )
    for name, tensor in results[0].tensors.items():
        torch.testing.assert_close(tensor, before.tensors[name] - 0.1 * 3.0)  # mean of 1, 2, 6 is 3
    stats = await server.call(ParameterServer.statistics)
    assert stats["steps"] == 1
    assert stats["waiting"] == 0


async def test_parameter_server_sync_push_waits_for_the_other_trainers(world: LocalWorld) -> None:
    server = await spawn(world, mode="sync", trainers=2)
    before = await server.call(ParameterServer.pull)
    assert before is not None
    first = asyncio.ensure_future(server.call(ParameterServer.push, ones_like(before.tensors)))
    await asyncio.sleep(0.05)
    assert not first.done()
    assert (await server.call(ParameterServer.statistics))["waiting"] == 1
    assert await server.call(ParameterServer.version) == 0
    second = await server.call(ParameterServer.push, ones_like(before.tensors))
    assert (await first).version == second.version == 1


async def test_parameter_server_sync_round_survives_a_pusher_that_times_out(world: LocalWorld) -> None:
    server = await spawn(world, mode="sync", trainers=2)
    before = await server.call(ParameterServer.pull)
    assert before is not None
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await server.call(ParameterServer.push, ones_like(before.tensors))
    after = await server.call(ParameterServer.push, ones_like(before.tensors))
    assert after.version == 1


class FailingSGD(torch.optim.SGD):
    """An optimizer whose step fails, as one with a bad hyperparameter or a NaN check would."""

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        raise FloatingPointError("the step found a NaN")


async def test_parameter_server_sync_step_failure_reaches_every_pusher_of_the_round(world: LocalWorld) -> None:
    server = await spawn(world, mode="sync", trainers=2, optimizer=FailingSGD)
    before = await server.call(ParameterServer.pull)
    assert before is not None
    async with asyncio.timeout(5):  # the round's first pusher must not be left waiting
        outcomes = await asyncio.gather(
            *(server.call(ParameterServer.push, ones_like(before.tensors)) for _ in range(2)), return_exceptions=True
        )
    for outcome in outcomes:
        assert isinstance(outcome, FloatingPointError)
        assert "the step found a NaN" in str(outcome)
    assert await server.call(ParameterServer.version) == 0


async def test_parameter_server_refuses_unknown_names_and_wrong_shapes(world: LocalWorld) -> None:
    server = await spawn(world)
    with pytest.raises(KeyError, match="nope"):
        await server.call(ParameterServer.push, {"nope": torch.ones(1)})
    with pytest.raises(ValueError, match="shape"):
        await server.call(ParameterServer.push, {"0.bias": torch.ones(5)})
    with pytest.raises(ValueError, match="tensor"):
        await server.call(ParameterServer.load, {"0.bias": [1.0, 2.0]})
    assert await server.call(ParameterServer.version) == 0


async def test_parameter_server_load_overwrites_and_bumps_the_version(world: LocalWorld) -> None:
    server = await spawn(world)
    assert await server.call(ParameterServer.load, {"2.bias": torch.tensor([5.0, 6.0])}) == 1
    pulled = await server.call(ParameterServer.pull)
    assert pulled is not None
    assert pulled.tensors["2.bias"].tolist() == [5.0, 6.0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "hogwild"}, "mode"),
        ({"mode": "sync"}, "trainers"),
        ({"mode": "sync", "trainers": 0}, "trainers"),
        ({"trainers": 2}, "async mode"),
        ({"shard": (2, 2)}, "shard"),
        ({"optimizer": "torch.optim.NoSuchOptimizer"}, "optimizer"),
        ({"snapshot_every": 0}, "snapshot_every must be a positive int of pushes"),
    ],
)
async def test_parameter_server_refuses_bad_options_at_spawn(world: LocalWorld, options: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await spawn(world, **options)


async def test_parameter_server_refuses_a_factory_that_is_not_a_model(world: LocalWorld) -> None:
    with pytest.raises(ValueError, match=r"not a torch\.nn\.Module"):
        await world[0].spawn(ParameterServer, args=(not_a_model,), on=1)
    with pytest.raises(ValueError, match="cannot import"):
        await world[0].spawn(ParameterServer, args=("tests.nowhere:model",), on=1)


async def test_parameter_server_refuses_a_built_module_and_says_what_to_pass(world: LocalWorld, on: int) -> None:
    with pytest.raises(TypeError, match="takes a function that builds the model, not a built Linear module") as info:
        await world[0].spawn(ParameterServer, args=(nn.Linear(4, 4),), on=on)
    assert "functools.partial(ModuleClass, ...)" in str(info.value)
    assert "'package.module:make_model'" in str(info.value)


async def test_parameter_server_takes_import_paths_in_strict_mode() -> None:
    async with local_world(2, strict=True) as world:
        server = await world[0].spawn(
            ParameterServer,
            args=("tests.stock.test_parameter_server:tiny_model",),
            kwargs={"optimizer": "torch.optim.Adam", "optimizer_kwargs": {"lr": 0.01}},
            on=1,
        )
        pulled = await server.call(ParameterServer.pull)
        assert pulled is not None
        after = await server.call(ParameterServer.push, ones_like(pulled.tensors))
        assert after.version == 1


async def test_parameter_server_rrefs_need_torch_rpc(world: LocalWorld) -> None:
    server = await spawn(world)
    with pytest.raises(actorch.UnsupportedError, match="torch RPC"):
        await server.call(ParameterServer.parameter_rrefs)
    with pytest.raises(actorch.UnsupportedError):
        await server.call(ParameterServer.module_rref)


# ---------------------------------------------------------------------- snapshots


RELOCATE = actorch.Restart(relocate=True, backoff=0.0)


def reference_steps(grads: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The parameters after Adam steps on ``grads`` from tiny_model's start, as a server should hold them."""
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for grad in grads:
        for name, param in model.named_parameters():
            param.grad = grad[name].clone()
        optimizer.step()
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def grad_number(step: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(100 + step)
    return {name: torch.randn_like(p) for name, p in tiny_model().named_parameters()}


async def spawn_relocatable(world: LocalWorld, on: int = 1, **options: Any) -> actorch.ActorRef[ParameterServer]:
    kwargs = {"optimizer": "torch.optim.Adam", "optimizer_kwargs": {"lr": 0.1}, **options}
    return await world[0].spawn(
        ParameterServer, args=(tiny_model,), kwargs=kwargs, name="params", on=on, restart=RELOCATE
    )


async def test_parameter_server_resumes_parameters_optimizer_state_and_version_from_its_last_save() -> None:
    async with local_world(3) as world:
        server = await spawn_relocatable(world, snapshot_every=3)
        for step in range(7):
            await server.call(ParameterServer.push, grad_number(step))
        assert (await server.call(ParameterServer.statistics))["saved"] == 2, "saved after pushes 3 and 6"
        world.kill(1)
        assert await server.call(ParameterServer.version) == 6, "the 7th push came after the last save"
        pulled = await server.call(ParameterServer.pull)
        assert pulled is not None
        for name, tensor in reference_steps([grad_number(step) for step in range(6)]).items():
            torch.testing.assert_close(pulled.tensors[name], tensor)
        after = await server.call(ParameterServer.push, grad_number(6))  # Adam's moments came back too
        for name, tensor in reference_steps([grad_number(step) for step in range(7)]).items():
            torch.testing.assert_close(after.tensors[name], tensor)


async def test_parameter_server_saves_when_asked_and_a_job_started_again_resumes_it(tmp_path: Any) -> None:
    async with local_world(3, snapshots=str(tmp_path)) as world:
        server = await spawn_relocatable(world, mode="sync", trainers=2)
        await asyncio.gather(*(server.call(ParameterServer.push, grad_number(0)) for _ in range(2)))
        assert await server.call(ParameterServer.save) is True
        await asyncio.gather(*(server.call(ParameterServer.push, grad_number(1)) for _ in range(2)))
    async with local_world(3, snapshots=str(tmp_path)) as world:
        server = await spawn_relocatable(world, on=2, mode="sync", trainers=2)
        assert await server.call(ParameterServer.version) == 1
        plain = await spawn(world, on=1)
        assert await plain.call(ParameterServer.save) is False, "not relocatable: nothing is sent"


def tiny_parameters() -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in tiny_model().named_parameters()}


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ("weights", "is not a parameter server's snapshot"),
        ({"format": "actorch.params", "format_version": 9}, "format version 9"),
        ({"format": "actorch.params", "format_version": 1, "shard": [1, 2]}, "of shard [1, 2]"),
        ({"format": "actorch.params", "format_version": 1, "shard": [0, 1], "parameters": {}}, "holds parameters []"),
        (
            {
                "format": "actorch.params",
                "format_version": 1,
                "shard": [0, 1],
                "version": 3,
                "parameters": tiny_parameters(),
            },
            "does not fit this server: 'optimizer'",
        ),
        (
            {
                "format": "actorch.params",
                "format_version": 1,
                "shard": [0, 1],
                "version": 3,
                "parameters": {**tiny_parameters(), "0.weight": torch.zeros(2, 2)},
                "optimizer": {},
            },
            "'0.weight' must be a tensor of shape (4, 3)",
        ),
    ],
)
async def test_parameter_server_refuses_to_start_from_a_snapshot_that_is_not_its_own(
    state: Any, says: str, tmp_path: Any
) -> None:
    store = SnapshotStore(str(tmp_path), 2, Codec(), structlog.get_logger("actorch"))
    await store.save("params", state)  # what an older program, or another model, left under the name
    async with local_world(3, snapshots=str(tmp_path)) as world:
        with pytest.raises(actorch.SnapshotError, match=re.escape(says)):
            await spawn_relocatable(world)


def test_assign_shards_balances_sizes_deterministically() -> None:
    sizes = {"a": 100, "b": 60, "c": 50, "d": 10, "e": 10}
    shards = assign_shards(sizes, 2)
    assert shards == [["a", "d", "e"], ["b", "c"]]  # 120 and 110 elements
    assert sorted(name for shard in shards for name in shard) == sorted(sizes)
    assert assign_shards(sizes, 1) == [["a", "b", "c", "d", "e"]]


@pytest.mark.parametrize("count", [0, 6])
def test_assign_shards_refuses_impossible_counts(count: int) -> None:
    with pytest.raises(ValueError, match="shards"):
        assign_shards({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, count)


async def spawn_shards(world: LocalWorld, count: int, **options: Any) -> list[actorch.ActorRef[ParameterServer]]:
    return [
        await world[0].spawn(
            ParameterServer,
            args=(wide_model,),
            kwargs={"shard": (i, count), "optimizer_kwargs": {"lr": 0.5}, **options},
            name=f"ps/{i}",
            on=i % len(world),
        )
        for i in range(count)
    ]


async def test_parameter_client_reassembles_the_shards(world: LocalWorld) -> None:
    await spawn_shards(world, 3)
    client = ParameterClient(await world[0].lookup_all("ps/*"))
    pulled = await client.pull()
    assert pulled is not None
    expected = dict(wide_model().named_parameters())
    assert pulled.keys() == expected.keys()
    for name, tensor in pulled.items():
        assert torch.equal(tensor, expected[name])
    owned = [await ref.call(ParameterServer.names) for ref in client.servers]
    assert all(owned)
    assert sum(len(names) for names in owned) == len(expected)
    assert client.versions == [0, 0, 0]
    assert await client.pull() is None


async def test_parameter_client_push_reaches_every_shard_and_pull_fetches_only_changes(world: LocalWorld) -> None:
    shards = await spawn_shards(world, 2)
    client = ParameterClient(shards)
    before = await client.pull()
    assert before is not None
    after = await client.push(ones_like(before))
    for name, tensor in after.items():
        torch.testing.assert_close(tensor, before[name] - 0.5)
    assert client.versions == [1, 1]
    other = ParameterClient(shards)
    await other.pull()
    await shards[1].call(ParameterServer.load, {})  # bumps shard 1 only
    assert await other.pull() is not None
    assert other.versions == [1, 2]
    stats = await shards[0].call(ParameterServer.statistics)
    assert stats["pulls_unchanged"] == 1


async def test_parameter_client_sync_mode_over_shards(world: LocalWorld) -> None:
    shards = await spawn_shards(world, 2, mode="sync", trainers=2)
    trainers = [ParameterClient(shards), ParameterClient(shards)]
    start = await trainers[0].pull()
    assert start is not None
    results = await asyncio.gather(trainers[0].push(ones_like(start, 1.0)), trainers[1].push(ones_like(start, 3.0)))
    for name, tensor in results[0].items():
        torch.testing.assert_close(tensor, start[name] - 0.5 * 2.0)
        assert torch.equal(tensor, results[1][name])


async def test_parameter_client_refuses_unknown_names_before_sending(world: LocalWorld) -> None:
    shards = await spawn_shards(world, 2)
    client = ParameterClient(shards)
    with pytest.raises(KeyError, match="nope"):
        await client.push({"nope": torch.ones(1)})
    assert [await s.call(ParameterServer.version) for s in shards] == [0, 0]


async def test_parameter_client_names_the_failed_shard() -> None:
    async with local_world(3, stop_grace=0.5) as world:
        shards = await spawn_shards(world, 3)
        client = ParameterClient(shards)
        await client.pull()
        await shards[1].stop()
        with pytest.raises(actorch.GroupError, match="1 of 3 parameter shards failed") as caught:
            await client.pull()
        assert caught.value.failed == [1]
        assert isinstance(caught.value.exceptions[0], actorch.ActorStoppedError)
        assert caught.value.exceptions[0].__notes__ == [f"in shard 1 ({shards[1]!r}), one of the parameter shards"]


async def test_parameter_client_with_one_server_says_why_its_push_failed(world: LocalWorld) -> None:
    [server] = await spawn_shards(world, 1)
    client = ParameterClient([server])
    with pytest.raises(actorch.GroupError) as caught:
        await client.push({"0.weight": torch.ones(3, 3)})
    assert str(caught.value).startswith(
        "1 of 1 parameter shards failed: shard 0 (<ActorRef actor 'ps/0' (ParameterServer) on node 0>): "
        "ValueError: '0.weight' must be a tensor of shape (8, 8), got (3, 3)"
    )
    assert isinstance(caught.value.exceptions[0], ValueError)


async def test_parameter_client_names_each_failed_shard_and_its_reason(world: LocalWorld) -> None:
    shards = await spawn_shards(world, 3)
    client = ParameterClient(shards)
    names = [await shard.call(ParameterServer.names) for shard in shards]
    with pytest.raises(actorch.GroupError) as caught:
        await client.push({names[0][0]: torch.ones(2), names[2][0]: torch.ones(7)})
    assert str(caught.value) == (
        "2 of 3 parameter shards failed: "
        f"shard 0 ({shards[0]!r}): ValueError: {names[0][0]!r} must be a tensor of shape (8, 8), got (2,); "
        f"shard 2 ({shards[2]!r}): ValueError: {names[2][0]!r} must be a tensor of shape (8,), got (7,) "
        "(2 sub-exceptions)"
    )
    assert caught.value.failed == [0, 2]


def test_parameter_client_needs_a_server() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ParameterClient([])
