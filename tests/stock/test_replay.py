"""The stock replay buffers over in-process worlds: ring storage, prioritized sampling, snapshots, shards.

Every random draw is seeded (the buffers' and the sharded client's own
generators), so the statistical checks are deterministic and cannot flake.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import actorch
from actorch._base.tensorfile import save_tensors
from actorch.replay import PrioritizedReplayBuffer, ReplayBuffer, Sample, ShardedReplayBuffer
from actorch.testing import LocalWorld, local_world

SHARD_SHIFT = ShardedReplayBuffer.SHARD_SHIFT


class NotABuffer(actorch.Actor):
    async def ping(self) -> str:
        return "pong"


def batch_of(values: range | list[int], width: int = 2) -> dict[str, torch.Tensor]:
    """Transitions whose every field encodes the transition's value, to check where it went."""
    value = torch.tensor(list(values), dtype=torch.float32)
    return {
        "obs": value[:, None].repeat(1, width),
        "action": value.to(torch.int64),
        "done": value.to(torch.int64) % 2 == 1,
    }


async def spawn_buffer(world: LocalWorld, capacity: int = 8, on: int = 1, **kwargs: Any) -> actorch.ActorRef[Any]:
    kwargs.setdefault("seed", 0)
    return await world[0].spawn(ReplayBuffer, args=(capacity,), kwargs=kwargs, on=on)


async def spawn_prioritized(
    world: LocalWorld, capacity: int = 8, on: int = 1, **kwargs: Any
) -> actorch.ActorRef[PrioritizedReplayBuffer]:
    kwargs.setdefault("seed", 0)
    return await world[0].spawn(PrioritizedReplayBuffer, args=(capacity,), kwargs=kwargs, on=on)


async def slot_values(ref: actorch.ActorRef[Any], draws: int = 400) -> dict[int, int]:
    """Which value each slot holds, read back through sampling (every slot of a small buffer is hit)."""
    sample = await ref.call(ReplayBuffer.sample, draws)
    return {int(i): int(a) for i, a in zip(sample.indices, sample.data["action"], strict=True)}


# --------------------------------------------------------------------------- ReplayBuffer: storage


async def test_replay_buffer_extend_returns_the_transitions_held(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, 8, on=on)
    assert await buffer.call(ReplayBuffer.extend, batch_of(range(3))) == 3
    assert await buffer.call(ReplayBuffer.extend, batch_of(range(3, 10))) == 8
    assert await buffer.call(ReplayBuffer.size) == 8


async def test_replay_buffer_evicts_the_oldest_in_ring_order(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world, 5)
    await buffer.call(ReplayBuffer.extend, batch_of(range(3)))
    await buffer.call(ReplayBuffer.extend, batch_of(range(3, 7)))
    # Slots 0..4 got 0 1 2 3 4, then 5 and 6 overwrote the two oldest.
    assert await slot_values(buffer) == {0: 5, 1: 6, 2: 2, 3: 3, 4: 4}
    await buffer.call(ReplayBuffer.add, {key: value[0] for key, value in batch_of([7]).items()})
    assert (await slot_values(buffer))[2] == 7


async def test_replay_buffer_extend_larger_than_capacity_keeps_the_last_transitions(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world, 4)
    await buffer.call(ReplayBuffer.extend, batch_of([100]))
    assert await buffer.call(ReplayBuffer.extend, batch_of(range(10))) == 4
    # As if written one by one from slot 1: the last four (6..9) sit where sequential writes put them.
    assert await slot_values(buffer) == {3: 6, 0: 7, 1: 8, 2: 9}
    statistics = await buffer.call(ReplayBuffer.statistics)
    assert (statistics["cursor"], statistics["added"]) == (3, 11)


async def test_replay_buffer_add_stores_one_transition(world: LocalWorld, on: int) -> None:
    buffer = await spawn_buffer(world, 4, on=on)
    assert await buffer.call(ReplayBuffer.add, {"obs": torch.ones(3), "reward": torch.tensor(2.5)}) == 1
    sample = await buffer.call(ReplayBuffer.sample, 2)
    assert sample.data["obs"].shape == (2, 3)
    assert sample.data["reward"].tolist() == [2.5, 2.5]


async def test_replay_buffer_add_refuses_what_is_not_a_dict_of_tensors(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world)
    with pytest.raises(TypeError, match="dict of tensors"):
        await buffer.call(ReplayBuffer.add, [torch.ones(1)])
    with pytest.raises(TypeError, match=r"transition\['obs'\] is a list"):
        await buffer.call(ReplayBuffer.add, {"obs": [1.0]})


async def test_replay_buffer_sample_returns_fresh_tensors_not_views(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world, 4, on=0)  # same node: nothing is copied on the way
    await buffer.call(ReplayBuffer.extend, batch_of(range(4)))
    first = await buffer.call(ReplayBuffer.sample, 16)
    for tensor in first.data.values():
        tensor.zero_()
    again = await buffer.call(ReplayBuffer.sample, 64)
    assert sorted(set(again.data["action"].tolist())) == [0, 1, 2, 3]
    assert torch.equal(again.data["obs"][:, 0], again.data["action"].to(torch.float32))


async def test_replay_buffer_sample_is_uniform(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world, 10, seed=3)
    await buffer.call(ReplayBuffer.extend, batch_of(range(10)))
    counts = torch.zeros(10)
    for _ in range(50):
        sample = await buffer.call(ReplayBuffer.sample, 1000)
        assert sample.weights is None
        assert sample.probabilities is None
        assert (sample.size, sample.mass) == (10, 10.0)
        counts += torch.bincount(sample.data["action"], minlength=10)
    assert torch.allclose(counts / counts.sum(), torch.full((10,), 0.1), atol=0.005)


async def test_replay_buffer_seed_makes_sampling_repeatable(world: LocalWorld) -> None:
    one = await spawn_buffer(world, 16, seed=5)
    two = await spawn_buffer(world, 16, on=2, seed=5)
    for buffer in (one, two):
        await buffer.call(ReplayBuffer.extend, batch_of(range(16)))
    first, second = await one.call(ReplayBuffer.sample, 32), await two.call(ReplayBuffer.sample, 32)
    assert torch.equal(first.indices, second.indices)


async def test_replay_buffer_clear_forgets_transitions_and_layout(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world)
    await buffer.call(ReplayBuffer.extend, batch_of(range(5)))
    await buffer.call(ReplayBuffer.clear)
    assert await buffer.call(ReplayBuffer.size) == 0
    with pytest.raises(ValueError, match="empty"):
        await buffer.call(ReplayBuffer.sample, 1)
    assert await buffer.call(ReplayBuffer.extend, {"other": torch.zeros(2, 7)}) == 2


async def test_replay_buffer_statistics_reports_layout_and_counters(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world, 8)
    await buffer.call(ReplayBuffer.extend, batch_of(range(3)))
    await buffer.call(ReplayBuffer.sample, 5)
    statistics = await buffer.call(ReplayBuffer.statistics)
    assert statistics == {
        "kind": "uniform",
        "capacity": 8,
        "device": "cpu",
        "size": 3,
        "mass": 3.0,
        "cursor": 3,
        "keys": {"obs": ["float32", [2]], "action": ["int64", []], "done": ["bool", []]},
        "bytes": 8 * (8 + 8 + 1),
        "added": 3,
        "sampled": 5,
        "samples": 1,
        "snapshots": 0,
        "saved": 0,
    }


async def test_sample_repr_names_its_size_and_keys(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world)
    await buffer.call(ReplayBuffer.extend, batch_of(range(3)))
    sample = await buffer.call(ReplayBuffer.sample, 4)
    assert isinstance(sample, Sample)
    assert repr(sample) == "<Sample 4 uniform items of 3 (obs, action, done)>"


# --------------------------------------------------------------------------- ReplayBuffer: refusals


@pytest.mark.parametrize(
    ("capacity", "error"), [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)]
)
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
async def test_replay_buffer_refuses_a_bad_capacity(
    world: LocalWorld, cls: type[ReplayBuffer], capacity: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="capacity"):
        await world[0].spawn(cls, args=(capacity,), on=1)


@pytest.mark.parametrize(
    ("batch", "error", "match"),
    [
        ([torch.ones(2)], TypeError, "dict of tensors, not list"),
        ({}, ValueError, "at least one key"),
        ({1: torch.ones(2)}, TypeError, "keys are strings"),
        ({"obs": [1.0, 2.0]}, TypeError, r"batch\['obs'\] is a list, not a tensor"),
        ({"obs": torch.tensor(1.0)}, ValueError, r"batch\['obs'\] has no leading dimension"),
        ({"obs": torch.ones(2), "act": torch.ones(3)}, ValueError, r"batch\['act'\] holds 3 transitions"),
    ],
)
async def test_replay_buffer_extend_refuses_a_malformed_batch(
    world: LocalWorld, batch: Any, error: type[Exception], match: str
) -> None:
    buffer = await spawn_buffer(world)
    with pytest.raises(error, match=match):
        await buffer.call(ReplayBuffer.extend, batch)
    assert await buffer.call(ReplayBuffer.size) == 0


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda b: {k: v for k, v in b.items() if k != "done"}, ValueError, r"missing \['done'\]"),
        (lambda b: {**b, "extra": torch.ones(2)}, ValueError, r"unexpected \['extra'\]"),
        (lambda b: {**b, "action": b["action"].to(torch.int32)}, TypeError, r"batch\['action'\] has dtype torch.int32"),
        (lambda b: {**b, "obs": torch.ones(2, 3)}, ValueError, r"batch\['obs'\] has transitions of shape \[3\]"),
    ],
)
async def test_replay_buffer_extend_refuses_a_batch_of_another_layout(
    world: LocalWorld, change: Any, error: type[Exception], match: str
) -> None:
    buffer = await spawn_buffer(world)
    await buffer.call(ReplayBuffer.extend, batch_of(range(2)))
    with pytest.raises(error, match=match):
        await buffer.call(ReplayBuffer.extend, change(batch_of(range(2))))
    assert await buffer.call(ReplayBuffer.size) == 2


async def test_replay_buffer_sample_refuses_an_empty_buffer_and_bad_batch_sizes(world: LocalWorld) -> None:
    buffer = await spawn_buffer(world)
    with pytest.raises(ValueError, match="cannot sample from an empty replay buffer"):
        await buffer.call(ReplayBuffer.sample, 4)
    await buffer.call(ReplayBuffer.extend, batch_of(range(2)))
    for bad in (0, -1):
        with pytest.raises(ValueError, match="batch_size must be positive"):
            await buffer.call(ReplayBuffer.sample, bad)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        await buffer.call(ReplayBuffer.sample, 2.0)


# --------------------------------------------------------------------------- PrioritizedReplayBuffer


def expected_probabilities(priorities: list[float], alpha: float, epsilon: float = 0.0) -> torch.Tensor:
    powered = (torch.tensor(priorities, dtype=torch.float64) + epsilon) ** alpha
    return powered / powered.sum()


async def test_prioritized_new_transitions_get_the_max_priority(world: LocalWorld) -> None:
    buffer = await spawn_prioritized(world, 8, epsilon=0.0)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(2)))
    first = await buffer.call(PrioritizedReplayBuffer.sample, 4)
    assert first.probabilities is not None
    assert torch.allclose(first.probabilities, torch.full((4,), 0.5).double())
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.tensor([0, 1]), torch.tensor([4.0, 1.0]))
    await buffer.call(PrioritizedReplayBuffer.add, {key: value[0] for key, value in batch_of([2]).items()})
    statistics = await buffer.call(PrioritizedReplayBuffer.statistics)
    assert statistics["max_priority"] == 4.0
    assert statistics["mass"] == pytest.approx(2 * 4.0**0.6 + 1.0)


async def test_prioritized_sample_frequencies_follow_priorities_to_the_alpha(world: LocalWorld) -> None:
    priorities = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.5, 10.0]
    buffer = await spawn_prioritized(world, 8, alpha=0.6, seed=11)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(8)))
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.arange(8), torch.tensor(priorities))
    expected = expected_probabilities(priorities, 0.6, 1e-6)
    counts = torch.zeros(8, dtype=torch.float64)
    for _ in range(40):
        sample = await buffer.call(PrioritizedReplayBuffer.sample, 500)
        assert torch.equal(sample.data["action"], sample.indices)  # slot i holds transition i
        assert sample.probabilities is not None
        assert torch.allclose(sample.probabilities, expected[sample.indices], rtol=1e-9)
        counts += torch.bincount(sample.indices, minlength=8)
    frequencies = counts / counts.sum()
    assert torch.allclose(frequencies, expected, atol=0.004), (frequencies, expected)


async def test_prioritized_weights_are_normalised_importance_weights(world: LocalWorld) -> None:
    priorities = [1.0, 3.0, 9.0, 0.2]
    buffer = await spawn_prioritized(world, 4, alpha=0.7, beta=0.5, epsilon=0.0)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(4)))
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.arange(4), torch.tensor(priorities))
    probabilities = expected_probabilities(priorities, 0.7)
    for beta, sample in [
        (0.5, await buffer.call(PrioritizedReplayBuffer.sample, 64)),
        (1.0, await buffer.call(PrioritizedReplayBuffer.sample, 64, beta=1.0)),
        (0.0, await buffer.call(PrioritizedReplayBuffer.sample, 64, beta=0.0)),
    ]:
        assert sample.weights is not None
        assert sample.weights.dtype == torch.float32
        raw = (4 * probabilities[sample.indices]) ** -beta
        assert torch.allclose(sample.weights, (raw / raw.max()).float())
        assert float(sample.weights.max()) == 1.0
        assert sample.mass == pytest.approx(float((torch.tensor(priorities, dtype=torch.float64) ** 0.7).sum()))


@pytest.mark.parametrize("capacity", [1, 2, 100, 5000])
async def test_prioritized_sample_descends_the_tree_to_the_right_leaves(world: LocalWorld, capacity: int) -> None:
    generator = torch.Generator().manual_seed(capacity)
    priorities = torch.rand(capacity, generator=generator, dtype=torch.float64) * 5
    priorities[torch.rand(capacity, generator=generator) < 0.3] = 0.0  # empty leaves are never drawn
    priorities[0] = 1.0
    buffer = await spawn_prioritized(world, capacity, alpha=1.0, epsilon=0.0, seed=21)
    await buffer.call(PrioritizedReplayBuffer.extend, {"x": torch.arange(capacity)})
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.arange(capacity), priorities)
    sample = await buffer.call(PrioritizedReplayBuffer.sample, 512)
    # The same stratified targets, found by a plain search over the running sum of the leaves.
    uniform = torch.rand(512, generator=torch.Generator().manual_seed(21), dtype=torch.float64)
    targets = (torch.arange(512, dtype=torch.float64) + uniform) * (sample.mass / 512)
    expected = torch.searchsorted(priorities.cumsum(0), targets, right=True)
    assert torch.equal(sample.indices, expected)
    assert bool((priorities[sample.indices] > 0).all())


async def test_prioritized_sample_refuses_a_bad_beta_and_zero_mass(world: LocalWorld) -> None:
    buffer = await spawn_prioritized(world, 4, epsilon=0.0)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(2)))
    for beta in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="beta must be a number in"):
            await buffer.call(PrioritizedReplayBuffer.sample, 2, beta=beta)
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.arange(2), torch.zeros(2))
    with pytest.raises(ValueError, match="every priority is zero"):
        await buffer.call(PrioritizedReplayBuffer.sample, 2)


async def test_prioritized_update_priorities_changes_what_is_drawn(world: LocalWorld) -> None:
    buffer = await spawn_prioritized(world, 16, alpha=1.0, epsilon=0.0)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(10)))
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.arange(10), torch.zeros(10))
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.tensor([3, 7]), torch.tensor([1.0, 3.0]))
    sample = await buffer.call(PrioritizedReplayBuffer.sample, 400)
    assert set(sample.indices.tolist()) == {3, 7}
    assert int((sample.indices == 7).sum()) == 300  # stratified: exactly in proportion


async def test_prioritized_update_priorities_last_duplicate_wins(world: LocalWorld) -> None:
    buffer = await spawn_prioritized(world, 4, alpha=1.0, epsilon=0.0)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(2)))
    await buffer.call(
        PrioritizedReplayBuffer.update_priorities, torch.tensor([0, 1, 0, 0]), torch.tensor([5.0, 1.0, 9.0, 3.0])
    )
    assert (await buffer.call(PrioritizedReplayBuffer.statistics))["mass"] == 4.0


async def test_prioritized_tree_stays_consistent_over_many_updates(world: LocalWorld) -> None:
    generator = torch.Generator().manual_seed(1)
    buffer = await spawn_prioritized(world, 100, alpha=0.5, epsilon=0.0)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(130)))
    truth = torch.ones(100, dtype=torch.float64)
    for _ in range(30):
        indices = torch.randint(100, (25,), generator=generator).unique()
        values = torch.rand(len(indices), generator=generator, dtype=torch.float64) * 10
        truth[indices] = values
        await buffer.call(PrioritizedReplayBuffer.update_priorities, indices, values)
    mass = (await buffer.call(PrioritizedReplayBuffer.statistics))["mass"]
    assert mass == pytest.approx(float((truth**0.5).sum()), rel=1e-12)
    sample = await buffer.call(PrioritizedReplayBuffer.sample, 200)
    assert sample.probabilities is not None
    assert torch.allclose(sample.probabilities, (truth**0.5 / (truth**0.5).sum())[sample.indices])


@pytest.mark.parametrize(
    ("indices", "priorities", "error", "match"),
    [
        ([0, 1], torch.ones(2), TypeError, "are tensors"),
        (torch.tensor([0.0, 1.0]), torch.ones(2), TypeError, "indices must be integers"),
        (torch.tensor([0, 1]), torch.ones(3), ValueError, "2 indices but 3 priorities"),
        (torch.tensor([0, 1]), torch.tensor([1.0, -2.0]), ValueError, "finite and >= 0, got -2.0"),
        (torch.tensor([0, 1]), torch.tensor([float("nan"), 1.0]), ValueError, "finite and >= 0, got nan"),
        (torch.tensor([0, 1]), torch.tensor([1.0, float("inf")]), ValueError, "finite and >= 0, got inf"),
        (torch.tensor([0, 5]), torch.ones(2), ValueError, "index 5 is out of range: the buffer holds 3"),
        (torch.tensor([-1]), torch.ones(1), ValueError, "index -1 is out of range"),
    ],
)
async def test_prioritized_update_priorities_refuses_bad_input(
    world: LocalWorld, indices: Any, priorities: Any, error: type[Exception], match: str
) -> None:
    buffer = await spawn_prioritized(world, 8)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(3)))
    before = await buffer.call(PrioritizedReplayBuffer.statistics)
    with pytest.raises(error, match=match):
        await buffer.call(PrioritizedReplayBuffer.update_priorities, indices, priorities)
    assert await buffer.call(PrioritizedReplayBuffer.statistics) == before


async def test_prioritized_update_priorities_keeps_autograd_out_of_the_tree(world: LocalWorld) -> None:
    buffer = await spawn_prioritized(world, 8, on=0)  # same node: the tensor arrives as it was sent
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(3)))
    error = torch.ones(3, requires_grad=True) * 2
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.arange(3), error.abs())
    sample = await buffer.call(PrioritizedReplayBuffer.sample, 4)
    assert sample.weights is not None
    assert sample.probabilities is not None
    assert not sample.weights.requires_grad
    assert not sample.probabilities.requires_grad


async def test_prioritized_update_priorities_of_nothing_does_nothing(world: LocalWorld) -> None:
    buffer = await spawn_prioritized(world, 8)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(3)))
    empty = torch.zeros(0, dtype=torch.int64)
    assert await buffer.call(PrioritizedReplayBuffer.update_priorities, empty, torch.zeros(0)) is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": -1.0}, "alpha must be a finite number"),
        ({"alpha": float("inf")}, "alpha must be a finite number"),
        ({"epsilon": -1e-3}, "epsilon must be a finite number"),
        ({"beta": 2.0}, "beta must be a number in"),
    ],
)
async def test_prioritized_refuses_out_of_range_arguments(
    world: LocalWorld, kwargs: dict[str, float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await spawn_prioritized(world, 4, **kwargs)


async def test_prioritized_clear_forgets_priorities(world: LocalWorld) -> None:
    buffer = await spawn_prioritized(world, 4, alpha=1.0, epsilon=0.0)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(4)))
    await buffer.call(PrioritizedReplayBuffer.update_priorities, torch.tensor([0]), torch.tensor([50.0]))
    await buffer.call(PrioritizedReplayBuffer.clear)
    statistics = await buffer.call(PrioritizedReplayBuffer.statistics)
    assert (statistics["size"], statistics["mass"], statistics["max_priority"]) == (0, 0.0, 1.0)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(2)))
    assert (await buffer.call(PrioritizedReplayBuffer.statistics))["mass"] == 2.0


async def test_prioritized_capacity_one_works(world: LocalWorld) -> None:
    buffer = await spawn_prioritized(world, 1)
    await buffer.call(PrioritizedReplayBuffer.extend, batch_of(range(3)))
    sample = await buffer.call(PrioritizedReplayBuffer.sample, 3)
    assert sample.indices.tolist() == [0, 0, 0]
    assert sample.data["action"].tolist() == [2, 2, 2]


# --------------------------------------------------------------------------- snapshots


async def test_snapshot_round_trip_restores_contents_and_sampling(world: LocalWorld, tmp_path: Path) -> None:
    path = str(tmp_path / "uniform.snap")
    original = await spawn_buffer(world, 6, seed=9)
    await original.call(ReplayBuffer.extend, batch_of(range(9)))
    written = await original.call(ReplayBuffer.snapshot, path)
    assert written == len(await anyio.Path(path).read_bytes())
    restored = await spawn_buffer(world, 6, on=2, seed=9, restore=path)
    first, second = await original.call(ReplayBuffer.sample, 50), await restored.call(ReplayBuffer.sample, 50)
    assert torch.equal(first.indices, second.indices)
    for key in first.data:
        assert torch.equal(first.data[key], second.data[key])
    before, after = await original.call(ReplayBuffer.statistics), await restored.call(ReplayBuffer.statistics)
    for key in ("size", "cursor", "keys", "capacity"):
        assert before[key] == after[key]
    assert (await original.call(ReplayBuffer.statistics))["snapshots"] == 1
    # The ring goes on where it stopped: the next write replaces the oldest.
    await restored.call(ReplayBuffer.extend, batch_of([99]))
    assert sorted((await slot_values(restored)).values()) == [4, 5, 6, 7, 8, 99]


async def test_snapshot_round_trip_keeps_priorities(world: LocalWorld, tmp_path: Path) -> None:
    path = str(tmp_path / "prioritized.snap")
    original = await spawn_prioritized(world, 8, seed=4)
    await original.call(PrioritizedReplayBuffer.extend, batch_of(range(5)))
    await original.call(PrioritizedReplayBuffer.update_priorities, torch.arange(5), torch.tensor([1.0, 2, 3, 4, 20]))
    await original.call(PrioritizedReplayBuffer.snapshot, path)
    restored = await spawn_prioritized(world, 8, on=2, seed=4, restore=path)
    first = await original.call(PrioritizedReplayBuffer.sample, 64)
    second = await restored.call(PrioritizedReplayBuffer.sample, 64)
    assert torch.equal(first.indices, second.indices)
    assert first.probabilities is not None
    assert second.probabilities is not None
    assert torch.equal(first.probabilities, second.probabilities)
    before = await original.call(PrioritizedReplayBuffer.statistics)
    after = await restored.call(PrioritizedReplayBuffer.statistics)
    for key in ("size", "cursor", "mass", "max_priority", "alpha"):
        assert before[key] == after[key]


async def test_snapshot_of_an_empty_buffer_restores_empty(world: LocalWorld, tmp_path: Path) -> None:
    path = str(tmp_path / "empty.snap")
    original = await spawn_prioritized(world, 4)
    await original.call(PrioritizedReplayBuffer.snapshot, path)
    restored = await spawn_prioritized(world, 4, restore=path)
    assert await restored.call(PrioritizedReplayBuffer.size) == 0
    assert await restored.call(PrioritizedReplayBuffer.extend, batch_of(range(2))) == 2


async def snapshot_file(world: LocalWorld, tmp_path: Path, cls: type[ReplayBuffer] = ReplayBuffer) -> Path:
    path = tmp_path / f"{cls.__name__}.snap"
    ref = await world[0].spawn(cls, args=(8,), on=1)
    await ref.call(ReplayBuffer.extend, batch_of(range(5)))
    await ref.call(ReplayBuffer.snapshot, str(path))
    return path


async def test_snapshot_restore_refuses_a_truncated_file(world: LocalWorld, tmp_path: Path) -> None:
    path = await snapshot_file(world, tmp_path)
    path.write_bytes(path.read_bytes()[:-17])
    with pytest.raises(actorch.SnapshotError, match="truncated"):
        await spawn_buffer(world, 8, restore=str(path))


async def test_snapshot_restore_refuses_a_flipped_byte(world: LocalWorld, tmp_path: Path) -> None:
    path = await snapshot_file(world, tmp_path)
    data = bytearray(path.read_bytes())
    header_end = 24 + int.from_bytes(data[16:24], "little")  # magic, header length, header
    data[-(-header_end // 64) * 64 + 3] ^= 0x40  # a byte of the first tensor
    path.write_bytes(bytes(data))
    with pytest.raises(actorch.SnapshotError, match="checksum"):
        await spawn_buffer(world, 8, restore=str(path))


async def test_snapshot_restore_refuses_another_kind(world: LocalWorld, tmp_path: Path) -> None:
    uniform = await snapshot_file(world, tmp_path)
    prioritized = await snapshot_file(world, tmp_path, PrioritizedReplayBuffer)
    with pytest.raises(actorch.SnapshotError, match="holds a 'uniform' replay buffer"):
        await spawn_prioritized(world, 8, restore=str(uniform))
    with pytest.raises(actorch.SnapshotError, match="restores only 'uniform' snapshots"):
        await spawn_buffer(world, 8, restore=str(prioritized))


async def test_snapshot_restore_refuses_another_capacity_or_alpha(world: LocalWorld, tmp_path: Path) -> None:
    path = await snapshot_file(world, tmp_path, PrioritizedReplayBuffer)
    with pytest.raises(actorch.SnapshotError, match="capacity 8, this buffer has capacity 16"):
        await spawn_prioritized(world, 16, restore=str(path))
    with pytest.raises(actorch.SnapshotError, match=r"alpha=0\.6, this buffer has alpha=0\.9"):
        await spawn_prioritized(world, 8, alpha=0.9, restore=str(path))


async def test_snapshot_restore_refuses_a_tensor_file_that_is_no_snapshot(world: LocalWorld, tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    save_tensors(path, {"w": torch.ones(3)}, {"model": "mlp"})
    with pytest.raises(actorch.SnapshotError, match="not a replay buffer snapshot"):
        await spawn_buffer(world, 8, restore=str(path))


def snapshot_meta(**changes: Any) -> dict[str, Any]:
    meta = {
        "format": "actorch.replay",
        "version": 1,
        "kind": "prioritized",
        "capacity": 4,
        "cursor": 2,
        "size": 2,
        "keys": ["x"],
        "alpha": 0.6,
        "max_priority": 1.0,
    }
    return {**meta, **changes}


GOOD_TENSORS = {"data/x": torch.ones(2, 3), "priorities": torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)}


@pytest.mark.parametrize(
    ("meta", "tensors", "match"),
    [
        (snapshot_meta(version=2), GOOD_TENSORS, "snapshot version 2"),
        (snapshot_meta(size=5), GOOD_TENSORS, "inconsistent: size 5"),
        (snapshot_meta(cursor=3), GOOD_TENSORS, "cursor 3 with size 2"),
        (snapshot_meta(keys="x"), GOOD_TENSORS, "bad key list"),
        (snapshot_meta(keys=["x", "y"]), GOOD_TENSORS, "key 'y' does not hold 2 transitions"),
        (snapshot_meta(max_priority=-1.0), GOOD_TENSORS, "max priority -1.0"),
        (snapshot_meta(), {**GOOD_TENSORS, "priorities": torch.ones(4)}, "needs 4 float64 priorities"),
        (
            snapshot_meta(),
            {**GOOD_TENSORS, "priorities": torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)},
            "past the size",
        ),
        (snapshot_meta(), {**GOOD_TENSORS, "junk": torch.ones(1)}, r"unexpected tensors \['junk'\]"),
    ],
)
async def test_snapshot_restore_refuses_an_inconsistent_snapshot(
    world: LocalWorld, tmp_path: Path, meta: dict[str, Any], tensors: dict[str, torch.Tensor], match: str
) -> None:
    path = tmp_path / "crafted.snap"
    save_tensors(path, tensors, meta)
    with pytest.raises(actorch.SnapshotError, match=match):
        await spawn_prioritized(world, 4, restore=str(path))
    save_tensors(path, GOOD_TENSORS, snapshot_meta())  # the same file, made whole, restores
    restored = await spawn_prioritized(world, 4, restore=str(path))
    assert await restored.call(PrioritizedReplayBuffer.size) == 2


async def test_snapshot_bad_restore_path_fails_the_spawn_at_its_caller(world: LocalWorld, tmp_path: Path) -> None:
    missing = tmp_path / "missing.snap"
    with pytest.raises(FileNotFoundError, match=r"cannot restore ReplayBuffer from .*missing\.snap") as caught:
        await world[0].spawn(ReplayBuffer, args=(8,), kwargs={"restore": str(missing)}, name="replay/x", on=2)
    assert isinstance(caught.value, actorch.RemoteError)
    garbage = tmp_path / "garbage.snap"
    garbage.write_bytes(b"not a snapshot at all")
    with pytest.raises(actorch.SnapshotError, match="bad magic") as refused:
        await world[0].spawn(ReplayBuffer, args=(8,), kwargs={"restore": str(garbage)}, name="replay/x", on=2)
    assert isinstance(refused.value, actorch.RemoteError)
    assert await world[0].lookup_all("replay/*") == [], "a failed spawn leaves no actor and no name"


# --------------------------------------------------------------------------- ShardedReplayBuffer


async def spawn_shards(
    world: LocalWorld, cls: type[ReplayBuffer], capacity: int, prefix: str = "shards", **kwargs: Any
) -> list[Any]:
    return [
        await world[0].spawn(cls, args=(capacity,), kwargs={"seed": rank, **kwargs}, name=f"{prefix}/{rank}", on=rank)
        for rank in (1, 2)
    ]


async def test_sharded_extend_spreads_transitions_round_robin(world: LocalWorld) -> None:
    shards = await spawn_shards(world, ReplayBuffer, 100)
    client = ShardedReplayBuffer(shards, seed=0)
    assert await client.extend(batch_of(range(5))) == 5
    assert await client.extend(batch_of([5])) == 6
    assert await client.extend(batch_of(range(6, 9))) == 9
    assert [await shard.call(ReplayBuffer.size) for shard in shards] == [5, 4]
    assert sorted((await slot_values(shards[0])).values()) == [0, 2, 4, 6, 8]
    assert sorted((await slot_values(shards[1])).values()) == [1, 3, 5, 7]
    assert await client.size() == 9


async def test_sharded_extend_refuses_a_malformed_batch(world: LocalWorld) -> None:
    client = ShardedReplayBuffer(await spawn_shards(world, ReplayBuffer, 10))
    for batch, error, match in [
        ([torch.ones(1)], TypeError, "dict of tensors"),
        ({}, ValueError, "at least one key"),
        ({"x": 1.0}, TypeError, "not a tensor"),
        ({"x": torch.tensor(1.0)}, ValueError, "no leading dimension"),
        ({"x": torch.ones(2), "y": torch.ones(3)}, ValueError, r"differ in leading dimension: \[2, 3\]"),
    ]:
        with pytest.raises(error, match=match):
            await client.extend(batch)  # type: ignore[arg-type]


async def test_sharded_sample_draws_in_proportion_to_shard_sizes(world: LocalWorld) -> None:
    shards = await spawn_shards(world, ReplayBuffer, 1000)
    await shards[0].call(ReplayBuffer.extend, batch_of(range(100)))
    await shards[1].call(ReplayBuffer.extend, batch_of(range(1000, 1300)))
    client = ShardedReplayBuffer(shards, seed=7)
    from_second = 0
    for _ in range(50):
        sample = await client.sample(400)
        assert (sample.size, sample.mass, sample.weights) == (400, 400.0, None)
        shard = sample.indices >> SHARD_SHIFT
        local = sample.indices & ((1 << SHARD_SHIFT) - 1)
        # The data came from where the index says: shard 0 holds 0..99 at slots 0..99, shard 1 holds 1000+.
        assert torch.equal(sample.data["action"], local + 1000 * shard)
        from_second += int(shard.sum())
    assert from_second / (50 * 400) == pytest.approx(0.75, abs=0.01)


async def test_sharded_prioritized_sample_uses_global_probabilities_and_weights(world: LocalWorld) -> None:
    shards = await spawn_shards(world, PrioritizedReplayBuffer, 8, alpha=1.0, epsilon=0.0)
    priorities = [[1.0, 2.0, 3.0], [10.0, 4.0]]
    for shard, values in zip(shards, priorities, strict=True):
        await shard.call(PrioritizedReplayBuffer.extend, batch_of(range(len(values))))
        await shard.call(PrioritizedReplayBuffer.update_priorities, torch.arange(len(values)), torch.tensor(values))
    client = ShardedReplayBuffer(shards, beta=0.5, seed=3)
    glob = {(s, i): p / 20.0 for s, values in enumerate(priorities) for i, p in enumerate(values)}
    counts = dict.fromkeys(glob, 0)
    for _ in range(100):
        sample = await client.sample(200)
        assert (sample.size, sample.mass) == (5, 20.0)
        assert sample.probabilities is not None
        assert sample.weights is not None
        keys = [(int(i) >> SHARD_SHIFT, int(i) & ((1 << SHARD_SHIFT) - 1)) for i in sample.indices]
        expected = torch.tensor([glob[key] for key in keys], dtype=torch.float64)
        assert torch.allclose(sample.probabilities, expected)
        raw = (5 * expected) ** -0.5
        assert torch.allclose(sample.weights, (raw / raw.max()).float())
        for key in keys:
            counts[key] += 1
    for key, probability in glob.items():
        assert counts[key] / 20000 == pytest.approx(probability, abs=0.01), key
    beta_one = await client.sample(50, beta=1.0)
    assert beta_one.probabilities is not None
    assert beta_one.weights is not None
    raw = 1.0 / (5 * beta_one.probabilities)
    assert torch.allclose(beta_one.weights, (raw / raw.max()).float())


async def test_sharded_update_priorities_fans_out_by_shard(world: LocalWorld) -> None:
    shards = await spawn_shards(world, PrioritizedReplayBuffer, 8, alpha=1.0, epsilon=0.0)
    client = ShardedReplayBuffer(shards, seed=0)
    await client.extend(batch_of(range(6)))
    sample = await client.sample(12)
    await client.update_priorities(sample.indices, torch.zeros(12))
    await client.update_priorities(torch.tensor([1 << SHARD_SHIFT | 2, 0]), torch.tensor([5.0, 3.0]))
    masses = [(await shard.call(PrioritizedReplayBuffer.statistics))["mass"] for shard in shards]
    untouched = [set(range(3)) - {int(i) & 7 for i in sample.indices if int(i) >> SHARD_SHIFT == s} for s in (0, 1)]
    assert masses == [3.0 + len(untouched[0] - {0}), 5.0 + len(untouched[1] - {2})]


async def test_sharded_update_priorities_refuses_bad_input(world: LocalWorld) -> None:
    prioritized = ShardedReplayBuffer(await spawn_shards(world, PrioritizedReplayBuffer, 8))
    await prioritized.extend(batch_of(range(4)))
    with pytest.raises(TypeError, match="must be tensors"):
        await prioritized.update_priorities([0], torch.ones(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="indices must be integers"):
        await prioritized.update_priorities(torch.tensor([0.0]), torch.ones(1))
    with pytest.raises(ValueError, match="2 indices but 1 priorities"):
        await prioritized.update_priorities(torch.tensor([0, 1]), torch.ones(1))
    with pytest.raises(ValueError, match=f"index {2 << SHARD_SHIFT} names no shard"):
        await prioritized.update_priorities(torch.tensor([2 << SHARD_SHIFT]), torch.ones(1))
    with pytest.raises(ValueError, match="index -1 names no shard"):
        await prioritized.update_priorities(torch.tensor([-1]), torch.ones(1))
    shard_1_failed = r"1 of 1 calls to 'update_priorities' of replay shards failed: replay shard 1 \("
    with pytest.raises(actorch.GroupError, match=shard_1_failed) as info:
        await prioritized.update_priorities(torch.tensor([1 << SHARD_SHIFT | 7]), torch.ones(1))
    assert isinstance(info.value.exceptions[0], ValueError)
    uniform = ShardedReplayBuffer(await spawn_shards(world, ReplayBuffer, 8, prefix="uniform"))
    with pytest.raises(TypeError, match="uniform shards"):
        await uniform.update_priorities(torch.tensor([0]), torch.ones(1))


async def test_sharded_sample_refuses_bad_arguments_and_empty_shards(world: LocalWorld) -> None:
    client = ShardedReplayBuffer(await spawn_shards(world, PrioritizedReplayBuffer, 8))
    with pytest.raises(ValueError, match="every shard is empty"):
        await client.sample(4)
    await client.extend(batch_of(range(2)))
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            await client.sample(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beta must be a number in"):
        await client.sample(2, beta=3.0)


async def test_sharded_sample_finds_a_shard_that_was_empty_at_first(world: LocalWorld) -> None:
    shards = await spawn_shards(world, ReplayBuffer, 100)
    await shards[0].call(ReplayBuffer.extend, batch_of(range(10)))
    client = ShardedReplayBuffer(shards, seed=1)
    first = await client.sample(20)
    assert set((first.indices >> SHARD_SHIFT).tolist()) == {0}
    await shards[1].call(ReplayBuffer.extend, batch_of(range(90)))
    await client.sample(20)  # learns the new size on the way
    later = await client.sample(200)
    assert int((later.indices >> SHARD_SHIFT).sum()) > 150
    assert client.statistics()["sizes"] == [10, 90]


async def test_sharded_group_error_names_a_stopped_shard(world: LocalWorld) -> None:
    shards = await spawn_shards(world, ReplayBuffer, 100)
    client = ShardedReplayBuffer(shards, seed=0)
    await client.extend(batch_of(range(50)))
    await shards[1].stop()
    with pytest.raises(actorch.GroupError) as info:
        await client.sample(8)  # with this seed the split asks both shards
    error = info.value
    assert error.failed == [1]
    assert "shard 1" in str(error)
    assert "shards/2" in str(error)
    assert isinstance(error.exceptions[0], actorch.ActorStoppedError)
    assert any("replay shard 1" in note and "shards/2" in note for note in error.exceptions[0].__notes__)
    assert isinstance(error.results[0], Sample)
    with pytest.raises(actorch.GroupError, match="1 of 2 calls to 'extend' of replay shards failed"):
        await client.extend(batch_of(range(2)))
    with pytest.raises(actorch.GroupError, match="1 of 2 calls to 'statistics' of replay shards failed"):
        await client.size()


async def test_sharded_group_error_names_a_lost_node(world: LocalWorld) -> None:
    shards = await spawn_shards(world, PrioritizedReplayBuffer, 100)
    client = ShardedReplayBuffer(shards, seed=0)
    await client.extend(batch_of(range(50)))
    world.kill(2)
    with pytest.raises(actorch.GroupError) as info:
        await client.update_priorities(torch.tensor([0, 1 << SHARD_SHIFT]), torch.ones(2))
    assert info.value.failed == [1]
    assert isinstance(info.value.exceptions[0], actorch.NodeLostError)


async def test_sharded_refuses_bad_shards_and_beta(world: LocalWorld) -> None:
    with pytest.raises(ValueError, match="at least one shard"):
        ShardedReplayBuffer([])
    other = await world[0].spawn(NotABuffer, on=1)
    uniform = await world[0].spawn(ReplayBuffer, args=(4,), on=1)
    prioritized = await world[0].spawn(PrioritizedReplayBuffer, args=(4,), on=2)
    with pytest.raises(TypeError, match=r"shard 1 .* is not a ref to a ReplayBuffer"):
        ShardedReplayBuffer([uniform, other])
    with pytest.raises(TypeError, match="shard 0"):
        ShardedReplayBuffer(["replay/0"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not a mix"):
        ShardedReplayBuffer([uniform, prioritized])
    with pytest.raises(ValueError, match="beta must be a number in"):
        ShardedReplayBuffer([prioritized], beta=-1.0)


async def test_sharded_repr_and_statistics_describe_the_client(world: LocalWorld) -> None:
    shards = await spawn_shards(world, PrioritizedReplayBuffer, 8)
    client = ShardedReplayBuffer(shards, seed=0)
    assert repr(client) == "<ShardedReplayBuffer prioritized, 2 shards on nodes [1, 2]>"
    assert client.statistics()["sizes"] is None
    await client.extend(batch_of(range(3)))
    await client.sample(4)
    statistics = client.statistics()
    assert statistics["sizes"] == [2, 1]
    assert (statistics["extends"], statistics["added"], statistics["samples"], statistics["sampled"]) == (1, 3, 1, 4)
    assert math.isclose(sum(statistics["masses"]), 3.0)


async def test_sharded_single_shard_passes_the_batch_through(world: LocalWorld) -> None:
    shard = await spawn_buffer(world, 8, on=0)
    client = ShardedReplayBuffer([shard], seed=0)
    assert await client.extend(batch_of(range(3))) == 3
    sample = await client.sample(5)
    assert torch.equal(sample.indices, sample.data["action"])


async def test_sharded_sampling_across_nodes_in_a_strict_world() -> None:
    async with local_world(2, strict=True, stop_grace=0.5) as world:
        shards = [
            await world[0].spawn(PrioritizedReplayBuffer, args=(64,), kwargs={"seed": rank}, on=rank) for rank in (0, 1)
        ]
        client = ShardedReplayBuffer(shards, seed=0)
        assert await client.extend(batch_of(range(40))) == 40
        sample = await client.sample(32)
        assert isinstance(sample, Sample)
        assert sample.weights is not None
        assert set((sample.indices >> SHARD_SHIFT).tolist()) == {0, 1}
        await client.update_priorities(sample.indices, torch.rand(32))
        remote = await shards[1].call(PrioritizedReplayBuffer.sample, 4)
        assert isinstance(remote, Sample)
        assert remote.data["obs"].shape == (4, 2)
        assert (await shards[1].call(PrioritizedReplayBuffer.statistics))["kind"] == "prioritized"
