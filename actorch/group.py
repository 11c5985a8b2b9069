"""Groups of actors: the same call to many actors at once, optionally split into parts and reduced.

An :class:`ActorGroup` sends one call to every member concurrently. A
:class:`Partitioner` (:func:`dim_partitioner`, :data:`batch_partitioner`)
splits the arguments into one part per member, and a reducer
(:func:`sum_reducer`, :func:`mean_reducer`) folds the replies into one.
Sending the same arguments to actors without a group is
:func:`actorch.broadcast`, part of the runtime.
"""

from __future__ import annotations

from actorch._base.homes import claim as _claim
from actorch._stock.group import ActorGroup
from actorch._stock.partitioners import Partitioner, batch_partitioner, dim_partitioner, mean_reducer, sum_reducer

__all__ = ["ActorGroup", "Partitioner", "batch_partitioner", "dim_partitioner", "mean_reducer", "sum_reducer"]

_claim(__name__, __all__, globals())
