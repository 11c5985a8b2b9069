"""Building a policy and sampling its actions: from probabilities or from logits, never an impossible action."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from actorch._stock.policies import build_policy, sample_categorical

DRAWS = 20_000


def draw(scores: torch.Tensor, *, logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator()
    generator.manual_seed(0)
    return sample_categorical(scores.expand(DRAWS, -1).contiguous(), generator, logits=logits)


@pytest.mark.parametrize("logits", [False, True])
def test_sample_categorical_draws_each_action_as_often_as_its_probability(logits: bool) -> None:
    probabilities = torch.tensor([[0.1, 0.0, 0.6, 0.3]])
    actions, log_probs = draw(probabilities.log() if logits else probabilities, logits=logits)
    shares = torch.bincount(actions, minlength=4) / DRAWS
    assert shares[1] == 0, "an action of probability 0 is never drawn"
    assert torch.allclose(shares, probabilities[0], atol=0.015)
    assert torch.allclose(log_probs, probabilities[0, actions].log())


def test_sample_categorical_takes_logits_of_any_offset() -> None:
    actions, log_probs = draw(torch.tensor([[1000.0, 1000.0 + torch.log(torch.tensor(3.0)).item()]]), logits=True)
    assert abs(float(actions.float().mean()) - 0.75) < 0.015
    assert torch.allclose(log_probs.exp(), torch.where(actions == 1, 0.75, 0.25), atol=1e-3)


def test_sample_categorical_keeps_the_graph_of_its_scores_for_learning() -> None:
    weight = torch.zeros(1, 2, requires_grad=True)
    for logits, scores in ((False, (weight + 1).softmax(dim=1)), (True, weight + 1)):
        _, log_probs = sample_categorical(scores, torch.Generator(), logits=logits)
        log_probs.sum().backward()
        assert weight.grad is not None
        weight.grad = None


def test_sample_categorical_is_the_same_under_the_same_seed() -> None:
    scores = torch.rand(64, 5)
    first, _ = draw(scores[:1], logits=False)
    second, _ = draw(scores[:1], logits=False)
    assert torch.equal(first, second)


def test_build_policy_draws_a_factorys_weights_under_the_seed() -> None:
    def factory() -> nn.Module:
        return nn.Linear(3, 2)

    first = build_policy(factory, torch.device("cpu"), seed=7)
    second = build_policy(factory, torch.device("cpu"), seed=7)
    assert torch.equal(first.weight, second.weight)
    with pytest.raises(TypeError, match=r"not a torch\.nn\.Module"):
        build_policy(lambda: 3, torch.device("cpu"))  # type: ignore[arg-type, return-value]
