"""What only some transports can do, each a protocol of its own, and asking a transport for one.

``Transport`` (``base``) is what every transport does: move bundles between
the ranks it knows. A world that nodes join while it runs (``Elastic``), torch's
own objects across nodes (``TorchInterop``: RRefs, the store process groups
meet in), a fast lane beside the main path (``FastLane``), links a path beside
the main one may share (``SharedLinks``, with the ``SidePath`` it takes) and
peers that can be cut off on purpose (``Severable``) are capabilities: a
transport has one by having its members, and a caller that needs one asks for
it once (``require_elastic``, ``require_torch_interop``, ``elastic_of``...), which
looks through the transports a wrapper wraps (``Transport.inner``) and raises
``UnsupportedError`` where none has it. The refusals are the messages below;
``{transport}`` in one is the outermost transport's class name.
"""

from __future__ import annotations

from collections.abc import Collection, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from actorch._base.errors import UnsupportedError

if TYPE_CHECKING:
    from actorch._transport.base import NodeInfo
    from actorch._transport.sequencing import LinkOrder

__all__ = [
    "NOT_ELASTIC",
    "NO_NEWCOMERS",
    "NO_RREFS",
    "NO_SHARED_STORE",
    "Elastic",
    "FastLane",
    "Severable",
    "SharedLinks",
    "SidePath",
    "TorchInterop",
    "elastic_of",
    "fast_lane_of",
    "is_elastic",
    "layers",
    "refusal",
    "require_elastic",
    "require_torch_interop",
    "severable_of",
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


class SidePath(Protocol):
    """A second path beside a transport's main one (the fast lane), as the main path meets the world with it."""

    name: str
    """The path's name, as the byte counters name it (``"lane"``)."""

    def open_beside(self, secret: bytes, host: str) -> Coroutine[Any, Any, str | None]:
        """Listen on ``host``, taking only peers that prove ``secret``; where it listens, for the node's ``NodeInfo``.

        Awaited on the node's loop, once the main path knows the world's secret
        and before it tells the others where this node is.
        """
        ...

    def met(self, info: NodeInfo) -> None:
        """Peer ``info`` was met (any thread): connect to it where its ``NodeInfo`` says its side path listens."""
        ...


@runtime_checkable
class SharedLinks(Protocol):
    """A transport whose links a path beside it shares: their order, the world's secret, the peers it meets.

    Every bundle of a link, on either path, carries the link's next number
    from ``links.next_seq`` (the side path advances it for what it sends); the
    receiver takes both paths' bundles in that order.
    """

    links: LinkOrder[Any]

    def put_beside(self, path: SidePath) -> None:
        """Run ``path`` beside the main one (before ``start``): it opens with the world, and meets every peer."""
        ...

    def arrived_beside(self, src: int, seq: int, messages: list[bytes]) -> None:
        """A bundle numbered ``seq`` came from ``src`` on the side path (on the loop): taken in link order."""
        ...

    def lose(self, rank: int, why: str) -> None:
        """The side path saw ``rank`` lost (on the loop): the main path counts it lost too, and reports it."""
        ...


@runtime_checkable
class Severable(Protocol):
    """Peers a transport can be cut off from on purpose, liveness included, as a network partition would."""

    def sever(self, ranks: Collection[int]) -> None:
        """Stop hearing ``ranks`` and pinging them (any thread): silent, they are lost past the liveness timeout.

        Their processes are judged by silence alone, as if on another network
        (a process of this machine is not spared for running).
        """
        ...

    def heal(self, ranks: Collection[int]) -> None:
        """Hear ``ranks`` again (any thread), those not lost meanwhile."""
        ...


def layers(transport: object) -> Iterator[object]:
    """``transport``, then the transport it wraps, and so on (a wrapper says what it wraps in ``inner``)."""
    layer: object | None = transport
    while layer is not None:
        yield layer
        layer = getattr(layer, "inner", None)


def _find(transport: object, capability: Any) -> Any:
    """The outermost of ``transport``'s layers that has ``capability`` (a protocol above), or None."""
    for layer in layers(transport):
        if isinstance(layer, capability):
            return layer
    return None


def elastic_of(transport: object) -> Elastic | None:
    """``transport``'s layer that is an elastic world, if any (public or private)."""
    found: Elastic | None = _find(transport, Elastic)
    return found


def fast_lane_of(transport: object) -> FastLane | None:
    """``transport``'s layer that runs a fast lane, if any."""
    found: FastLane | None = _find(transport, FastLane)
    return found


def severable_of(transport: object) -> Severable | None:
    """``transport``'s layer that can be cut off from peers on purpose, if any."""
    found: Severable | None = _find(transport, Severable)
    return found


def refusal(transport: object, message: str) -> UnsupportedError:
    """The error for ``transport`` lacking what ``message`` (one of the refusals above) says."""
    return UnsupportedError(message.format(transport=type(transport).__name__))


def require_elastic(transport: object, message: str = NO_NEWCOMERS) -> Elastic:
    """``transport`` as an elastic world (a layer of it); ``UnsupportedError`` with ``message`` if it is not one."""
    found = elastic_of(transport)
    if found is not None:
        return found
    raise refusal(transport, message)


def require_torch_interop(transport: object, message: str = NO_RREFS) -> TorchInterop:
    """``transport`` (a layer of it) carrying torch's objects; ``UnsupportedError`` with ``message`` if none does."""
    found: TorchInterop | None = _find(transport, TorchInterop)
    if found is not None:
        return found
    raise refusal(transport, message)


def is_elastic(transport: object) -> bool:
    """Whether any process with the join token may join ``transport``'s world (``run(..., elastic=True)``)."""
    found = elastic_of(transport)
    return found is not None and found.public
