"""A system of one node that goes on torch RPC only when it first starts another node process.

``actorch.run(main)`` with one process needs no network: its node talks to
itself, and same-node calls never reach a transport. Asked for a node process
(``add_nodes``, ``Where(process="own")``), it must become rank 0 of a world that
grows. :class:`LoneTransport` is that node: alone, it sends nothing; on the
first :meth:`invitation` it starts the elastic torch RPC transport the launcher
describes, hands it what the node attached, and from then on passes every
bundle through to it. Until then it costs nothing: no port, no thread.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any

import torch

from actorch._base.channels.route import TensorRoute
from actorch._base.devices import accelerator
from actorch._base.errors import UnsupportedError
from actorch._transport.base import Bundle, NodeInfo, Port, Transport
from actorch._transport.capabilities import (
    NO_RREFS,
    NO_SHARED_STORE,
    NOT_ELASTIC,
    refusal,
    require_elastic,
    require_torch_interop,
)

__all__ = ["LoneTransport"]


class LoneTransport(Transport):
    """Rank 0 alone, until it opens an elastic world (``opener`` makes its transport) for the nodes it starts.

    It is ``Elastic`` (private: only the processes it starts join) and
    ``TorchInterop`` once its world is open; ``opener`` makes that world's
    transport (an ``ElasticRpcTransport``, the fast lane beside it or not).
    """

    public = False

    def __init__(self, opener: Callable[[], Transport]) -> None:
        super().__init__(0, 1)
        self._opener = opener
        self._world: Transport | None = None
        self._opening: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<LoneTransport {'alone' if self._world is None else repr(self._world)}>"

    @property
    def world(self) -> Transport | None:
        """The torch RPC transport, once opened."""
        return self._world

    @property
    def inner(self) -> Transport | None:
        """The transport this one passes everything to, once its world is open (capabilities look there)."""
        return self._world

    async def start(self) -> None:
        """Nothing to join: the node is alone."""

    def join_env(self) -> dict[str, str]:
        """Never: only the node processes this system starts may join its world."""
        raise UnsupportedError(NOT_ELASTIC)

    async def invitation(self) -> tuple[str, str]:
        """Open the world on first use (torch RPC starts), then answer as its rank 0 does."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        await asyncio.shield(self._opening)
        assert self._world is not None
        return await require_elastic(self._world).invitation()

    async def _open(self) -> None:
        world = self._opener()
        world.traits = self.traits
        assert self._loop is not None
        assert self._receive is not None
        assert self._lost is not None
        world.attach(self._loop, self._receive, self._lost)
        world.on_joined = self._joined
        world.lost_in_thread = self.lost_in_thread
        world.off_loop = self.off_loop
        # One set of byte counters: bundles leave through this transport's dispatch but arrive through the world.
        self.bytes_sent_by_path = world.bytes_sent_by_path
        self.bytes_received_by_path = world.bytes_received_by_path
        await world.start()
        self._world = world

    def ask_off_loop(self, rank: int, question: str, timeout: float) -> Any:
        """As the opened world's; alone, node 0 answers its own question."""
        if self._world is not None:
            return self._world.ask_off_loop(rank, question, timeout)
        if rank != self.rank or self.off_loop is None:
            raise ConnectionError(f"rank {rank} is not connected")
        return self.off_loop(question)

    def _joined(self, info: NodeInfo) -> None:
        self.world_size = self._world.world_size if self._world is not None else self.world_size
        if self.on_joined is not None:
            self.on_joined(info)

    async def close(self) -> None:
        """Leave the world, if it was opened."""
        if self._opening is not None and not self._opening.done():
            await asyncio.wait([self._opening])
        if self._world is not None:
            await self._world.close()

    def peers(self) -> list[NodeInfo]:
        """This node alone, or every node of the opened world."""
        if self._world is not None:
            return self._world.peers()
        return [self.traits.info(0, socket.gethostname(), os.getpid(), accelerator().inventory())]

    def peer(self, rank: int) -> NodeInfo:
        """Node ``rank`` (``KeyError`` if it is not a node of the world)."""
        if self._world is not None:
            return self._world.peer(rank)
        return super().peer(rank)

    def knows(self, rank: int) -> bool:
        """Whether ``rank`` is a node of the opened world (none before)."""
        return self._world is not None and self._world.knows(rank)

    def forget(self, rank: int) -> None:
        """Node ``rank`` left the world on purpose."""
        if self._world is not None:
            self._world.forget(rank)
            self.world_size = self._world.world_size

    def backlog(self, dest: int) -> int:
        """What waits for this iteration's bundle, and what the opened world has not seen taken."""
        waiting = self._queued.get(dest, 0)
        return waiting if self._world is None else waiting + self._world.backlog(dest)

    def path(self, dest: int, tensors: bool) -> str:
        """The opened world's path to ``dest`` (alone: none)."""
        return self._world.path(dest, tensors) if self._world is not None else "none"

    def port_for(self, port: Port | None, tensors: list[torch.Tensor] | None) -> Port | None:
        """As the opened world says."""
        return self._world.port_for(port, tensors) if self._world is not None else port

    def route(self, dest: int) -> TensorRoute | None:
        """How tensors reach ``dest`` (staged: an elastic world has no device maps)."""
        return self._world.route(dest) if self._world is not None else None

    def make_rref(self, value: Any) -> Any:
        """A torch RRef, once the world is on torch RPC."""
        if self._world is None:
            raise refusal(self, NO_RREFS)
        return require_torch_interop(self._world).make_rref(value)

    def shared_store(self) -> Any:
        """The opened world's store."""
        if self._world is None:
            raise refusal(self, NO_SHARED_STORE)
        return require_torch_interop(self._world).shared_store()

    def stop_admitting(self) -> None:
        """Take no more nodes (the system is ending)."""
        if self._world is not None:
            require_elastic(self._world).stop_admitting()

    def _send_bundle(self, dest: int, bundle: Bundle, in_context: bool) -> str | None:
        if self._world is None:
            self._report_lost(dest, f"rank {dest} is not a node of this world")
            return None
        return self._world.carry(dest, bundle, in_context)
