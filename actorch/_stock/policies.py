"""What the stock RL actors share about a policy: building it on its node, and sampling its actions.

The agent (policy on the learner) and the collector (a copy of the policy on
each worker) both take a module, a function building one, or its import path,
and both sample one action per state from the action probabilities (or the
logits) the policy returns.
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


def sample_categorical(
    scores: torch.Tensor, generator: torch.Generator, *, logits: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """One action per row of ``scores`` (``[batch, actions]``), drawn with ``generator``; ``(actions, log_probs)``.

    ``scores`` are probabilities, or logits if ``logits`` is set (a softmax
    away from them). The draw is the Gumbel-max one (``argmax(p / e)`` with
    ``e`` exponential), a handful of tensor operations per batch of states: the
    collector's loop runs it every step. ``log_probs`` keep the graph of
    ``scores``, for a learner that acts and learns in one forward.
    """
    noise = torch.empty_like(scores, requires_grad=False).exponential_(generator=generator)
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)  # a draw of 0 would pick an action of probability 0
    if logits:
        log_probs = torch.log_softmax(scores, dim=1)
        actions = (log_probs.detach() - noise.log_()).argmax(dim=1, keepdim=True)
        return actions.squeeze(1), log_probs.gather(1, actions).squeeze(1)
    actions = (scores.detach() / noise).argmax(dim=1, keepdim=True)
    return actions.squeeze(1), scores.gather(1, actions).log().squeeze(1)
