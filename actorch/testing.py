"""Test helpers: a whole multi-node actor system inside one process and one event loop, and faults on demand.

The nodes of a ``local_world`` talk through the in-process transport, so every
message still goes through the codec and the node's dispatch, but no process or
socket is needed. ``FaultyTransport`` wraps any kind of transport (in-process
or torch RPC) and drops, delays or cuts off messages on a schedule or at
random, in a ``local_world`` or a multi-process ``actorch.run`` alike.

Example:
    >>> async def test_counter() -> None:
    ...     async with local_world(3) as world:
    ...         ref = await world[0].spawn(Counter, name="c", on=2)
    ...         assert await ref.call(Counter.add, 1) == 1
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Unpack

from actorch._actors.node.host import ActorHost
from actorch._actors.node.node_system import open_system
from actorch._actors.system import ActorSystem
from actorch._base.config import is_number
from actorch._base.deadline import DeadlineLoop
from actorch._base.homes import claim as _claim
from actorch._base.resources import check_resources
from actorch._launch.options.system_options import IN_PROCESS, ConfigKeywords, options_of, system_config
from actorch._transport.base import NodeTraits
from actorch._transport.faulty import Delay, Drop, FaultyTransport, Partition
from actorch._transport.inprocess import InProcess, InProcessHub
from actorch._transport.kinds import innermost, open_transport
from actorch._transport.world import DEFAULT_LIVENESS_TIMEOUT, WorldSpec

__all__ = [
    "Delay",
    "Drop",
    "FaultyTransport",
    "InProcess",
    "LocalWorld",
    "Partition",
    "local_world",
    "new_event_loop",
]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the kind ``actorch.run`` runs its nodes on, for a ``local_world`` in a loop of your own.

    On it a call reads its caller's ``asyncio.timeout`` deadline in one lookup,
    however many timers are armed; on any other loop it looks through them
    all. Pass it as ``loop_factory`` to ``asyncio.Runner``, or return it from
    pytest-asyncio's ``pytest_asyncio_loop_factories`` hook.

    Example:
        >>> with asyncio.Runner(loop_factory=new_event_loop) as runner:
        ...     runner.run(test_counter())
    """
    return DeadlineLoop()


class LocalWorld:
    """The systems of an in-process world, indexed by rank."""

    def __init__(self, hub: InProcessHub, systems: list[ActorSystem], hosts: list[ActorHost]) -> None:
        self._hub = hub
        self._hosts = hosts
        self.systems = systems

    def __repr__(self) -> str:
        return f"<LocalWorld world_size={len(self.systems)}>"

    def __getitem__(self, rank: int) -> ActorSystem:
        return self.systems[rank]

    def __len__(self) -> int:
        return len(self.systems)

    def kill(self, rank: int) -> None:
        """Cut node ``rank`` off as if its process died: its peers see it lost."""
        self._hosts[rank].cut_off()
        self._hub.disconnect(rank, "killed by the test")

    async def shutdown(self) -> None:
        """Stop every actor on every live node (running ``on_stop``), then close the nodes."""
        live = [host for host in self._hosts if not host.closed]
        await asyncio.gather(*(host.stop_all() for host in live))
        for host in live:
            await host.close()


_IN_PROCESS_DEFAULTS = {"lookup_timeout": 5.0, "stop_grace": 2.0}
"""Where ``local_world``'s options differ from ``run``'s: shorter waits, for tests."""


@asynccontextmanager
async def local_world(
    world_size: int = 2,
    *,
    devices: Mapping[int, Iterable[str]] | None = None,
    labels: Mapping[int, str] | None = None,
    resources: Mapping[int, Mapping[str, float]] | None = None,
    transport: object = None,
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT,
    **options: Unpack[ConfigKeywords],
) -> AsyncIterator[LocalWorld]:
    """Run an actor system of ``world_size`` nodes in this event loop; shut it down on exit.

    Args:
        world_size: Number of nodes.
        devices: The GPUs some nodes report instead of this process's, by
            rank (``{1: ("cuda:0", "cuda:1")}``), to test placement with
            ``spawn(..., gpus=)`` on a machine without them. Actors placed on
            them run with their device made current by the runtime's
            accelerator, so such a test installs one that does not touch CUDA.
        labels: Labels of some nodes, by rank (``{1: "env"}``), for ``Where(label=...)``.
        resources: Resources some nodes declare, by rank (``{1: {"env_slots": 4}}``),
            over what this process detects, for ``Where`` placement.
        transport: The nodes' transport: ``InProcess()`` (None: that), or a kind
            that wraps it, such as ``FaultyTransport(InProcess(), ...)``.
        liveness_timeout: Seconds a node cut off by a ``Partition`` stays
            silent before the other side counts it lost (and it them).
        **options: The options of ``actorch.SystemOptions`` that apply in one
            process, checked as ``run`` checks them: ``strict``,
            ``lookup_timeout`` (5 s here, short for tests), ``stop_grace`` (2 s
            here), ``mailbox_size``, ``max_message_size``, ``send_budget``
            (in process: bytes queued for the loop iteration's bundle) and
            ``otel`` (OpenTelemetry spans, to the process's tracer provider).

    Raises:
        TypeError: An option that does not apply in one process, or a ``transport``
            that is no kind's options record.
        ValueError: ``world_size`` is not positive, an option's value is not one
            it takes, or ``transport`` is not in-process at its core.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, not {world_size}")
    if not is_number(liveness_timeout, inclusive=False):
        raise ValueError(f"liveness_timeout must be a positive number of seconds, not {liveness_timeout!r}")
    kind = InProcess() if transport is None else transport
    if not isinstance(innermost(kind), InProcess):
        raise ValueError(
            "local_world runs every node in this process: its transport is InProcess() or a kind that wraps it, "
            f"not {kind!r}"
        )
    config = system_config(options_of("local_world", None, options, takes=IN_PROCESS, defaults=_IN_PROCESS_DEFAULTS))
    ranks = set(labels or {}) | set(resources or {})
    traits = {
        rank: NodeTraits((labels or {}).get(rank), check_resources((resources or {}).get(rank), f"resources[{rank}]"))
        for rank in ranks
    }
    hub = InProcessHub(world_size, devices=devices, traits=traits)
    specs = [
        WorldSpec(rank, world_size, hub.address, 0, liveness_timeout=liveness_timeout) for rank in range(world_size)
    ]
    transports = [open_transport(spec, kind) for spec in specs]
    opened = [open_system(transport, config) for transport in transports]
    hosts = [host for _, host in opened]
    for host in hosts:
        await host.start_services()
    for opened_transport in transports:
        await opened_transport.start()  # in process, nothing to join; a kind that wraps it starts its own work
    world = LocalWorld(hub, [system for system, _ in opened], hosts)
    try:
        yield world
    finally:
        await world.shutdown()


_claim(__name__, ["Delay", "Drop", "FaultyTransport", "InProcess", "Partition"], globals())  # actorch.testing.X
