"""Parameter servers: a model's parameters, an optimizer and a version as an actor, sharded or not.

Trainers pull :class:`Parameters` from a :class:`ParameterServer`, compute
gradients and push them back; a :class:`ParameterClient` does both over every
shard of a sharded server at once (:func:`assign_shards` decides which
parameters each shard holds).
"""

from __future__ import annotations

from actorch._base.homes import claim as _claim
from actorch._stock.parameter_client import ParameterClient
from actorch._stock.parameter_server import Parameters, ParameterServer, assign_shards

__all__ = ["ParameterClient", "ParameterServer", "Parameters", "assign_shards"]

_claim(__name__, __all__, globals())
