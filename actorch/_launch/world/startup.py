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
from dataclasses import dataclass, field
from typing import Any

from actorch._actors.node.host import ActorHost
from actorch._actors.node.node_system import open_system
from actorch._actors.system import ActorSystem
from actorch._base.config import SystemConfig
from actorch._base.reaping import watch_exit
from actorch._launch.options.setup import Setup
from actorch._launch.world.workers import exit_of, kill_lost
from actorch._transport.base import NodeTraits, Transport
from actorch._transport.capabilities import elastic_of
from actorch._transport.kind import KindOptions
from actorch._transport.kinds import default_options, open_transport, options_from_json, options_to_json
from actorch._transport.world import DEFAULT_LIVENESS_TIMEOUT, WorldSpec

__all__ = [
    "OLD_GC_THRESHOLD",
    "SHUTDOWN_TIMEOUT",
    "TORCHRUN_VARS",
    "YOUNG_GC_THRESHOLD",
    "Plan",
    "World",
    "node_transport",
    "plan_from",
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


@dataclass(frozen=True)
class Plan:
    """What every node of a launch is started with (it travels to the processes the launch spawns)."""

    config: SystemConfig
    setup: Setup | None
    tune_gc: bool
    transport: KindOptions = field(default_factory=default_options)  # the kind's options record (TorchRpc(), ...)
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT
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
    """The settings an elastic system's newcomers must run with (json-ready): its kind's record among them."""
    return {
        "config": dataclasses.asdict(plan.config),
        "transport": options_to_json(plan.transport),
        "liveness_timeout": plan.liveness_timeout,
    }


def plan_from(shared: dict[str, Any], setup: Setup | None, join_timeout: float, log_level: str | None = None) -> Plan:
    """The plan of a newcomer to an elastic system, from the settings its rank 0 published (the log level its own).

    The newcomer rebuilds the system's transport record, as a newcomer runs it
    (let in within ``join_timeout``).
    """
    transport = options_from_json(shared["transport"]).joining(join_timeout)
    liveness = shared.get("liveness_timeout", DEFAULT_LIVENESS_TIMEOUT)
    config = SystemConfig(**shared["config"])
    return Plan(config, setup, tune_gc=True, transport=transport, liveness_timeout=liveness, log_level=log_level)


def tune_gc() -> None:
    """Freeze what lives now (it lives all run) and collect the young generation less often (see ``run``)."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), middle, max(old, OLD_GC_THRESHOLD))


def node_transport(world: World, plan: Plan) -> Transport:
    """A node's transport of the plan's kind, from its world (every node but a local launch's rank 0)."""
    spec = WorldSpec(
        world.rank,
        world.world_size,
        world.host,
        world.port,
        traits=world.traits,
        label=world.label,
        token=world.token,
        invited=world.invited,
        liveness_timeout=plan.liveness_timeout,
    )
    return open_transport(spec, plan.transport)


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
                elastic = elastic_of(transport)
                if elastic is not None:
                    elastic.stop_admitting()  # rank 0 of an elastic world stops waiting for the launch's workers
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
