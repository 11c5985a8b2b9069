"""A tiny deterministic environment with Gymnasium's interface, for the Agent and Observer tests.

The walker starts at 0 of a corridor of ``length`` cells. Action 1 steps right
and earns 1, action 0 stays and earns 0; the episode ends after ``length``
steps (terminated once the walker reaches the end, truncated otherwise). The
best policy always steps right and earns ``length`` per episode.
"""

from __future__ import annotations

import random
from typing import Any

import numpy
import torch
from torch import nn


class Corridor:
    """Gymnasium-style ``reset``/``step``; the observation is ``[position / length, 1]``."""

    def __init__(self, length: int = 8, fail_at: int | None = None) -> None:
        self.length = length
        self.fail_at = fail_at
        self.position = 0
        self.steps = 0
        self.resets = 0
        self.seeds: list[int | None] = []

    def reset(self, seed: int | None = None) -> tuple[list[float], dict[str, Any]]:
        self.position = 0
        self.steps = 0
        self.resets += 1
        self.seeds.append(seed)
        return self.observe(), {}

    def step(self, action: Any) -> tuple[list[float], float, bool, bool, dict[str, Any]]:
        if action not in (0, 1):
            raise ValueError(f"Corridor takes action 0 or 1, not {action!r}")
        self.steps += 1
        if self.fail_at is not None and self.steps == self.fail_at:
            raise RuntimeError(f"the corridor collapsed at step {self.steps}")
        self.position += int(action)
        terminated = self.position >= self.length
        truncated = not terminated and self.steps >= self.length
        return self.observe(), float(action), terminated, truncated, {}

    def observe(self) -> list[float]:
        return [self.position / self.length, 1.0]


def corridor() -> Corridor:
    """The default corridor, for an import path."""
    return Corridor()


def broken_corridor() -> Corridor:
    """A corridor whose third step raises."""
    return Corridor(fail_at=3)


class Drift:
    """A seeded environment whose episodes differ in length and rewards with the seed (and the actions).

    ``reset(seed)`` reseeds its generator; each step earns a drawn reward plus
    the action, and the episode ends after a drawn 3 to 6 steps (terminated on
    an even length, truncated on an odd one). Given the same seed and actions,
    it plays the same episodes.
    """

    def __init__(self) -> None:
        self.random = random.Random()
        self.left = 0
        self.position = 0.0

    def reset(self, seed: int | None = None) -> tuple[list[float], dict[str, Any]]:
        if seed is not None:
            self.random.seed(seed)
        self.left = self.random.randint(3, 6)
        self.length = self.left
        self.position = self.random.random()
        return [self.position, 1.0], {}

    def step(self, action: Any) -> tuple[list[float], float, bool, bool, dict[str, Any]]:
        self.left -= 1
        self.position += int(action) - 0.5
        reward = round(self.random.random(), 3) + int(action)
        ended = self.left == 0
        return [self.position, 1.0], reward, ended and self.length % 2 == 0, ended and self.length % 2 == 1, {}


def drift() -> Drift:
    return Drift()


class Pixels:
    """Observations of uint8 frames (2 x 3), as pixel environments give them; a step changes one pixel."""

    def __init__(self) -> None:
        self.frame = numpy.zeros((2, 3), dtype=numpy.uint8)

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        self.frame[:] = 0
        return self.frame.copy(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.frame[0, 0] += 1 + int(action)
        return self.frame.copy(), 1.0, False, False, {}


class FramePolicy(nn.Module):
    """Casts the uint8 frames in its forward, as a pixel policy does: the batch keeps them uint8."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 2)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        assert frames.dtype == torch.uint8
        return self.linear(frames.flatten(1).float() / 255)
