"""What the stock RL actors share about a policy: building it on its node, and sampling its actions.

The agent (policy on the learner) and the collector (a copy of the policy on
each worker) both take a module, a function building one, or its import path,
and both sample one action per state from the action probabilities the
policy returns.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from actorch._stock.import_paths import resolve

__all__ = ["PolicyFactory", "build_policy", "sample_categorical"]

PolicyFactory = nn.Module | Callable[[], nn.Module] | str
"""A policy: the module itself, a function building it, or that function's ``"module:function"`` path."""


def build_policy(policy: PolicyFactory, device: torch.device, seed: int | None = None) -> nn.Module:
    """The policy module on ``device``; a factory's weights are drawn on the CPU under ``seed``.

    Drawing on the CPU and then moving makes the initial weights the same on
    every device; the global generator's state is left as it was.
    """
    if isinstance(policy, nn.Module):
        module = policy
    else:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.default_generator.manual_seed(seed)
            module = resolve(policy, "policy factory")()
        if not isinstance(module, nn.Module):
            raise TypeError(f"the policy factory returned a {type(module).__qualname__}, not a torch.nn.Module")
    return module.to(device)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One action per row of ``probs`` (``[batch, actions]``), drawn with ``generator``; ``(actions, log_probs)``."""
    actions = torch.multinomial(probs.detach(), 1, generator=generator).squeeze(1)
    log_probs = torch.log(probs.gather(1, actions.unsqueeze(1)).squeeze(1).clamp_min(1e-12))
    return actions, log_probs
