"""``actorch.run``: start the world, run ``main`` on rank 0, and always shut down in bounded time.

Three ways to start: one process (``world_size`` 1 or None: alone, until it
starts a node process); a plain script with ``world_size=N`` (this process is
rank 0 and spawns N-1 local workers on loopback, on a free port); or under
``torchrun`` (the world comes from RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT). With ``elastic=True`` the world takes new nodes while it runs:
``actorch.serve`` (``serving``) joins one from any process that has the
system's address and join token. Without it, a local launch still runs on an
elastic world, private to the node processes it starts itself (``add_nodes``),
unless device maps need a static one. The world is made in ``local``, rank 0
leads it in ``lead``, and what the other nodes run is in ``serving``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TypeVar

import structlog

from actorch._base.config import (
    DEFAULT_MAX_MESSAGE,
    DEFAULT_SEND_BUDGET,
    DEFAULT_WINDOW,
    SystemConfig,
    is_count,
    is_number,
)
from actorch._base.record import RECORD_ENV, new_run_id
from actorch._launch.eventloop import run_bounded
from actorch._launch.guard import refuse_run_while_imported
from actorch._launch.lead import Main, check_main, interrupt_policy, lead
from actorch._launch.local import elastic_token, launch_traits, local_world
from actorch._launch.logs import configure_logging, effective_log_level
from actorch._launch.nodes import ResourceSpec, declared_resources
from actorch._launch.serving import _serve, takes_system
from actorch._launch.startup import TORCHRUN_VARS, Plan, Setup, World, rpc_transport
from actorch._launch.status import STATUS_OFF, STATUS_PORT_ENV, check_status_port
from actorch._launch.workers import reap_workers
from actorch._transport.base import NodeTraits
from actorch._transport.torch_rpc.rpc_setup import DeviceMapSpec, RpcOptions

__all__ = ["run"]

T = TypeVar("T")

log = structlog.get_logger("actorch")

WORLD_SIZE_ENV = "ACTORCH_WORLD_SIZE"
"""Set by ``actorch run -n N``: the number of local processes, in place of ``run``'s ``world_size``."""


def run(
    main: Main[T],
    world_size: int | None = None,
    *,
    strict: bool = False,
    transport: str = "uv",
    fast_lane: bool = True,
    host: str = "127.0.0.1",
    lookup_timeout: float = 30.0,
    stop_grace: float = 10.0,
    liveness_timeout: float = 2.5,
    mailbox_size: int = DEFAULT_WINDOW,
    max_message_size: int = DEFAULT_MAX_MESSAGE,
    send_budget: int = DEFAULT_SEND_BUDGET,
    rpc_timeout: float = 60.0,
    rpc_threads: int = 4,
    device_maps: DeviceMapSpec = "auto",
    devices: str = "stage",
    elastic: bool = False,
    port: int = 0,
    setup: Setup | None = None,
    tune_gc: bool = True,
    status: bool = True,
    status_port: int | None = None,
    status_host: str = "127.0.0.1",
    resources: ResourceSpec = None,
    log_level: str | None = None,
    configure_logs: bool = True,
    record: bool = True,
) -> T:
    """Start an actor system, run ``main(system)`` on rank 0, shut down, and return its result.

    Args:
        main: The async function to run on rank 0.
        world_size: Number of processes; None or 1 runs everything in this one.
            Under a launcher (``torchrun``, ``actorch run -n N``) the world is
            the launcher's, whatever this says (a different number is ignored
            with a warning).
        strict: Refuse to send values that would need pickle.
        transport: TensorPipe transport, ``"uv"`` (default; idles at ~0 % CPU)
            or ``"shm"`` (lower latency, busy-spins a core per idle process).
        fast_lane: Send the bundles of messages that carry no tensors of their
            own (small tensors ride inside messages) on direct TCP connections
            between nodes rather than torch RPC: about a tenth of the CPU and
            the latency. False sends everything through torch RPC.
        host: Address of rank 0 for local launches; loopback unless you mean otherwise.
        lookup_timeout: Seconds ``lookup`` waits for a name without a deadline.
        stop_grace: Seconds a stopping actor's messages may run before cancellation.
        liveness_timeout: Seconds without a sign of life after which a node that
            did not close its connections (a stopped process, a network
            partition) is lost; heartbeats go every fifth of it. A killed
            process is noticed at once, whatever this is; a silent node on
            this machine whose process still runs (starved, or busy in a long
            call) is lost only after ten times this.
        mailbox_size: Messages one node may have waiting at one actor; beyond
            it a call waits for room and a tell raises ``MailboxFullError``.
        max_message_size: Bytes a call, tell or result between nodes may take
            (its encoded body and its tensors); a larger one raises
            ``MessageTooLargeError`` where it is sent.
        send_budget: Bytes one node may have on their way to one other node
            (sent, not yet taken there: a frozen or overloaded node's backlog);
            past it a tell raises ``MailboxFullError`` and a call waits for
            them to drain. A single larger message still leaves when nothing
            else is on its way.
        rpc_timeout: Seconds torch waits for raw torch RPC made by your code or
            torch's own tools (``rref.to_here()``, ``DistributedOptimizer``,
            distributed autograd's backward) before failing it; 0 waits
            forever. actorch's own calls never time out this way: a handler may
            run as long as it takes, and only heartbeats decide that a node is lost.
        rpc_threads: Threads in torch's RPC pool on every node. actorch's own
            messages need few; raw torch RPC that blocks inside a remote
            function needs one per such call in flight.
        device_maps: Which CUDA devices travel directly between nodes, on
            TensorPipe's CUDA channels (torch's ``set_device_map`` semantics).
            ``"auto"``: on a local launch where every process sees a GPU,
            ``cuda:i`` maps to ``cuda:i`` between every pair of nodes;
            otherwise nothing. None: no maps. One map for every pair
            (``{"cuda:0": "cuda:1"}``), or maps per source and destination
            rank (``{0: {1: {"cuda:0": "cuda:1"}}}``). See docs/guides/gpus.md.
        devices: What happens to a tensor on a GPU that no map carries to its
            destination: ``"stage"`` copies it through pinned host memory, and
            it arrives on the receiving actor's device (else the CPU);
            ``"strict"`` refuses it with ``SerializationError``.
        elastic: Let nodes join the running system (``actorch.serve``) and
            leave it (``system.leave``); ``world_size`` (or None: 1) is how many
            nodes it starts with. Runs on torch RPC even with one node. The
            join token is ``ACTORCH_JOIN_TOKEN`` if set, else a new random one;
            ``system.join_env()`` gives what a joining process needs. No
            device maps: GPU tensors are staged. Not under torchrun. See
            docs/guides/elastic.md.
        port: Port rank 0 listens on for a local launch (0: a free one);
            give one when other processes join an elastic system.
        setup: A function called once on every node, with its rank, before the
            node serves (seed the random generators, set torch's threads,
            import plugins); it may be ``async``. It must be importable (a
            module-level function), as local workers are new processes. If it
            raises, the system does not start.
        tune_gc: Tune Python's cyclic garbage collector once a node has
            started (imports, ``setup``, torch RPC): move every object then
            alive out of its reach (``gc.freeze()``: ~170,000 objects, mostly
            torch's, that each full collection would walk), collect the
            youngest generation every ``YOUNG_GC_THRESHOLD`` (3,000)
            allocations rather than Python's 700, and make a full collection
            wait for ``OLD_GC_THRESHOLD`` (100) collections of the middle
            generation rather than 10. Measured: twice the sustained message
            throughput, and actors that stop in a time linear in their number
            (10,000 in 0.43 s rather than 0.95 s). Frozen objects are never
            freed: set False if ``setup`` leaves cyclic garbage it expects
            collected, or to keep Python's defaults.
        status: Have rank 0 serve the system's live status, read-only, for
            ``actorch status`` (and Prometheus metrics at ``/metrics`` with
            ``actorch[metrics]`` installed), and write its address into the
            runtime file where ``actorch status`` finds it. On by default: an
            idle listening socket on rank 0's event loop, which costs nothing
            until asked. False serves none (``actorch stop`` still finds the
            system); so does ``ACTORCH_STATUS_PORT=off`` (``actorch run
            --no-status``) when ``status_port`` is None.
        status_port: The port the status is served on; None reads
            ``ACTORCH_STATUS_PORT`` (``actorch run --status-port``), else 0: a
            free one, which the runtime file records.
        status_host: The address the status is served on; loopback unless you mean otherwise.
        resources: Amounts of resources the nodes declare, over the CPUs,
            memory and GPUs they detect, for ``Where`` placement: one mapping
            for every node (``{"env_slots": 4}``), or mappings by rank
            (``{1: {"env_slots": 4}}``). See docs/guides/placement.md.
        log_level: Log level of actorch's structlog output on every node:
            ``"debug"``, ``"info"``, ``"warning"``, ``"error"`` or
            ``"critical"``; None reads ``ACTORCH_LOG_LEVEL``, else ``"warning"``.
        configure_logs: Configure structlog here (unless the program already
            did); the other nodes are processes of their own, configured at
            ``log_level`` either way.
        record: Keep a record of the run, written by every node as it goes:
            nodes joined and lost, actors started, failed, restarted,
            relocated and stopped (with their statistics), errors with their
            tracebacks. ``actorch history`` lists and shows past runs; the
            directory is ``ACTORCH_RUNS_DIR``, else ``~/.local/state/actorch/runs``.
            ``ACTORCH_RECORD=0`` turns it off too.

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
        TypeError: ``main`` is not an async function (nor a ``functools.partial``
            of one, nor an object whose ``__call__`` is async); nothing started.
    """
    refuse_run_while_imported()
    check_main(main)
    plan = _plan(
        strict=strict,
        transport=transport,
        fast_lane=fast_lane,
        lookup_timeout=lookup_timeout,
        stop_grace=stop_grace,
        liveness_timeout=liveness_timeout,
        mailbox_size=mailbox_size,
        max_message_size=max_message_size,
        send_budget=send_budget,
        rpc_timeout=rpc_timeout,
        rpc_threads=rpc_threads,
        device_maps=device_maps,
        devices=devices,
        setup=setup,
        tune_gc=tune_gc,
        status=(status, status_host, status_port),
        log_level=log_level,
        configure_logs=configure_logs,
        record=record,
    )
    if not _is_port(port):
        raise ValueError(f"port must be an int in 0..65535 (0: a free one), not {port!r}")
    world_size, _ = _requested_world_size(world_size)
    under_torchrun = all(var in os.environ for var in TORCHRUN_VARS)
    if plan.status is not None and not (under_torchrun and os.environ["RANK"] != "0"):
        check_status_port(*plan.status)  # a taken port fails here, before any worker starts
    if under_torchrun and not elastic:
        world = World(
            int(os.environ["RANK"]),
            int(os.environ["WORLD_SIZE"]),
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
        )
        if world_size is not None and world_size != world.world_size and world.rank == 0:
            _launcher_wins(world_size, world.world_size)
        said = NodeTraits(resources=declared_resources(resources, world.world_size).get(world.rank, {}))
        world = dataclasses.replace(world, traits=said)
        if world.rank != 0:
            _serve(world, plan)
        return run_bounded(lead(main, rpc_transport(world, plan.options), plan), interrupts=interrupt_policy(plan))
    traits = launch_traits(resources, world_size or 1)
    if elastic:
        return _launch_elastic(main, world_size, host, plan, port, traits, under_torchrun=under_torchrun)
    return _launch_local(main, world_size or 1, host, plan, port, traits)


def _plan(
    *,
    strict: bool,
    transport: str,
    fast_lane: bool,
    lookup_timeout: float,
    stop_grace: float,
    liveness_timeout: float,
    mailbox_size: int,
    max_message_size: int,
    send_budget: int,
    rpc_timeout: float,
    rpc_threads: int,
    device_maps: DeviceMapSpec,
    devices: str,
    setup: Setup | None,
    tune_gc: bool,
    status: tuple[bool, str, int | None],
    log_level: str | None,
    configure_logs: bool,
    record: bool = False,
) -> Plan:
    """Check ``run``'s options (``start`` takes the same) and make the plan every node starts with."""
    if not is_number(liveness_timeout, inclusive=False):
        raise ValueError(f"liveness_timeout must be a positive number of seconds, not {liveness_timeout!r}")
    level = effective_log_level(log_level)  # checked here whether or not logs are configured: every node uses it
    if configure_logs:
        configure_logging(level)
    config = SystemConfig(
        strict=strict,
        lookup_timeout=lookup_timeout,
        stop_grace=stop_grace,
        mailbox_size=mailbox_size,
        max_message_size=max_message_size,
        send_budget=send_budget,
        run_record=_run_id() if _recording(record) else None,
    )
    if devices not in ("stage", "strict"):
        raise ValueError(f"devices must be 'stage' or 'strict', not {devices!r}")
    options = RpcOptions(
        device_maps=device_maps,
        strict_devices=devices == "strict",
        transport=transport,
        lane=fast_lane,
        num_worker_threads=rpc_threads,
        rpc_timeout=rpc_timeout,
        heartbeat_interval=liveness_timeout / 5,
        liveness_timeout=liveness_timeout,
    )
    if setup is not None and not callable(setup):
        raise TypeError(f"setup must be a function of the node's rank, not {setup!r}")
    if setup is not None and takes_system(setup):
        raise TypeError(
            f"setup {getattr(setup, '__qualname__', setup)!r} asks for the system, but run() and start() call "
            "setup with the node's rank before the node serves (only serve() hands a setup the system)"
        )
    return Plan(config, options, setup, tune_gc=tune_gc, status=_status_address(*status), log_level=level)


def _recording(record: object) -> bool:
    """Whether to keep a run record: ``record``, unless ``ACTORCH_RECORD`` says 0 (checked here)."""
    if not isinstance(record, bool):
        raise TypeError(f"record must be True or False, not {record!r}")
    return record and os.environ.get(RECORD_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


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


def _is_port(port: object) -> bool:
    return is_count(port, 0) and isinstance(port, int) and port <= 65535


def _status_address(enabled: bool, host: str, port: int | None) -> tuple[str, int] | None:
    """Where rank 0 serves the status: None when ``status`` is False or ``ACTORCH_STATUS_PORT`` is ``off``.

    The port is ``status_port``, else ``ACTORCH_STATUS_PORT``, else 0 (a free one).
    """
    if not isinstance(enabled, bool):
        raise ValueError(f"status must be True (serve it, the default) or False (serve none), not {enabled!r}")
    if not isinstance(host, str) or not host:
        raise ValueError(f"status_host must be an address (a non-empty str such as '127.0.0.1'), not {host!r}")
    if port is not None and not _is_port(port):
        raise ValueError(f"status_port must be an int in 0..65535 (0: a free one), or None, not {port!r}")
    if not enabled:
        if port is not None:
            raise ValueError(f"status_port={port!r} was given with status=False, which serves no status: drop one")
        return None
    if port is None:
        found = os.environ.get(STATUS_PORT_ENV, "")
        if found == STATUS_OFF:
            return None
        if found and (not found.isdigit() or not _is_port(int(found))):
            raise ValueError(f"{STATUS_PORT_ENV} must be a port (0..65535) or {STATUS_OFF!r}, not {found!r}")
        port = int(found) if found else 0
    return host, port


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
