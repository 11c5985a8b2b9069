"""A collector's Batch: its frames, its flat transitions, and TorchRL's layout of it."""

from __future__ import annotations

import sys

import pytest
import torch

from actorch.rl import Batch


def batch(steps: int = 3, envs: int = 2) -> Batch:
    frames = steps * envs
    observations = torch.arange(frames * 4, dtype=torch.uint8).view(steps, envs, 4)
    terminated = torch.zeros((steps, envs), dtype=torch.bool)
    truncated = torch.zeros((steps, envs), dtype=torch.bool)
    terminated[1, 0] = truncated[2, 1] = True
    return Batch(
        "rl/collectors/1",
        7,
        observations,
        torch.arange(frames).view(steps, envs) % 2,
        torch.full((steps, envs), -0.5),
        torch.ones(steps, envs),
        terminated,
        truncated,
        observations + 1,
        [3.0],
        [3],
    )


def test_batch_transitions_are_flat_frames() -> None:
    flat = batch().transitions()
    assert flat["observations"].shape == (6, 4)
    assert flat["actions"].tolist() == [0, 1, 0, 1, 0, 1]
    assert batch().frames == 6
    assert batch().dones.tolist() == [[False, False], [True, False], [False, True]]


def test_batch_to_tensordict_is_torchrls_layout_time_last() -> None:
    pytest.importorskip("tensordict")
    made = batch()
    rollout = made.to_tensordict()
    assert tuple(rollout.batch_size) == (2, 3)
    assert torch.equal(rollout["observation"], made.observations.transpose(0, 1))
    assert torch.equal(rollout["next", "observation"], made.next_observations.transpose(0, 1))
    assert torch.equal(rollout["action"], made.actions.transpose(0, 1))
    assert rollout["action_log_prob"].shape == (2, 3)
    for key in ("reward", "done", "terminated", "truncated"):
        assert rollout["next", key].shape == (2, 3, 1), key
    assert rollout["next", "done"][:, :, 0].tolist() == [[False, True, False], [False, False, True]]
    assert rollout["observation"].dtype == torch.uint8
    assert "sample_log_prob" in batch().to_tensordict(log_prob_key="sample_log_prob")


def test_batch_to_tensordict_says_what_to_install_without_tensordict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensordict", None)  # as if it were not installed
    with pytest.raises(ModuleNotFoundError, match="pip install tensordict"):
        batch().to_tensordict()
