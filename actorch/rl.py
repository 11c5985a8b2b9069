"""Reinforcement learning: agents and observers, collectors and what they send.

Two designs of collection. In one, an :class:`Agent` owns the policy and
answers the states its :class:`Observer` actors send with actions, then learns
from their :class:`Rollout` objects (:class:`EpisodeStats` says how an episode
went). In the other, each :class:`Collector` plays its environments with its
own copy of the policy and sends :class:`Batch` objects, which the learner reads
from a :class:`Collection`.
"""

from __future__ import annotations

from actorch._base.homes import claim as _claim
from actorch._stock.agent import Agent, EpisodeStats
from actorch._stock.batch import Batch
from actorch._stock.collection import Collection
from actorch._stock.collector import Collector
from actorch._stock.observer import Observer, Rollout

__all__ = ["Agent", "Batch", "Collection", "Collector", "EpisodeStats", "Observer", "Rollout"]

_claim(__name__, __all__, globals())
