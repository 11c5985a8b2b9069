"""Opening a node's transport: the kinds of transport there are, and the one function every launch path calls.

Transports are plug-ins. Each kind is a package or module of its own with a
function that turns a ``TransportSpec`` into one of its transports, not yet
started; ``KINDS`` names them. The launch layer never names a transport class:
it describes the node's place in the world and calls :func:`open_transport`.
"""

from __future__ import annotations

from collections.abc import Callable

from actorch._transport.base import Transport, TransportSpec
from actorch._transport.torch_rpc.plugin import open_torch_rpc

__all__ = ["DEFAULT_KIND", "KINDS", "Opener", "open_transport"]

Opener = Callable[[TransportSpec], Transport]
"""A kind's way to open one of its transports (not yet started) from a spec."""

KINDS: dict[str, Opener] = {
    "torch_rpc": open_torch_rpc,
}
"""Every kind of transport a launch can open, by name."""

DEFAULT_KIND = "torch_rpc"
"""The kind every launch opens: torch RPC (TensorPipe), with the fast lane beside it."""


def open_transport(spec: TransportSpec, kind: str = DEFAULT_KIND) -> Transport:
    """The transport of kind ``kind`` that ``spec`` describes, not yet started.

    Raises:
        ValueError: No transport of that kind.
    """
    opener = KINDS.get(kind)
    if opener is None:
        raise ValueError(f"no transport of kind {kind!r} (there are: {', '.join(sorted(KINDS))})")
    return opener(spec)
