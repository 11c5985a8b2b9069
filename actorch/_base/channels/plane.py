"""The data plane: a node's tensor channels, the first that carries a tensor taking it, and what each carried.

Messages take the control path (the fast lane or torch RPC); their tensors
take the fastest channel for their device and destination, chosen per tensor
in this order:

1. ``metadata``: a tensor of no elements, as its dtype, shape and strides;
2. ``inline``: a small CPU tensor, inside the message's bytes;
3. ``shm``: a CPU tensor for a process of this host, by reference in a pooled segment;
4. ``cuda_ipc``: a GPU tensor for a process of this host, by a CUDA IPC handle;
5. ``device_map``: a GPU tensor whose device a map covers, on TensorPipe's CUDA path;
6. ``staged``: any other GPU tensor, through pinned host memory;
7. ``transport``: any other CPU tensor, by value on the transport's own path.

``metadata``, ``inline`` and ``transport`` are always there; the others are
the system's to choose (``run(channels=...)``, ``OPTIONAL``). Ordering,
deadlines and ``tell``'s promise belong to the message, whichever channel its
tensors took.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from actorch._base.channels import cuda_ipc
from actorch._base.channels.base import CHANNEL_CODES, Arrival, Channel, Outgoing
from actorch._base.channels.by_value import ByValueChannel
from actorch._base.channels.cuda_ipc import CudaIpcChannel
from actorch._base.channels.device_map import DeviceMapChannel
from actorch._base.channels.inline import InlineChannel
from actorch._base.channels.metadata import EmptyChannel
from actorch._base.channels.route import TensorRoute
from actorch._base.channels.segments import host_identity, process_prefix
from actorch._base.channels.shm import REACH_KEY, SEGMENTS_KEY, SharedMemoryChannel
from actorch._base.channels.staged import StagedChannel
from actorch._base.errors import SerializationError

__all__ = ["OPTIONAL", "DataPlane", "check_channels", "own_reach"]

OPTIONAL = ("shm", "cuda_ipc", "device_map", "staged")
"""The channels a system may leave out (``run(channels=...)``); the others are always there."""


def check_channels(value: object) -> tuple[str, ...] | None:
    """``value`` (``run(channels=...)``) as a tuple of channel names in ``OPTIONAL``; None means all of them.

    Raises:
        ValueError: It is not None nor a collection of those names.
    """
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Collection):
        raise ValueError(
            f"channels must be a list of channel names from {list(OPTIONAL)}, or None (all), not {value!r}"
        )
    unknown = [name for name in value if name not in OPTIONAL]
    if unknown:
        raise ValueError(
            f"channels names an unknown channel {unknown[0]!r}: choose among {list(OPTIONAL)} "
            "(metadata, inline and transport are always used)"
        )
    return tuple(name for name in OPTIONAL if name in value)


def own_reach() -> dict[str, str]:
    """What this process tells other nodes of where its channels reach: its host's shared memory, its GPUs."""
    reach: dict[str, str] = {}
    identity = host_identity()
    if identity is not None:
        reach[REACH_KEY] = identity
        reach[SEGMENTS_KEY] = process_prefix()
    devices = cuda_ipc.reach()
    if devices is not None:
        reach[cuda_ipc.REACH_KEY] = devices
    return reach


class DataPlane:
    """A node's tensor channels in the order they are tried (see the module's docstring)."""

    def __init__(self, channels: Sequence[Channel]) -> None:
        self._order = tuple(channels)
        self._by_code: dict[int, Channel] = {}
        for channel in channels:
            code = channel.code
            if code in self._by_code:
                raise ValueError(f"channels {self._by_code[code].name} and {channel.name} share code {code}")
            self._by_code[code] = channel
        self._counts = {channel.name: [0, 0] for channel in channels}  # tensors, bytes
        self.lends = any(type(channel).drop is not Channel.drop for channel in channels)
        self._ways = tuple(channel for channel in channels if type(channel).on_way is not Channel.on_way)
        """Whether a channel lends what it sends (shared memory): a dropped message must give it back."""
        self.sent_to: dict[int, int] = {}
        """Bytes of tensors carried apart from their messages' bytes, by destination rank (replies included)."""

    def __repr__(self) -> str:
        return f"<DataPlane {[channel.name for channel in self._order]}>"

    @classmethod
    def standard(
        cls,
        allowed: Collection[str] | None = None,
        *,
        shm: SharedMemoryChannel | None = None,
        cuda_ipc: CudaIpcChannel | None = None,
        strict: bool = False,
    ) -> DataPlane:
        """The channels of ``allowed`` (None: every one) that this process can use, with the ones always there.

        ``shm`` is the shared-memory channel, with its pool, and ``cuda_ipc``
        the CUDA IPC one, for a node whose peers may share its host; without
        them there are none. ``strict`` (``devices="strict"``): a GPU tensor no
        direct path carries is refused rather than staged.
        """
        chosen = OPTIONAL if allowed is None else tuple(allowed)
        channels: list[Channel] = [EmptyChannel(), InlineChannel()]
        if shm is not None and "shm" in chosen:
            channels.append(shm)
        if cuda_ipc is not None and "cuda_ipc" in chosen:
            channels.append(cuda_ipc)
        if "device_map" in chosen:
            channels.append(DeviceMapChannel())
        if "staged" in chosen:
            channels.append(StagedChannel(shm if shm is not None and "shm" in chosen else None, strict=strict))
        channels.append(ByValueChannel())
        return cls(channels)

    @property
    def names(self) -> tuple[str, ...]:
        """The channels, in the order they are tried."""
        return tuple(channel.name for channel in self._order)

    def carry(self, tensor: torch.Tensor, route: TensorRoute, out: Outgoing) -> tuple[int, bool, Any]:
        """Send ``tensor`` toward ``route.dest`` on the first channel that carries it: its code, packing, payload.

        Raises:
            SerializationError: A channel refused it (``devices="strict"``), or none can carry it.
        """
        for channel in self._order:
            if channel.carries(tensor, route):
                payload = channel.send(tensor, route, out)
                if payload is not None:
                    counts = self._counts[channel.name]
                    nbytes = tensor.nbytes
                    counts[0] += 1
                    counts[1] += nbytes
                    if channel.apart:
                        self.sent_to[route.dest] = self.sent_to.get(route.dest, 0) + nbytes
                    return channel.code, channel.packed, payload
        raise SerializationError(
            f"{out.where(tensor)}: no channel this system uses ({', '.join(self.names)}) can carry a tensor on "
            f"{tensor.device} to node {route.dest}: add 'staged' to run(channels=...), or move it to the CPU first"
        )

    def on_way(self, rank: int) -> int:
        """Bytes its channels sent node ``rank`` outside the transport that have not reached it yet."""
        total = 0  # asked before every call: a plain loop, no generator
        for channel in self._ways:
            total += channel.on_way(rank)
        return total

    def receiver(self, code: int) -> Channel | None:
        """The channel whose payloads carry ``code``, if this plane has it."""
        return self._by_code.get(code)

    def receive(self, code: int, payload: Any, arrival: Arrival) -> torch.Tensor:
        """The tensor a channel's ``payload`` stands for.

        Raises:
            SerializationError: No channel of this plane sends under ``code``, or the payload is malformed.
        """
        channel = self._by_code.get(code)
        if channel is None:
            name = next((name for name, value in CHANNEL_CODES.items() if value == code), f"code {code}")
            raise SerializationError(f"a tensor arrived on channel {name}, which this node does not use")
        return channel.receive(payload, arrival)

    def forget(self, rank: int, reach: Mapping[str, str]) -> None:
        """Node ``rank`` is gone: every channel takes back what it lent it and drops what it held of it."""
        for channel in self._order:
            channel.forget(rank, reach)

    def close(self) -> None:
        """This node leaves: every channel lets go of what it keeps."""
        for channel in self._order:
            channel.close()

    def statistics(self) -> dict[str, dict[str, int]]:
        """By channel: the tensors it carried and their bytes, and its own counts."""
        return {
            channel.name: {
                "tensors": self._counts[channel.name][0],
                "bytes": self._counts[channel.name][1],
                **channel.statistics(),
            }
            for channel in self._order
        }
