"""``Wrapper``: a transport that wraps another, forwarding what it does not change.

The fast lane (``lane``) and fault injection (``faulty``) are transports of
their own that sit on another one: the node talks to the wrapper, and the
wrapper decides what reaches the transport it wraps (``inner``), and when.
This base forwards the rest: joining and leaving the world, its peers and
routes, the hooks the node and the launch set, the questions asked off the
loop (the hooks are the wrapped transport's, since its threads call them).
Byte counters by path are shared with the wrapped transport, so the
node reads one set whichever layer carried a bundle. What a capability needs
(``capabilities``) is looked for through the layers, so a wrapper need not
repeat the wrapped transport's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from actorch._transport.base import LostFn, NodeInfo, Port, ReceiveFn, Transport

if TYPE_CHECKING:
    from actorch._base.channels.route import TensorRoute

__all__ = ["Wrapper"]


class Wrapper(Transport):
    """Wraps ``inner``: subclasses implement ``_send_bundle`` (sending through ``inner.carry`` when they send)."""

    def __init__(self, inner: Transport, paths: tuple[str, ...] | None = None) -> None:
        self.inner = inner
        """The transport this one wraps."""
        self.paths = inner.paths if paths is None else paths
        super().__init__(inner.rank, inner.world_size)
        for counters in (inner.bytes_sent_by_path, inner.bytes_received_by_path):
            for path in self.paths:
                counters.setdefault(path, 0)
        self.bytes_sent_by_path = inner.bytes_sent_by_path
        self.bytes_received_by_path = inner.bytes_received_by_path
        self.traits = inner.traits

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {self.inner!r}>"

    @property  # the wrapped world's size: an elastic one changes it
    def world_size(self) -> int:
        """Ranks of the world, as the wrapped transport knows them."""
        return self.inner.world_size

    @world_size.setter
    def world_size(self, value: int) -> None:
        self.inner.world_size = value

    def attach(self, loop: asyncio.AbstractEventLoop, receive: ReceiveFn, lost: LostFn) -> None:
        """Route the wrapped transport's incoming bundles to ``receive``, and its peer loss through ``_inner_lost``."""
        super().attach(loop, receive, lost)
        self.inner.attach(loop, receive, self._inner_lost)

    def _inner_lost(self, rank: int, why: str) -> None:
        """The wrapped transport lost ``rank``: report it (a wrapper that keeps state of its peers adds to this)."""
        self._report_lost(rank, why)

    # The hooks the node and the launch set are the wrapped transport's, whenever they are set:
    # its threads call them (a launch sets ``off_loop`` once the node has started).

    @property
    def on_joined(self) -> Callable[[NodeInfo], None] | None:
        """The wrapped transport's ``on_joined``."""
        return self.inner.on_joined

    @on_joined.setter
    def on_joined(self, hook: Callable[[NodeInfo], None] | None) -> None:
        self.inner.on_joined = hook

    @property
    def off_loop(self) -> Callable[[str], Any] | None:
        """The wrapped transport's ``off_loop``."""
        return self.inner.off_loop

    @off_loop.setter
    def off_loop(self, hook: Callable[[str], Any] | None) -> None:
        self.inner.off_loop = hook

    @property
    def lost_in_thread(self) -> LostFn | None:
        """The wrapped transport's ``lost_in_thread``."""
        return self.inner.lost_in_thread

    @lost_in_thread.setter
    def lost_in_thread(self, hook: LostFn | None) -> None:
        self.inner.lost_in_thread = hook

    async def start(self) -> None:
        """Join the world through the wrapped transport, which says what this node says of itself."""
        self.inner.traits = self.traits
        await self.inner.start()

    async def close(self) -> None:
        """Leave the world through the wrapped transport (what is queued here leaves first)."""
        self._flush()
        await self.inner.close()

    def peers(self) -> list[NodeInfo]:
        """Every rank of the world, as the wrapped transport knows them."""
        return self.inner.peers()

    def peer(self, rank: int) -> NodeInfo:
        """Node ``rank``, as the wrapped transport knows it (``KeyError`` if it is not a node of the world)."""
        return self.inner.peer(rank)

    def knows(self, rank: int) -> bool:
        """Whether the wrapped transport takes messages from ``rank``."""
        return self.inner.knows(rank)

    def forget(self, rank: int) -> None:
        """Node ``rank`` left the world on purpose."""
        self.inner.forget(rank)

    def backlog(self, dest: int) -> int:
        """What waits here for this iteration's bundle, and what the wrapped transport has not seen taken."""
        return self._queued.get(dest, 0) + self.inner.backlog(dest)

    def route(self, dest: int) -> TensorRoute | None:
        """How tensors reach ``dest``: the wrapped transport's way."""
        return self.inner.route(dest)

    def path(self, dest: int, tensors: bool) -> str:
        """The path a message to ``dest`` takes: the wrapped transport's, unless a wrapper carries it."""
        return self.inner.path(dest, tensors)

    def port_for(self, port: Port | None, tensors: list[torch.Tensor] | None) -> Port | None:
        """Whether a reply with ``tensors`` may ride ``port``: as the wrapped transport says."""
        return self.inner.port_for(port, tensors)

    def ask_off_loop(self, rank: int, question: str, timeout: float) -> Any:
        """Node ``rank``'s answer to ``question``, through the wrapped transport."""
        return self.inner.ask_off_loop(rank, question, timeout)
