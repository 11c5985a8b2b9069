"""``actorch.run``: start the world, run ``main`` on rank 0, and always shut down in bounded time.

Three ways to start: one process (``world_size`` 1 or None: alone, until it
starts a node process); a plain script with ``world_size=N`` (this process is
rank 0 and spawns N-1 local workers on loopback, on a free port); or under
``torchrun`` (the world comes from RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT). With ``elastic=True`` the world takes new nodes while it runs:
``actorch.serve`` (``serving``) joins one from any process that has the
system's address and join token. Without it, a local launch still runs on an
elastic world, private to the node processes it starts itself (``add_nodes``),
unless its transport's options need a static one (torch RPC's device maps). The world is made in ``local``, rank 0
leads it in ``lead``, and what the other nodes run is in ``serving``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TypeVar, Unpack

import structlog

from actorch._base.record import new_run_id
from actorch._launch.options.environment import WORLD_SIZE_ENV, effective_log_level
from actorch._launch.options.system_options import (
    OptionKeywords,
    SystemOptions,
    options_of,
    recording,
    status_address,
    system_config,
    trace_path,
)
from actorch._launch.services.logs import configure_logging
from actorch._launch.services.status import check_status_port
from actorch._launch.world.eventloop import run_bounded
from actorch._launch.world.guard import refuse_run_while_imported
from actorch._launch.world.lead import Main, check_main, interrupt_policy, lead
from actorch._launch.world.local import elastic_token, launch_traits, local_world
from actorch._launch.world.nodes import declared_resources
from actorch._launch.world.serving import _serve
from actorch._launch.world.startup import TORCHRUN_VARS, Plan, World, node_transport
from actorch._launch.world.workers import reap_workers
from actorch._transport.base import NodeTraits

__all__ = ["run"]

T = TypeVar("T")

log = structlog.get_logger("actorch")


def run(
    main: Main[T],
    world_size: int | None = None,
    *,
    options: SystemOptions | None = None,
    **keywords: Unpack[OptionKeywords],
) -> T:
    """Start an actor system, run ``main(system)`` on rank 0, shut down, and return its result.

    Args:
        main: The async function to run on rank 0, or a callable that returns
            an awaitable (``lambda system: train(system, split)``).
        world_size: Number of processes; None or 1 runs everything in this one.
            Under a launcher (``torchrun``, ``actorch run -n N``) the world is
            the launcher's, whatever this says (a different number is ignored
            with a warning).
        options: Options built beforehand; None: the defaults.
        **keywords: Options, as keywords: any field of ``SystemOptions``
            (``strict``, ``log_level``, ``status_port``...), each documented
            there; over ``options``' when both are given.

    Under a launcher, ``torchrun`` or ``actorch run -n N``, the launcher's
    number of processes is the system's: a different ``world_size`` is
    ignored, with one warning on rank 0 that names both numbers.

    Any system started from a script, elastic or not, can start more node
    processes while it runs (``system.add_nodes``, ``Where(process="own")``),
    except under torchrun and with device maps (a system of one process goes
    on torch RPC the first time it does).

    Returns:
        What ``main`` returned. If ``main`` raised, the exception propagates after shutdown.

    Raises:
        TypeError: ``main`` is a plain ``def`` function, a class or not
            callable, or an option is unknown; nothing started. Or ``main``
            (a lambda, an object with a plain ``__call__``) returned something
            that cannot be awaited; raised after the shutdown.
        ValueError: An option's value is not one it takes; nothing started.
        FileNotFoundError: ``trace`` names a file in a directory that does not exist; nothing started.
        OSError: The ``snapshots`` directory cannot be made; nothing started.
    """
    refuse_run_while_imported()
    check_main(main)
    chosen = options_of("run", options, keywords)
    plan = _plan(chosen, tune_gc=True)
    world_size, _ = _requested_world_size(world_size)
    under_torchrun = all(var in os.environ for var in TORCHRUN_VARS)
    if plan.status is not None and not (under_torchrun and os.environ["RANK"] != "0"):
        check_status_port(*plan.status)  # a taken port fails here, before any worker starts
    if plan.trace is not None and not os.path.isdir(os.path.dirname(os.path.abspath(plan.trace))):
        raise FileNotFoundError(f"run(trace={plan.trace!r}): its directory does not exist; nothing started")
    if not (under_torchrun and os.environ["RANK"] != "0"):  # rank 0 alone keeps the snapshots
        _make_snapshot_directory("run", plan)
    if under_torchrun and not chosen.elastic:
        world = World(
            int(os.environ["RANK"]),
            int(os.environ["WORLD_SIZE"]),
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
        )
        if world_size is not None and world_size != world.world_size and world.rank == 0:
            _launcher_wins(world_size, world.world_size)
        said = NodeTraits(resources=declared_resources(chosen.resources, world.world_size).get(world.rank, {}))
        world = dataclasses.replace(world, traits=said)
        if world.rank != 0:
            _serve(world, plan)
        return run_bounded(lead(main, node_transport(world, plan), plan), interrupts=interrupt_policy(plan))
    traits = launch_traits(chosen.resources, world_size or 1)
    if chosen.elastic:
        return _launch_elastic(main, world_size, chosen.host, plan, chosen.port, traits, under_torchrun=under_torchrun)
    return _launch_local(main, world_size or 1, chosen.host, plan, chosen.port, traits)


def _plan(options: SystemOptions, *, tune_gc: bool) -> Plan:
    """The plan every node of a launch starts with, from its options (``tune_gc``: where they leave it to the driver).

    What the options leave to the environment is read here: the log level
    (configured here, if the options say so), the status port and whether
    the run is recorded.
    """
    level = effective_log_level(options.log_level)  # checked whether or not logs are configured: every node uses it
    if options.configure_logs:
        configure_logging(level)
    return Plan(
        system_config(options, run_record=_run_id() if recording(options) else None),
        options.setup,
        tune_gc=tune_gc if options.tune_gc is None else options.tune_gc,
        transport=options.transport_record,
        liveness_timeout=options.liveness_timeout,
        status=status_address(options),
        log_level=level,
        trace=trace_path(options),  # run's only: start has no main, and ignores it
    )


def _make_snapshot_directory(taker: str, plan: Plan) -> None:
    """Make the plan's snapshot directory, if it has one, before anything starts (``OSError`` naming it if not)."""
    directory = plan.config.snapshots
    if directory is None:
        return
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise type(exc)(
            exc.errno, f"{taker}(snapshots={directory!r}): cannot make the directory: {exc.strerror}; nothing started"
        ) from exc


def _run_id() -> str:
    """This run's id; under torchrun, the same on every rank of this host (the launcher's pid and start)."""
    if all(var in os.environ for var in TORCHRUN_VARS):
        launcher = os.getppid()
        try:
            started = os.stat(f"/proc/{launcher}").st_mtime
        except OSError:
            started = None
        return new_run_id(sys.argv[0], launcher, started)
    return new_run_id(sys.argv[0])


def _requested_world_size(world_size: int | None) -> tuple[int | None, bool]:
    """``world_size``, checked, or what ``actorch run -n 1`` asked for in ``ACTORCH_WORLD_SIZE``; and whether it did.

    A launcher's count wins over the script's, as torchrun's world does
    (``_launcher_wins`` says so once). ``ACTORCH_WORLD_SIZE=launcher``
    (``actorch run`` handing over to torchrun) leaves ``world_size`` as
    given: the world is the one torchrun starts, compared with it there.
    """
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size must be a positive int, not {world_size!r}")
    asked = os.environ.get(WORLD_SIZE_ENV)
    if not asked or asked == "launcher":
        return world_size, False
    if not asked.isdigit() or int(asked) < 1:
        raise ValueError(f"{WORLD_SIZE_ENV} must be a positive int, not {asked!r}")
    if world_size is not None and world_size != int(asked):
        _launcher_wins(world_size, int(asked))
    return int(asked), True


def _launcher_wins(world_size: int, launched: int) -> None:
    """Say, once, that the launcher's number of processes is the system's, not ``run(world_size=...)``'s."""
    launcher = "actorch run" if os.environ.get(WORLD_SIZE_ENV) else "torchrun"
    log.warning(
        f"run(world_size={world_size}) is ignored: {launcher} started {launched} "
        f"process{'' if launched == 1 else 'es'}, and the launcher's count is the system's"
    )


def _launch_elastic(
    main: Main[T],
    world_size: int | None,
    host: str,
    plan: Plan,
    port: int,
    traits: list[NodeTraits],
    *,
    under_torchrun: bool,
) -> T:
    """Start an elastic system of ``world_size`` local nodes (None: 1) that newcomers may join."""
    token = elastic_token(world_size, plan, under_torchrun=under_torchrun)
    return _launch_local(main, world_size or 1, host, plan, port, traits, token)


def _launch_local(
    main: Main[T],
    world_size: int,
    host: str,
    plan: Plan,
    port: int,
    traits: list[NodeTraits],
    token: str | None = None,
) -> T:
    """Start a local launch's world, lead it from this process until ``main`` ends, and reap its workers."""
    transport, workers = local_world(world_size, host, plan, port, traits, token)
    try:
        return run_bounded(lead(main, transport, plan, workers), interrupts=interrupt_policy(plan, workers))
    finally:
        reap_workers(workers)
