"""Replay buffers as actors: uniform and prioritized sampling, one buffer sharded over several nodes.

A :class:`ReplayBuffer` keeps transitions (dicts of tensors) and answers
:class:`Sample` objects; a :class:`PrioritizedReplayBuffer` samples in proportion
to priorities; a :class:`ShardedReplayBuffer` is a client that spreads one
buffer over several buffer actors.
"""

from __future__ import annotations

from actorch._base.homes import claim as _claim
from actorch._stock.prioritized_replay import PrioritizedReplayBuffer
from actorch._stock.replay import ReplayBuffer, Sample
from actorch._stock.sharded_replay import ShardedReplayBuffer

__all__ = ["PrioritizedReplayBuffer", "ReplayBuffer", "Sample", "ShardedReplayBuffer"]

_claim(__name__, __all__, globals())
