"""The one small interface every tensor channel implements, and what a channel sees of a message.

A channel is one way a tensor crosses from this process to another: inside
the message's bytes, as metadata, by reference in shared memory or through a
CUDA IPC handle, on the transport's own tensor path (by value, or through a
device map), or staged through host memory. The :class:`~actorch._base.channels.plane.DataPlane`
asks each channel in turn whether it ``carries`` a tensor to a destination,
and the first that does sends it: what ``send`` returns rides in the message
(under the channel's extension ``code``), and on arrival the same channel's
``receive`` makes the tensor again. A channel that keeps resources for its
peers (pooled segments, opened handles) gives back what a lost peer held in
``forget`` and everything in ``close``.

A new channel (NCCL or NIXL across hosts, say) is one module with one
:class:`Channel` subclass, a free code in ``CHANNEL_CODES`` and its place in
the plane's order; the engine above never changes for it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import torch

from actorch._base.channels.route import TensorRoute

__all__ = ["CHANNEL_CODES", "Arrival", "Channel", "Outgoing"]

CHANNEL_CODES: Mapping[str, int] = {  # 12 is the codec's own (a value sent with shared())
    "transport": 0,
    "staged": 4,
    "inline": 5,
    "shm": 8,
    "cuda_ipc": 9,
    "metadata": 10,
    "device_map": 11,
}
"""The codec's extension code of what each channel puts in a message; the codec keeps 1-3, 6 and 7 for itself."""


class Outgoing(Protocol):
    """What a channel sees of the message being encoded."""

    copy: bool
    """The sender may change its tensors the moment the send returns (a tell, a stream item): send a copy."""

    shared: dict[Any, Any] | None
    """Shared by every destination of one multicast: what a channel placed for one, to lend it to the others."""

    def add(self, item: Any) -> int:
        """Put ``item`` on the message's side list, for the transport to carry; its index there."""
        ...

    def staged_on(self, device: torch.device) -> None:
        """Copies out of ``device`` were queued: wait for them once, before the message leaves."""
        ...

    def settle(self, device: torch.device) -> None:
        """Wait now, once per message, for the work queued on ``device`` (copies queued after it overlap the send)."""
        ...

    def where(self, tensor: torch.Tensor) -> str:
        """Where ``tensor`` sits in the value sent (``args[0]['obs']``), for an error."""
        ...


class Arrival(Protocol):
    """What a channel sees of the message being decoded."""

    tensors: list[Any]
    """The side list that travelled with the message."""

    device: torch.device | None
    """The receiving actor's device, where a tensor that has no device of its own to land on goes (None: the CPU)."""


class Channel(ABC):
    """One way tensors cross to another process (see the module's docstring)."""

    name: ClassVar[str]
    """How ``run(channels=...)``, the statistics and the docs name it."""

    apart: ClassVar[bool] = True
    """It carries a tensor's bytes apart from the message's own (not inside them, nor as metadata alone)."""

    packed: ClassVar[bool] = True
    """What ``send`` returns is msgpack-native data the codec packs; False: bytes that ride as they are."""

    @property
    def code(self) -> int:
        """The extension code of what it puts in a message (``CHANNEL_CODES``)."""
        return CHANNEL_CODES[self.name]

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"

    @abstractmethod
    def carries(self, tensor: torch.Tensor, route: TensorRoute) -> bool:
        """Whether it can carry ``tensor`` (strided, not quantized) to ``route.dest``; cheap, and changes nothing."""

    @abstractmethod
    def send(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> Any:
        """What the message carries for ``tensor``; None if it could not after all (the next channel tries).

        Raises:
            SerializationError: The tensor must not go at all (``devices="strict"``).
        """

    @abstractmethod
    def receive(self, payload: Any, arrival: Arrival) -> torch.Tensor:
        """The tensor ``payload`` (what ``send`` returned, unpacked) stands for.

        Raises:
            SerializationError: The payload is malformed or names what cannot be had.
        """

    def on_way(self, rank: int) -> int:
        """Bytes it sent node ``rank`` apart from the transport that have not reached it yet (the send budget's)."""
        return 0

    def drop(self, payload: Any) -> None:  # noqa: B027 - most channels lend nothing
        """A message that carried ``payload`` was dropped unread: let go of what it lent (a shared segment)."""

    def forget(self, rank: int, reach: Mapping[str, str]) -> None:  # noqa: B027 - most channels keep nothing per peer
        """Node ``rank`` is gone: take back what it held of this node's, drop what this node held of its.

        ``reach`` is what the node said of where its channels reach (its ``NodeInfo.reach``).
        """

    def close(self) -> None:  # noqa: B027 - most channels keep nothing
        """This node leaves: let go of everything the channel keeps."""

    def statistics(self) -> dict[str, int]:
        """Counts of its own beyond the tensors and bytes the plane counts for every channel."""
        return {}
