"""What an agent's episodes leave: their ``EpisodeStats``, and rollouts sorted by observer and environment.

An observer of K environments answers with one rollout per environment, and
the agent records the log-probabilities of each message it answered; these
helpers put both back in step order per environment, for the learning step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from actorch._base.codec import serializable
from actorch._base.errors import GroupError
from actorch._stock.observer import Rollout

__all__ = ["EpisodeStats", "by_observer", "first_episode", "raise_failures", "rows_by_env"]


@serializable()
@dataclass
class EpisodeStats:
    """How one episode of the agent went.

    Attributes:
        episode: Episodes run so far, this one included.
        reward: The mean over the observers' environments of their first
            episode's total reward (in a fixed-length run, of the steps played
            if no episode ended).
        running_reward: An exponential moving average of ``reward``.
        loss: The learning step's loss.
        steps: Actions taken by all observers together (in all their environments).
        observers: How many observers played.
        seconds: Wall time of the episode, learning included.
    """

    episode: int
    reward: float
    running_reward: float
    loss: float
    steps: int
    observers: int
    seconds: float


def raise_failures(refs: list[Any], outcomes: list[Any]) -> None:
    """Raise a GroupError naming the observers whose stream failed, if any did (a cancellation as it is)."""
    failed = GroupError.from_outcomes(
        "observers' episode streams", lambda i: f"observer {refs[i].name or refs[i]!r}", outcomes
    )
    if failed is not None:
        raise failed


def first_episode(rollout: Rollout) -> float:
    """The reward of an observer's first episode, or of all it played if none ended."""
    return rollout.episode_rewards[0] if rollout.episode_rewards else float(rollout.rewards.sum())


def by_observer(rollouts: list[Rollout]) -> list[tuple[str, list[Rollout]]]:
    """``rollouts`` grouped by observer key, in order (an observer's rollouts are consecutive)."""
    groups: list[tuple[str, list[Rollout]]] = []
    for rollout in rollouts:
        if groups and groups[-1][0] == rollout.observer:
            groups[-1][1].append(rollout)
        else:
            groups.append((rollout.observer, [rollout]))
    return groups


def rows_by_env(records: list[tuple[torch.Tensor, list[int] | None]], run: list[Rollout]) -> list[torch.Tensor]:
    """The log-probabilities of each rollout of one observer's run, in step order, from its answered messages."""
    if not records:
        return [torch.empty(0) for _ in run]
    rows: dict[int, list[int]] = {}
    offset = 0
    for log_probs, envs in records:
        count = len(log_probs)
        for row, env in enumerate(range(count) if envs is None else envs):
            rows.setdefault(env, []).append(offset + row)
        offset += count
    flat = torch.cat([log_probs for log_probs, _ in records])
    return [flat[torch.tensor(rows.get(rollout.env, []), dtype=torch.long, device=flat.device)] for rollout in run]
