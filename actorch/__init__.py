"""actorch: an asyncio actor runtime for PyTorch over ``torch.distributed.rpc``.

Define ``Actor`` subclasses with ``async`` methods, start a system with
:func:`run` (or :func:`start` from a running event loop, such as a notebook's),
spawn actors on any rank by name, and ``await ref.call(...)`` them.
"""

# This module is the facade: users import actorch (and actorch.testing), never
# the private subpackages, one per layer, each importing only from those above
# it in this list (tests/test_layers.py holds that, and docs/architecture.md
# walks one call through them):
#
#   _base/       errors, names, deadlines, the codec (msgpack's one home), tensor files, options
#   _transport/  moving message bundles between ranks: the interface, in-process,
#                torch RPC (torch.distributed.rpc's one home), distributed autograd contexts,
#                the thread bridge, interfaces
#   _engine/     one node's message engine: wire format, flow control, cells (mailboxes),
#                batched endpoints, the caller and callee sides, and the Node composing them
#   _actors/     Actor, ActorRef, the ActorHost of a node's actors, supervision, the
#                registry, membership events, the node service, and the ActorSystem handle
#   _launch/     run(), start(), connect(): processes, torchrun, the bounded event loop and watchdog, logging
#   _stock/      ready-made actors, written only against the public names below

from __future__ import annotations

import os as _os
import types as _types

# torch's C++ warnings ("[W] ...") go to stderr unless this is set before torch loads.
_os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from actorch._actors.actor import Actor
from actorch._actors.broadcast import broadcast, broadcast_tell
from actorch._actors.events import NameRegistered, NameRemoved, NodeJoined, NodeLeft, NodeLost
from actorch._actors.ref import ActorRef
from actorch._actors.restart import ActorExit, Restart
from actorch._actors.system import ActorSystem, MembershipEvent, NodeInfo
from actorch._actors.where import Where
from actorch._base.codec import serializable
from actorch._base.errors import (
    ActorchError,
    ActorNotFoundError,
    ActorStoppedError,
    EndpointError,
    GroupError,
    InvalidNameError,
    JoinError,
    MailboxFullError,
    MessageTooLargeError,
    NameTakenError,
    NodeLostError,
    PlacementError,
    RemoteError,
    SerializationError,
    SnapshotError,
    SystemClosedError,
    UnsupportedError,
)
from actorch._base.names import MAX_NAME_LENGTH
from actorch._base.tensorfile import load_tensors, save_tensors
from actorch._engine.batching import Batched, batched
from actorch._engine.streaming import DEFAULT_STREAM_WINDOW, Stream
from actorch._launch.connect import connect
from actorch._launch.options import SystemOptions
from actorch._launch.run import run
from actorch._launch.serving import serve
from actorch._launch.start import start
from actorch._stock.agent import Agent, EpisodeStats
from actorch._stock.batch import Batch
from actorch._stock.collection import Collection
from actorch._stock.collector import Collector
from actorch._stock.group import ActorGroup
from actorch._stock.observer import Observer, Rollout
from actorch._stock.parameter_client import ParameterClient
from actorch._stock.parameter_server import Parameters, ParameterServer, assign_shards
from actorch._stock.partitioners import Partitioner, batch_partitioner, dim_partitioner, mean_reducer, sum_reducer
from actorch._stock.prioritized_replay import PrioritizedReplayBuffer
from actorch._stock.replay import ReplayBuffer, Sample
from actorch._stock.sharded_replay import ShardedReplayBuffer
from actorch._transport.autograd import in_autograd_context

__all__ = [
    "DEFAULT_STREAM_WINDOW",
    "MAX_NAME_LENGTH",
    "Actor",
    "ActorExit",
    "ActorGroup",
    "ActorNotFoundError",
    "ActorRef",
    "ActorStoppedError",
    "ActorSystem",
    "ActorchError",
    "Agent",
    "Batch",
    "Batched",
    "Collection",
    "Collector",
    "EndpointError",
    "EpisodeStats",
    "GroupError",
    "InvalidNameError",
    "JoinError",
    "MailboxFullError",
    "MembershipEvent",
    "MessageTooLargeError",
    "NameRegistered",
    "NameRemoved",
    "NameTakenError",
    "NodeInfo",
    "NodeJoined",
    "NodeLeft",
    "NodeLost",
    "NodeLostError",
    "Observer",
    "ParameterClient",
    "ParameterServer",
    "Parameters",
    "Partitioner",
    "PlacementError",
    "PrioritizedReplayBuffer",
    "RemoteError",
    "ReplayBuffer",
    "Restart",
    "Rollout",
    "Sample",
    "SerializationError",
    "ShardedReplayBuffer",
    "SnapshotError",
    "Stream",
    "SystemClosedError",
    "SystemOptions",
    "UnsupportedError",
    "Where",
    "assign_shards",
    "batch_partitioner",
    "batched",
    "broadcast",
    "broadcast_tell",
    "connect",
    "dim_partitioner",
    "in_autograd_context",
    "load_tensors",
    "mean_reducer",
    "run",
    "save_tensors",
    "serializable",
    "serve",
    "start",
    "sum_reducer",
]

for _name in __all__:
    _public = globals()[_name]
    if isinstance(_public, (type, _types.FunctionType)):
        _public.__module__ = __name__  # they print as actorch.ActorRef, as users name them
del _name, _public
