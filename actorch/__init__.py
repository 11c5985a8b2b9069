"""actorch: an asyncio actor runtime for PyTorch over ``torch.distributed.rpc``.

Define ``Actor`` subclasses with ``async`` methods, start a system with
:func:`run` (or :func:`start` from a running event loop, such as a notebook's),
spawn actors on any rank by name, and ``await ref.call(...)`` them.
"""

# This module is the facade: users import actorch (and actorch.testing), never
# the private subpackages, one per layer, each importing only from those above
# it in this list (tests/project/test_layers.py holds that, and docs/architecture.md
# walks one call through them):
#
#   _base/       errors, names, deadlines, the codec (msgpack's one home), tensor files, options
#   _transport/  moving message bundles between ranks: the interface, the table of kinds
#                (torch RPC, torch.distributed.rpc's one home; in-process; faulty), the fast
#                lane, distributed autograd contexts, the thread bridge, interfaces
#   _engine/     one node's message engine: wire format, flow control, cells (mailboxes),
#                batched endpoints, the caller and callee sides, and the Node composing them
#   _actors/     Actor, ActorRef, the ActorHost of a node's actors, supervision, the
#                registry, membership events, the node service, and the ActorSystem handle
#   _launch/     the options (options/), the running system's status, runtime files and logs
#                (services/), run(), start(), connect() and serve() with their processes and
#                bounded end (world/), and the actorch command (cli/)
#   _stock/      ready-made actors, written only against the public names below; users
#                import them from the public submodules that re-export them by role:
#                actorch.rl, actorch.replay, actorch.params and actorch.group

from __future__ import annotations

import importlib as _importlib
import os as _os
import typing as _typing
import warnings as _warnings

# torch's C++ warnings ("[W] ...") go to stderr unless this is set before torch loads.
_os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from actorch import group as group  # the stock actors' public homes, loaded with the package
from actorch import params as params
from actorch import replay as replay
from actorch import rl as rl
from actorch._actors.actor import Actor
from actorch._actors.broadcast import broadcast, broadcast_tell
from actorch._actors.events import NameRegistered, NameRemoved, NodeJoined, NodeLeft, NodeLost
from actorch._actors.ref import ActorRef
from actorch._actors.restart import ActorExit, Restart
from actorch._actors.system import ActorSystem, MembershipEvent, NodeInfo
from actorch._actors.where import Where
from actorch._base.channels.leases import Lease, lease
from actorch._base.codec import Shared, serializable, shared
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
    TraceRunningError,
    UnsupportedError,
    remote_error_of,
)
from actorch._base.homes import claim as _claim
from actorch._base.names import MAX_NAME_LENGTH
from actorch._base.tensorfile import load_tensors, save_tensors
from actorch._base.version import version_of as _version_of
from actorch._engine.batching import Batched, batched
from actorch._engine.log_context import add_call_context
from actorch._engine.streaming import DEFAULT_STREAM_WINDOW, Stream
from actorch._launch.options.system_options import SystemOptions
from actorch._launch.world.connect import connect
from actorch._launch.world.run import run
from actorch._launch.world.serving import serve
from actorch._launch.world.start import start
from actorch._transport.autograd import in_autograd_context
from actorch._transport.torch_rpc.options import TorchRpc
from actorch.params import ParameterServer
from actorch.replay import ReplayBuffer
from actorch.rl import Agent, Observer

__version__ = _version_of("actorch")

__all__ = [
    "DEFAULT_STREAM_WINDOW",
    "MAX_NAME_LENGTH",
    "Actor",
    "ActorExit",
    "ActorNotFoundError",
    "ActorRef",
    "ActorStoppedError",
    "ActorSystem",
    "ActorchError",
    "Agent",
    "Batched",
    "EndpointError",
    "GroupError",
    "InvalidNameError",
    "JoinError",
    "Lease",
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
    "ParameterServer",
    "PlacementError",
    "RemoteError",
    "ReplayBuffer",
    "Restart",
    "SerializationError",
    "Shared",
    "SnapshotError",
    "Stream",
    "SystemClosedError",
    "SystemOptions",
    "TorchRpc",
    "TraceRunningError",
    "UnsupportedError",
    "Where",
    "add_call_context",
    "batched",
    "broadcast",
    "broadcast_tell",
    "connect",
    "in_autograd_context",
    "lease",
    "load_tensors",
    "remote_error_of",
    "run",
    "save_tensors",
    "serializable",
    "serve",
    "shared",
    "start",
]

_claim(__name__, __all__, globals())  # they print as actorch.ActorRef, as users name them

_MOVED = {
    **dict.fromkeys(
        ["ActorGroup", "Partitioner", "batch_partitioner", "dim_partitioner", "mean_reducer", "sum_reducer"], "group"
    ),
    **dict.fromkeys(["ParameterClient", "Parameters", "assign_shards"], "params"),
    **dict.fromkeys(["PrioritizedReplayBuffer", "Sample", "ShardedReplayBuffer"], "replay"),
    **dict.fromkeys(["Batch", "Collection", "Collector", "EpisodeStats", "Rollout"], "rl"),
}
"""Stock names that ``actorch`` exported before they moved to a public submodule, and that submodule."""

if not _typing.TYPE_CHECKING:  # type checkers see only the current names, so they point users to the new homes

    def __getattr__(name: str) -> object:
        """A stock name's old spelling ``actorch.X``: the object at its new home, with a ``DeprecationWarning``."""
        home = _MOVED.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        _warnings.warn(
            f"actorch.{name} has moved to actorch.{home}.{name}; import it from actorch.{home}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_importlib.import_module(f"{__name__}.{home}"), name)
