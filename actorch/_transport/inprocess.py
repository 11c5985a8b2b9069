"""The in-process kind of transport: every rank in one process and one event loop (``actorch.testing``).

Bundles are delivered on the same loop after the current iteration, in order,
still through the codec and the node's dispatch, so that in-process worlds run
the whole message path but the network. The ranks meet at an ``InProcessHub``,
whose ``address`` is the world's rendezvous (``WorldSpec.host``); its options
record, ``InProcess``, has nothing to set. A node of it is lost only when the
hub cuts it off (``disconnect``): nothing here goes silent.
"""

from __future__ import annotations

import itertools
import os
import socket
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from actorch._base.devices import accelerator, parse_device
from actorch._transport.base import Bundle, NodeInfo, NodeTraits, Transport
from actorch._transport.kind import Dump, Kind, Load
from actorch._transport.world import WorldSpec

__all__ = ["KIND", "InProcess", "InProcessHub", "InProcessTransport"]

_HUBS: weakref.WeakValueDictionary[str, InProcessHub] = weakref.WeakValueDictionary()
"""The hubs of this process, by address."""
_NUMBERS = itertools.count(1)


@dataclass(frozen=True)
class InProcess:
    """The in-process transport as a kind: every node of the world in this process (``actorch.testing.local_world``).

    It has no options. Pass it, or a kind that wraps it
    (``FaultyTransport(InProcess(), ...)``), as ``local_world(transport=...)``.
    """

    def refuses_elastic(self) -> str | None:
        """Always: no process joins an in-process world."""
        return "an in-process world takes no node from another process"

    def fixes_world(self) -> str | None:
        """Always: an in-process world's nodes are made when it starts."""
        return "an in-process world's nodes are all made when it starts"

    def joining(self, timeout: float | None = None) -> Self:
        """The same options (no node joins)."""
        return self

    def to_json(self, dump: Dump) -> dict[str, Any]:
        """Nothing to say."""
        return {}


class InProcessHub:
    """Connects in-process transports that share one event loop (tests, ``world_size=1``).

    Every rank reports this process's accelerator devices, unless ``devices``
    gives it others: tests of GPU placement give ranks made-up inventories, and
    install an accelerator that does not touch CUDA to make them current.
    """

    def __init__(
        self,
        world_size: int,
        *,
        devices: Mapping[int, Iterable[str]] | None = None,
        traits: Mapping[int, NodeTraits] | None = None,
    ) -> None:
        """Connect ``world_size`` ranks; ``devices`` maps ranks to the devices they report (``("cuda:0",)``).

        ``traits`` gives ranks a label and declared resources, as a launch would.

        Raises:
            ValueError: A key of ``devices`` or ``traits`` is not a rank of the
                hub, or a value of ``devices`` holds something other than CUDA devices.
        """
        self.world_size = world_size
        self.address = f"in-process:{next(_NUMBERS)}"
        """Where the hub's ranks meet: a ``WorldSpec``'s ``host`` that opens an ``InProcess`` transport here."""
        _HUBS[self.address] = self
        self.transports: dict[int, InProcessTransport] = {}
        self.devices: dict[int, tuple[str, ...]] = {}
        self.traits: dict[int, NodeTraits] = {}
        for rank, said in (traits or {}).items():
            _check_rank(rank, world_size, "traits")
            self.traits[rank] = said
        for rank, inventory in (devices or {}).items():
            _check_rank(rank, world_size, "devices")
            parsed = [parse_device(device, f"devices[{rank}]") for device in inventory]
            if any(device.type != "cuda" for device in parsed):
                raise ValueError(f"devices[{rank}] must list CUDA devices, not {inventory!r}")
            self.devices[rank] = tuple(str(device) for device in parsed)

    def __repr__(self) -> str:
        return f"<InProcessHub {self.address} ranks={sorted(self.transports)}>"

    def transport(self, rank: int) -> InProcessTransport:
        """Create the transport of ``rank`` on this hub."""
        transport = InProcessTransport(self, rank)
        transport.traits = self.traits.get(rank, transport.traits)
        self.transports[rank] = transport
        return transport

    def disconnect(self, rank: int, why: str = "disconnected") -> None:
        """Cut ``rank`` off, as if its process died: every other rank sees it lost."""
        self.transports.pop(rank, None)
        for other in list(self.transports.values()):
            other._report_lost(rank, why)


class InProcessTransport(Transport):
    """Delivers bundles on the same loop, after the current iteration, in order."""

    paths = ("in_process",)

    def __init__(self, hub: InProcessHub, rank: int) -> None:
        super().__init__(rank, hub.world_size)
        self._hub = hub
        self._gone: set[int] = set()  # ranks that left on purpose
        self._reported: set[int] = set()  # ranks reported lost (once each)

    async def start(self) -> None:
        """Nothing to join: the hub is the world."""

    async def close(self) -> None:
        """Leave the hub; the others see this rank lost only if they still run."""
        if self._hub.transports.get(self.rank) is self:
            del self._hub.transports[self.rank]

    def peers(self) -> list[NodeInfo]:
        """Every rank of the hub but those that left, all in this process, with the devices the hub gives it."""
        hub = self._hub
        own = accelerator().inventory()
        host, pid, plain = socket.gethostname(), os.getpid(), NodeTraits()
        return [
            hub.traits.get(rank, plain).info(rank, host, pid, hub.devices.get(rank, own))
            for rank in range(self.world_size)
            if rank not in self._gone
        ]

    def knows(self, rank: int) -> bool:
        """Whether ``rank`` is another rank of the hub that has not left."""
        return rank != self.rank and 0 <= rank < self.world_size and rank not in self._gone

    def forget(self, rank: int) -> None:
        """Rank ``rank`` left on purpose: nothing more goes to it, and its loss is never reported."""
        if rank != self.rank:
            self._gone.add(rank)

    def _report_lost(self, rank: int, why: str) -> None:
        """Report ``rank`` lost once, unless it left on purpose."""
        if rank in self._reported or rank in self._gone:
            return
        self._reported.add(rank)
        super()._report_lost(rank, why)

    def ask_off_loop(self, rank: int, question: str, timeout: float) -> Any:
        """Node ``rank``'s answer to ``question``: in this process, asked directly."""
        target = self._hub.transports.get(rank)
        if target is None or target.off_loop is None:
            raise ConnectionError(f"rank {rank} is not connected")
        return target.off_loop(question)

    def _send_bundle(self, dest: int, bundle: Bundle, in_context: bool) -> str | None:
        if dest in self._gone:
            return None
        if self._hub.transports.get(self.rank) is not self:
            self._report_lost(dest, f"rank {dest} counts this node lost (it was cut off)")
            return None
        target = self._hub.transports.get(dest)
        if target is None or target._receive is None:
            self._report_lost(dest, f"rank {dest} is not connected")
            return None
        assert target._loop is not None
        target.bytes_received_by_path["in_process"] += sum(map(len, bundle[0]))
        target._loop.call_soon(target._receive, self.rank, bundle, None)
        return "in_process"


def _check_rank(rank: object, world_size: int, what: str) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"{what}: {rank!r} is not a rank of this world (0..{world_size - 1})")


def _open(spec: WorldSpec, options: InProcess, inner: Transport | None = None) -> Transport:
    """Rank ``spec.rank``'s transport on the hub at ``spec.host``.

    Raises:
        TypeError: ``options`` are not ``InProcess``.
        ValueError: No hub of this process is at ``spec.host``: an in-process
            world opens only in ``actorch.testing.local_world``.
    """
    if not isinstance(options, InProcess):
        raise TypeError(f"an in-process transport takes InProcess options, not {options!r}")
    hub = _HUBS.get(spec.host)
    if hub is None:
        raise ValueError(
            f"an in-process world has every node in one process: open it with actorch.testing.local_world "
            f"(no hub at {spec.host!r})"
        )
    transport = hub.transport(spec.rank)
    if spec.traits is not None:
        transport.traits = spec.traits
    return transport


def _load(data: Mapping[str, Any], load: Load) -> InProcess:
    return InProcess(**data)


KIND: Kind[InProcess] = Kind(name="in_process", options=InProcess, open=_open, load=_load)
"""Every node in one process and one event loop."""
