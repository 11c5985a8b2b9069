"""Model factories the multi-process scripts hand to parameter servers by import path."""

from __future__ import annotations

import torch
from torch import nn


def tiny_model() -> nn.Module:
    """Two linear layers with fixed initial weights."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
