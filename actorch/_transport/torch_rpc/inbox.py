"""What torch RPC's threads hand the node's loop: one typed item each, through the transport's ``Inbox``.

A bundle ``Arrived`` (to take in its link's order, with the response its
replies ride back on, if it came by torch RPC), replies ``Answered`` on the
response of a bundle this node sent, a bundle ``Refused`` from a node lost or
unknown here, a peer ``Lost``, a node ``Joined``. ``RpcTransport._on_inbox``
takes each on the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from actorch._transport.base import Bundle, NodeInfo

__all__ = ["Answered", "Arrived", "InboxItem", "Joined", "Lost", "Refused"]


@dataclass(slots=True)
class Arrived:
    """A bundle from ``src``, numbered ``seq`` on its link, to take in link order.

    ``response`` is torch's future its replies ride back on (None for a bundle
    that came on a path beside torch RPC, which has none); ``context`` the
    distributed autograd context it was sent in.
    """

    src: int
    seq: int
    bundle: Bundle
    response: torch.futures.Future[Any] | None
    context: int


@dataclass(slots=True)
class Answered:
    """Replies that came back on the response of a bundle this node sent to ``src`` (in no link order)."""

    src: int
    replies: Bundle


@dataclass(slots=True)
class Refused:
    """A bundle from ``src``, a node lost or unknown here: handed to the node to refuse (it counts and logs it)."""

    src: int
    bundle: Bundle


@dataclass(slots=True)
class Lost:
    """A torch or heartbeat thread saw ``src`` lost, for ``why``."""

    src: int
    why: str


@dataclass(slots=True)
class Joined:
    """A node joined the world (elastic worlds)."""

    info: NodeInfo


InboxItem = Arrived | Answered | Refused | Lost | Joined
"""What torch's threads hand the loop."""
