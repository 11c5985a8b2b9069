"""The in-process transport: every rank in one process and one event loop (tests, ``world_size=1``).

Bundles are delivered on the same loop after the current iteration, in order,
still through the codec and the node's dispatch, so that in-process worlds run
the whole message path but the network.
"""

from __future__ import annotations

import os
import socket

from actorch._base.devices import accelerator
from actorch._transport.base import Bundle, NodeInfo, Transport

__all__ = ["InProcessHub", "InProcessTransport"]


class InProcessHub:
    """Connects in-process transports that share one event loop (tests, ``world_size=1``)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.transports: dict[int, InProcessTransport] = {}

    def __repr__(self) -> str:
        return f"<InProcessHub ranks={sorted(self.transports)}>"

    def transport(self, rank: int) -> InProcessTransport:
        """Create the transport of ``rank`` on this hub."""
        transport = InProcessTransport(self, rank)
        self.transports[rank] = transport
        return transport

    def disconnect(self, rank: int, why: str = "disconnected") -> None:
        """Cut ``rank`` off, as if its process died: every other rank sees it lost."""
        self.transports.pop(rank, None)
        for other in list(self.transports.values()):
            other._report_lost(rank, why)


class InProcessTransport(Transport):
    """Delivers bundles on the same loop, after the current iteration, in order."""

    def __init__(self, hub: InProcessHub, rank: int) -> None:
        super().__init__(rank, hub.world_size)
        self._hub = hub

    async def start(self) -> None:
        """Nothing to join: the hub is the world."""

    async def close(self) -> None:
        """Leave the hub; the others see this rank lost only if they still run."""
        if self._hub.transports.get(self.rank) is self:
            del self._hub.transports[self.rank]

    def peers(self) -> list[NodeInfo]:
        """Every rank of the hub, all in this process."""
        devices = accelerator().inventory()
        return [
            NodeInfo(rank, f"node{rank}", socket.gethostname(), os.getpid(), devices) for rank in range(self.world_size)
        ]

    def _send_bundle(self, dest: int, bundle: Bundle, in_context: bool) -> None:
        if self._hub.transports.get(self.rank) is not self:
            self._report_lost(dest, f"rank {dest} counts this node lost (it was cut off)")
            return
        target = self._hub.transports.get(dest)
        if target is None or target._receive is None:
            self._report_lost(dest, f"rank {dest} is not connected")
            return
        assert target._loop is not None
        target._loop.call_soon(target._receive, self.rank, bundle, None)
