"""How one node of a launch starts: the plan and world it starts with, its transport, and its start-up.

Rank 0 (``run``, ``start``), a node that joins (``serve``, ``connect``) and
a node process started on demand all open their node here (``start_node``):
the ``setup`` runs, the collector is tuned, the node's system opens and its
transport joins the world; a start that fails stops what peers spawned on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actorch._actors.node.host import ActorHost
from actorch._actors.node.node_system import open_system
from actorch._actors.system import ActorSystem
from actorch._base.config import SystemConfig
from actorch._base.reaping import watch_exit
from actorch._launch.workers import exit_of, kill_lost
from actorch._transport.base import NodeTraits, Transport, TransportSpec
from actorch._transport.capabilities import Elastic
from actorch._transport.opening import open_transport
from actorch._transport.torch_rpc.rpc_setup import RpcOptions

__all__ = [
    "OLD_GC_THRESHOLD",
    "SHUTDOWN_TIMEOUT",
    "TORCHRUN_VARS",
    "YOUNG_GC_THRESHOLD",
    "Plan",
    "Setup",
    "World",
    "plan_from",
    "rpc_transport",
    "shared_settings",
    "start_node",
    "tune_gc",
]

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets in every process it starts: a launch that finds them all joins torchrun's world."""

SHUTDOWN_TIMEOUT = 5.0
"""Seconds past the actors' own bounds (``2 * stop_grace``) that a node's shutdown may take."""

YOUNG_GC_THRESHOLD = 3_000
"""Allocations between two collections of the young generation when ``run`` tunes the collector (Python: 700)."""

OLD_GC_THRESHOLD = 100
"""Collections of the middle generation between two full ones when ``run`` tunes the collector (Python: 10)."""

Setup = Callable[[int], object]
"""A function run on every node with its rank before the node serves (may return an awaitable)."""


@dataclass(frozen=True)
class Plan:
    """What every node of a launch is started with."""

    config: SystemConfig
    options: RpcOptions
    setup: Setup | None
    tune_gc: bool
    status: tuple[str, int] | None = None  # where rank 0 serves the status (actorch status), if anywhere
    log_level: str | None = None  # the level every node logs at; None: each process's ACTORCH_LOG_LEVEL
    trace: str | None = None  # under run: where rank 0 writes a timeline of main's run


@dataclass(frozen=True)
class World:
    """Where one node stands in its world: its rank, rank 0's address, how it joins and what it says of itself."""

    rank: int
    world_size: int
    host: str
    port: int
    token: str | None = None  # an elastic world's join token ("" to ask without one); None: a static world
    label: str | None = None
    traits: NodeTraits | None = None  # what the node says of itself (label, declared resources...), if more than label
    invited: bool = False  # a process the system started itself (add_nodes): a system that is not elastic takes it


def shared_settings(plan: Plan) -> dict[str, Any]:
    """The settings an elastic system's newcomers must run with (json-ready)."""
    local = ("device_maps", "init_timeout")  # elastic worlds have no maps; each newcomer waits as it chooses
    options = {key: value for key, value in dataclasses.asdict(plan.options).items() if key not in local}
    return {"config": dataclasses.asdict(plan.config), "options": options}


def plan_from(shared: dict[str, Any], setup: Setup | None, join_timeout: float, log_level: str | None = None) -> Plan:
    """The plan of a newcomer to an elastic system, from the settings its rank 0 published (the log level its own)."""
    options = RpcOptions(device_maps=None, init_timeout=join_timeout, **shared["options"])
    return Plan(SystemConfig(**shared["config"]), options, setup, tune_gc=True, log_level=log_level)


def tune_gc() -> None:
    """Freeze what lives now (it lives all run) and collect the young generation less often (see ``run``)."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), middle, max(old, OLD_GC_THRESHOLD))


def rpc_transport(world: World, options: RpcOptions) -> Transport:
    """A node's torch RPC transport, from its world (every node but a local launch's rank 0); elastic with a token."""
    spec = TransportSpec(
        world.rank,
        world.world_size,
        world.host,
        world.port,
        options,
        traits=world.traits,
        label=world.label,
        token=world.token,
        invited=world.invited,
    )
    return open_transport(spec)


async def start_node(
    transport: Transport,
    plan: Plan,
    workers: list[Any] | None = None,
    prepare: Callable[[ActorHost], None] | None = None,
) -> tuple[ActorSystem, ActorHost]:
    """Open this node's system and join the world; ``prepare`` gets the host before other nodes can ask it anything."""
    if plan.setup is not None:
        done = plan.setup(transport.rank)
        if inspect.isawaitable(done):
            await done
    if plan.tune_gc:
        tune_gc()  # before the first actor can come (peers may spawn here before start() returns), and again after
    system, host = open_system(transport, plan.config)
    if prepare is not None:
        prepare(host)
    await host.start_services()
    starting = asyncio.ensure_future(transport.start())
    try:
        while not starting.done():
            await asyncio.wait([starting], timeout=0.1)
            dead = [worker for worker in workers or () if worker.exitcode is not None]
            if dead and not starting.done():
                starting.cancel()
                if isinstance(transport, Elastic):
                    transport.stop_admitting()  # rank 0 of an elastic world stops waiting for the launch's workers
                await asyncio.wait([starting])
                codes = ", ".join(exit_of(worker) for worker in dead)
                raise RuntimeError(f"actor system failed to start: {codes}")
        starting.result()
    except BaseException:
        await asyncio.shield(_abandon_start(host))
        raise
    if plan.tune_gc:
        tune_gc()
    if workers:
        host.on_peer_lost(lambda rank, why: None if rank in host.left else kill_lost(workers, rank))
        for worker in workers:  # one that leaves an elastic system, or is killed, exits while the others serve on
            watch_exit(worker, host.loop)
    return system, host


async def _abandon_start(host: ActorHost) -> None:
    """A node whose start failed stops what it hosts and closes (its agent may be up: the exit would abort).

    Peers reach a node of an elastic world as soon as its torch RPC agent is
    up, before its start returns: they may have spawned actors here already,
    whose ``on_stop`` runs now.
    """
    host.depart()
    with contextlib.suppress(Exception):
        await host.stop_all()
    with contextlib.suppress(Exception):
        await host.close()
