"""``WorldSpec``: where one node stands in its world, said the same way to every kind of transport.

A launch describes the node it opens (its rank, the world's size, where the
ranks meet, who may join and what the node says of itself) without naming a
kind of transport; the kind's own options record (``TorchRpc``, ...) says the
rest. ``kinds.open_transport`` takes both.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actorch._transport.base import NodeTraits

__all__ = ["DEFAULT_LIVENESS_TIMEOUT", "WorldSpec"]

DEFAULT_LIVENESS_TIMEOUT = 2.5
"""Seconds of silence after which a node that did not close its connections is lost (``run(liveness_timeout=)``)."""


@dataclass(frozen=True)
class WorldSpec:
    """What any kind of transport is opened with: the node's place in its world, and nothing of the kind's own.

    Attributes:
        rank: The node's rank (a newcomer's, taken before it opens).
        world_size: Ranks the world starts with (0 for a newcomer: it learns them).
        host: Where the ranks meet: rank 0's rendezvous address (an in-process
            world's hub, ``InProcessHub.address``).
        port: Its port (0: any free one, for a rank 0 that binds it itself).
        traits: What the node says of itself, if more than ``label``.
        label: The node's name, for a newcomer that gives one.
        token: The join token of a world that grows while it runs; None: a static world.
        public: Of such a world, whether any process with the token may join (else only
            those the system starts itself).
        invited: A newcomer that the system started itself (``add_nodes``).
        initial: On rank 0 of a growing world, how many ranks the launch starts itself.
        liveness_timeout: Seconds without a sign of life after which a peer that
            did not close its connections (stopped, cut off) is lost; every kind
            that can lose a peer that way honours it.
        listener: On rank 0, its listening socket for the rendezvous, already bound.
        shared: On rank 0 of a growing world, the settings newcomers must run with (json-ready).
        alone: Rank 0 of a world of one, which opens a private growing world only
            when it first starts a node process (until then: no port, no thread).
    """

    rank: int
    world_size: int
    host: str
    port: int
    traits: NodeTraits | None = None
    label: str | None = None
    token: str | None = None
    public: bool = True
    invited: bool = False
    initial: int = 1
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT
    listener: socket.socket | None = field(default=None, compare=False)
    shared: Mapping[str, Any] | None = None
    alone: bool = False
