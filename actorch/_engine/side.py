"""What the calling and the called side of a node share: the node's transport, codec, windows, actors and peers.

The node builds one :class:`SideParts` and hands it to its ``Caller`` and its
``Callee``; each keeps the parts in slots of its own, for the message path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from actorch._base.codec import Codec
from actorch._engine.cell import Cell
from actorch._engine.flow import FlowControl
from actorch._transport.base import Transport

__all__ = ["NodeSide", "SideParts"]


class SideParts(NamedTuple):
    """The node's parts a side works with."""

    transport: Transport
    codec: Codec
    flow: FlowControl
    cells: Mapping[int, Cell]  # the node's actors, by id (the node adds and removes them)
    lost: Mapping[int, str]  # the node's lost peers, with why (the node records them)
    loop: asyncio.AbstractEventLoop
    log: Any
    new_key: Callable[[], int]
    max_message_size: int


class NodeSide:
    """Base of the caller and the callee: the node's parts, and whether the node has closed."""

    __slots__ = (
        "cells",
        "closed",
        "codec",
        "flow",
        "log",
        "loop",
        "lost",
        "max_message_size",
        "new_key",
        "pack",
        "rank",
        "transport",
    )

    def __init__(self, parts: SideParts) -> None:
        self.transport = parts.transport
        self.rank = parts.transport.rank
        self.codec = parts.codec
        self.pack = parts.codec.encode_plain
        self.flow = parts.flow
        self.cells = parts.cells
        self.lost = parts.lost
        self.loop = parts.loop
        self.log = parts.log
        self.new_key = parts.new_key
        self.max_message_size = parts.max_message_size
        self.closed = False
