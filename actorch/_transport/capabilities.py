"""What only some transports can do, each a protocol of its own, and asking a transport for one.

``Transport`` (``base``) is what every transport does: move bundles between
the ranks it knows. A world that nodes join while it runs (``Elastic``), torch's
own objects across nodes (``TorchInterop``: RRefs, the store process groups
meet in) and a fast lane beside the main path (``FastLane``) are capabilities:
a transport has one by having its members, and a caller that needs one asks
for it once (``require_elastic``, ``require_torch_interop``), which raises
``UnsupportedError`` where the transport lacks it. The refusals are the
messages below; ``{transport}`` in one is the transport's class name.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from actorch._base.errors import UnsupportedError

__all__ = [
    "NOT_ELASTIC",
    "NO_NEWCOMERS",
    "NO_RREFS",
    "NO_SHARED_STORE",
    "Elastic",
    "FastLane",
    "TorchInterop",
    "is_elastic",
    "refusal",
    "require_elastic",
    "require_torch_interop",
]

NOT_ELASTIC = "only an elastic system takes new nodes (run(..., elastic=True))"
"""Asked what joining takes, of a world that not just any process may join."""

NO_NEWCOMERS = "a world on {transport} takes no new nodes"
"""Asked to let in the node processes a system starts, of a world that cannot grow."""

NO_RREFS = "torch RRefs need the torch RPC transport; this node runs on {transport}"
"""Asked for a torch RRef, of a transport that is not torch RPC (or not yet)."""

NO_SHARED_STORE = "a store shared by the nodes needs the torch RPC transport; this node runs on {transport}"
"""Asked for the store process groups meet in, of a transport that is not torch RPC (or not yet)."""


@runtime_checkable
class Elastic(Protocol):
    """A world that nodes join while it runs (rank 0 admits them, checking a join token) and leave."""

    public: bool
    """Whether any process with the token may join (``run(..., elastic=True)``), or only those the system starts."""

    def join_env(self) -> dict[str, str]:
        """The environment a process needs to join this world (rank 0 of a public world only)."""
        ...

    async def invitation(self) -> tuple[str, str]:
        """Where and with which token the processes this node starts join the world: ``(host:port, token)``."""
        ...

    def stop_admitting(self) -> None:
        """Take no more nodes into the world (the system is ending)."""
        ...


@runtime_checkable
class TorchInterop(Protocol):
    """torch's own distributed objects across the nodes: RRefs, and the store the nodes met in."""

    def make_rref(self, value: Any) -> Any:
        """A torch RRef owned by this rank holding ``value``."""
        ...

    def shared_store(self) -> Any:
        """The ``torch.distributed`` store every rank of the world reaches (for process groups)."""
        ...


@runtime_checkable
class FastLane(Protocol):
    """A second path beside the transport's main one, for bundles that carry no tensors of their own."""

    lane_bundles_sent: int
    """Bundles sent on the fast lane (they count among ``bundles_sent`` too)."""


def refusal(transport: object, message: str) -> UnsupportedError:
    """The error for ``transport`` lacking what ``message`` (one of the refusals above) says."""
    return UnsupportedError(message.format(transport=type(transport).__name__))


def require_elastic(transport: object, message: str = NO_NEWCOMERS) -> Elastic:
    """``transport`` as an elastic world; ``UnsupportedError`` with ``message`` if it is not one."""
    if isinstance(transport, Elastic):
        return transport
    raise refusal(transport, message)


def require_torch_interop(transport: object, message: str = NO_RREFS) -> TorchInterop:
    """``transport`` as one that carries torch's own objects; ``UnsupportedError`` with ``message`` if it does not."""
    if isinstance(transport, TorchInterop):
        return transport
    raise refusal(transport, message)


def is_elastic(transport: object) -> bool:
    """Whether any process with the join token may join ``transport``'s world (``run(..., elastic=True)``)."""
    return isinstance(transport, Elastic) and transport.public
