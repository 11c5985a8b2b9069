"""``Batch``: what a collector sends, the transitions of one policy version.

A batch travels as any dataclass of tensors does. For a reader in another
process that asked for it, its observations are written into a lease of
shared memory, which reaches a reader on the collector's host by reference
(see :mod:`~actorch._stock.handover`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from actorch._base.codec import serializable

__all__ = ["Batch"]


@serializable()
@dataclass
class Batch:
    """Transitions a collector gathered with one version of the policy: ``steps`` steps of each of its environments.

    Tensors are time-major: ``[steps, envs, ...]``.

    Attributes:
        collector: The collector's name (or key).
        version: The version of the policy weights that acted in every step.
        observations: The state acted on, ``[steps, envs, *state]``.
        actions: The action taken, ``[steps, envs, *action]``.
        log_probs: Its log-probability under the acting policy, ``[steps, envs]``.
        rewards: The reward, ``[steps, envs]``, float32.
        terminated: Whether the episode ended in a terminal state there, ``[steps, envs]``.
        truncated: Whether it was cut short there (a time limit), ``[steps, envs]``.
        next_observations: The state after the step (an ended episode's last
            one, not the next episode's first), ``[steps, envs, *state]``.
        episode_returns: The total reward of each episode that ended in the batch.
        episode_lengths: The length of each of those episodes, in the same order.
    """

    collector: str
    version: int
    observations: torch.Tensor = field(repr=False)
    actions: torch.Tensor = field(repr=False)
    log_probs: torch.Tensor = field(repr=False)
    rewards: torch.Tensor = field(repr=False)
    terminated: torch.Tensor = field(repr=False)
    truncated: torch.Tensor = field(repr=False)
    next_observations: torch.Tensor = field(repr=False)
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)

    @property
    def frames(self) -> int:
        """Transitions in the batch: steps times environments."""
        return int(self.rewards.numel())

    @property
    def dones(self) -> torch.Tensor:
        """Whether an episode ended at each step, terminated or truncated."""
        return self.terminated | self.truncated

    def transitions(self) -> dict[str, torch.Tensor]:
        """The batch flattened to ``[frames, ...]`` per field, as ``ReplayBuffer.extend`` takes it."""
        flat = {
            "observations": self.observations,
            "actions": self.actions,
            "log_probs": self.log_probs,
            "rewards": self.rewards,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "next_observations": self.next_observations,
        }
        return {key: value.reshape(-1, *value.shape[2:]) for key, value in flat.items()}

    def to_tensordict(self, *, log_prob_key: str = "action_log_prob") -> Any:
        """The batch as a TorchRL rollout: a ``tensordict.TensorDict`` of batch size ``[envs, steps]``.

        TorchRL's layout, which its losses and value estimators (``ClipPPOLoss``,
        ``GAE``) take as they are: time last, ``observation``, ``action`` and
        ``log_prob_key`` at the root, and under ``"next"`` the
        ``observation``, ``reward``, ``done``, ``terminated`` and ``truncated``
        that followed (the last four ``[envs, steps, 1]``). The tensors are
        the batch's own, transposed (views, no copy). Sent to another actor,
        the TensorDict travels natively, its tensors on the tensor path.

        Raises:
            ModuleNotFoundError: If ``tensordict`` is not installed (``pip install tensordict``; TorchRL brings it).
        """
        try:
            from tensordict import TensorDict  # noqa: PLC0415 - an optional dependency, imported when used
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                "Batch.to_tensordict needs the tensordict package: pip install tensordict (TorchRL brings it)"
            ) from exc

        def time_last(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.transpose(0, 1)

        def flag(tensor: torch.Tensor) -> torch.Tensor:
            return time_last(tensor).unsqueeze(-1)

        steps, envs = self.rewards.shape
        following = {
            "observation": time_last(self.next_observations),
            "reward": flag(self.rewards),
            "done": flag(self.dones),
            "terminated": flag(self.terminated),
            "truncated": flag(self.truncated),
        }
        root = {
            "observation": time_last(self.observations),
            "action": time_last(self.actions),
            log_prob_key: time_last(self.log_probs),
            "next": TensorDict(following, batch_size=[envs, steps]),
        }
        return TensorDict(root, batch_size=[envs, steps], device=self.observations.device)
