"""``actorch.run``: start the world, run ``main`` on rank 0, and always shut down in bounded time.

Three ways to start: one process (``world_size`` 1 or None: alone, until it
starts a node process); a plain script with ``world_size=N`` (this process is
rank 0 and spawns N-1 local workers on loopback, on a free port); or under
``torchrun`` (the world comes from RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT). With ``elastic=True`` the world takes new nodes while it runs:
``actorch.serve`` (``serving``) joins one from any process that has the
system's address and join token. Without it, a local launch still runs on an
elastic world, private to the node processes it starts itself (``add_nodes``),
unless device maps need a static one. What the other nodes run is in ``serving``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import multiprocessing
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from actorch._actors.host import ActorHost
from actorch._actors.service import NodeService
from actorch._actors.system import ActorSystem
from actorch._base.config import DEFAULT_MAX_MESSAGE, DEFAULT_WINDOW, SystemConfig, is_count, is_number
from actorch._base.errors import ActorStoppedError, NodeLostError
from actorch._launch.eventloop import run_bounded
from actorch._launch.guard import WORKER_OF_ENV, refuse_run_while_imported
from actorch._launch.interrupts import InterruptPolicy
from actorch._launch.logs import configure_logging
from actorch._launch.nodes import (
    LocalLauncher,
    ResourceSpec,
    can_grow,
    declared_resources,
    environment,
    grow_refusal,
)
from actorch._launch.runtime import Announcement, status_address
from actorch._launch.serving import _newcomer_arguments, _serve, _serve_newcomer, takes_system
from actorch._launch.startup import (
    SHUTDOWN_TIMEOUT,
    Plan,
    Setup,
    World,
    rpc_transport,
    shared_settings,
    start_node,
)
from actorch._launch.status import STATUS_PORT_ENV, StatusServer, check_status_port
from actorch._launch.workers import kill_lost, kill_workers, reap_workers
from actorch._transport.base import NodeTraits, Transport
from actorch._transport.elastic import ElasticRpcTransport
from actorch._transport.lone import LoneTransport
from actorch._transport.membership import TOKEN_ENV, new_token
from actorch._transport.network import listen_socket
from actorch._transport.rpc import RpcTransport
from actorch._transport.rpc_setup import DeviceMapSpec, RpcOptions

__all__ = ["run"]

T = TypeVar("T")
Main = Callable[[ActorSystem], Awaitable[T]]

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_QUIET_ENV = {"TORCH_CPP_LOG_LEVEL": "ERROR"}
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
    rpc_timeout: float = 60.0,
    rpc_threads: int = 4,
    device_maps: DeviceMapSpec = "auto",
    devices: str = "stage",
    elastic: bool = False,
    port: int = 0,
    setup: Setup | None = None,
    tune_gc: bool = True,
    status_port: int | None = None,
    status_host: str = "127.0.0.1",
    resources: ResourceSpec = None,
    log_level: str | None = None,
    configure_logs: bool = True,
) -> T:
    """Start an actor system, run ``main(system)`` on rank 0, shut down, and return its result.

    Args:
        main: The async function to run on rank 0.
        world_size: Number of processes; None or 1 runs everything in this one.
            Under ``torchrun`` it may be left None (the world comes from the
            environment); if given it must match.
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
            process is noticed at once, whatever this is.
        mailbox_size: Messages one node may have waiting at one actor; beyond
            it a call waits for room and a tell raises ``MailboxFullError``.
        max_message_size: Bytes a call, tell or result between nodes may take
            (its encoded body and its tensors); a larger one raises
            ``MessageTooLargeError`` where it is sent.
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
        status_port: Have rank 0 serve the system's live status on this port
            (0: a free one) for ``actorch status``, and Prometheus metrics at
            ``/metrics`` with ``actorch[metrics]`` installed; read-only. None
            reads ``ACTORCH_STATUS_PORT``, and serves nothing without it.
        status_host: The address the status is served on; loopback unless you mean otherwise.
        resources: Amounts of resources the nodes declare, over the CPUs,
            memory and GPUs they detect, for ``Where`` placement: one mapping
            for every node (``{"env_slots": 4}``), or mappings by rank
            (``{1: {"env_slots": 4}}``). See docs/guides/placement.md.
        log_level: Log level for actorch's structlog output (else ``ACTORCH_LOG_LEVEL``).
        configure_logs: Configure structlog here (unless the program already did).

    ``actorch run -n N script.py`` sets ``ACTORCH_WORLD_SIZE``, which then
    takes the place of ``world_size``.

    Any system started from a script, elastic or not, can start more node
    processes while it runs (``system.add_nodes``, ``Where(process="own")``),
    except under torchrun and with device maps (a system of one process goes
    on torch RPC the first time it does).

    Returns:
        What ``main`` returned. If ``main`` raised, the exception propagates after shutdown.
    """
    refuse_run_while_imported()
    plan = _plan(
        strict=strict,
        transport=transport,
        fast_lane=fast_lane,
        lookup_timeout=lookup_timeout,
        stop_grace=stop_grace,
        liveness_timeout=liveness_timeout,
        mailbox_size=mailbox_size,
        max_message_size=max_message_size,
        rpc_timeout=rpc_timeout,
        rpc_threads=rpc_threads,
        device_maps=device_maps,
        devices=devices,
        setup=setup,
        tune_gc=tune_gc,
        status=(status_host, status_port),
        log_level=log_level,
        configure_logs=configure_logs,
    )
    if not _is_port(port):
        raise ValueError(f"port must be an int in 0..65535 (0: a free one), not {port!r}")
    world_size, launcher_sized = _requested_world_size(world_size)
    under_torchrun = all(var in os.environ for var in _TORCHRUN_VARS)
    if plan.status is not None and not (under_torchrun and os.environ["RANK"] != "0"):
        check_status_port(*plan.status)  # a taken port fails here, before any worker starts
    if under_torchrun and not elastic:
        world = World(
            int(os.environ["RANK"]),
            int(os.environ["WORLD_SIZE"]),
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
        )
        if world_size is not None and world_size != world.world_size and not launcher_sized:
            raise ValueError(f"run(world_size={world_size}) but torchrun started {world.world_size} processes")
        said = NodeTraits(resources=declared_resources(resources, world.world_size).get(world.rank, {}))
        world = dataclasses.replace(world, traits=said)
        if world.rank != 0:
            _serve(world, plan)
        return run_bounded(_lead(main, rpc_transport(world, plan.options), plan), interrupts=_interrupts(plan))
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size must be a positive int, not {world_size!r}")
    traits = _launch_traits(resources, world_size or 1)
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
    rpc_timeout: float,
    rpc_threads: int,
    device_maps: DeviceMapSpec,
    devices: str,
    setup: Setup | None,
    tune_gc: bool,
    status: tuple[str, int | None],
    log_level: str | None,
    configure_logs: bool,
) -> Plan:
    """Check ``run``'s options (``start`` takes the same) and make the plan every node starts with."""
    if not is_number(liveness_timeout, inclusive=False):
        raise ValueError(f"liveness_timeout must be a positive number of seconds, not {liveness_timeout!r}")
    if configure_logs:
        configure_logging(log_level)
    config = SystemConfig(
        strict=strict,
        lookup_timeout=lookup_timeout,
        stop_grace=stop_grace,
        mailbox_size=mailbox_size,
        max_message_size=max_message_size,
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
    return Plan(config, options, setup, tune_gc=tune_gc, status=_status_address(*status))


def _is_port(port: object) -> bool:
    return is_count(port, 0) and isinstance(port, int) and port <= 65535


def _status_address(host: str, port: int | None) -> tuple[str, int] | None:
    """Where rank 0 serves the status: ``status_port``, else ``ACTORCH_STATUS_PORT``, else nowhere."""
    if port is None:
        found = os.environ.get(STATUS_PORT_ENV)
        if not found:
            return None
        if not found.isdigit() or not _is_port(int(found)):
            raise ValueError(f"{STATUS_PORT_ENV} must be a port (0..65535), not {found!r}")
        port = int(found)
    if not _is_port(port):
        raise ValueError(f"status_port must be an int in 0..65535 (0: a free one), or None, not {port!r}")
    return host, port


def _requested_world_size(world_size: int | None) -> tuple[int | None, bool]:
    """``world_size``, or what ``actorch run`` asked for in ``ACTORCH_WORLD_SIZE``; and whether a launcher set it.

    ``ACTORCH_WORLD_SIZE=launcher`` (``actorch run`` handing over to torchrun)
    means: the world torchrun starts, whatever ``world_size`` says.
    """
    asked = os.environ.get(WORLD_SIZE_ENV)
    if not asked:
        return world_size, False
    if asked == "launcher":
        return None, True
    if not asked.isdigit() or int(asked) < 1:
        raise ValueError(f"{WORLD_SIZE_ENV} must be a positive int, not {asked!r}")
    return int(asked), True


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
    token = _elastic_token(world_size, plan, under_torchrun=under_torchrun)
    return _launch_local(main, world_size or 1, host, plan, port, traits, token)


def _launch_traits(resources: ResourceSpec, world_size: int) -> list[NodeTraits]:
    """What each node of a local launch says of itself: the resources it declares; rank 0 starts node processes."""
    declared = declared_resources(resources, world_size)
    return [NodeTraits(resources=declared.get(rank, {}), pool=rank == 0) for rank in range(world_size)]


def _open_alone(host: str, port: int, plan: Plan) -> ElasticRpcTransport:
    """The elastic world a system of one node opens when it first starts a node process (only those may join)."""
    listener = listen_socket(host, port)
    port = listener.getsockname()[1]
    options = dataclasses.replace(plan.options, device_maps=None)
    shared = shared_settings(plan)
    return ElasticRpcTransport(
        0, host, port, options, token=new_token(), listener=listener, shared=shared, public=False
    )


def _elastic_token(world_size: int | None, plan: Plan, *, under_torchrun: bool) -> str:
    """Check an elastic launch's options; the join token (``ACTORCH_JOIN_TOKEN``, else a new one)."""
    if under_torchrun:
        raise ValueError("elastic=True starts from a plain script, not under torchrun (torchrun fixes the world)")
    if plan.options.device_maps is not None and plan.options.device_maps != "auto":
        raise ValueError("an elastic system has no device maps (GPU tensors are staged): leave device_maps alone")
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size must be a positive int, not {world_size!r}")
    return os.environ.get(TOKEN_ENV) or new_token()


def _launch_local(
    main: Main[T],
    world_size: int,
    host: str,
    plan: Plan,
    port: int,
    traits: list[NodeTraits],
    token: str | None = None,
) -> T:
    transport, workers = _local_world(world_size, host, plan, port, traits, token)
    try:
        return run_bounded(_lead(main, transport, plan, workers), interrupts=_interrupts(plan, workers))
    finally:
        reap_workers(workers)


def _local_world(
    world_size: int, host: str, plan: Plan, port: int, traits: list[NodeTraits], token: str | None = None
) -> tuple[Transport, list[Any]]:
    """Rank 0's transport for a local launch, and the other ranks' processes, started.

    An elastic launch has a join ``token``. Any other runs on an elastic world
    too, private to the node processes it starts itself (``add_nodes``), so
    that it can start them; except with device maps, which only a static world
    has. One node alone needs no network until it starts one (``LoneTransport``).
    """
    if world_size == 1 and token is None:
        alone = LoneTransport(functools.partial(_open_alone, host, port, plan))
        alone.traits = traits[0]
        return alone, []
    public = token is not None
    if token is None and can_grow(plan.options):
        token = new_token()
    listener = listen_socket(host, port)
    port = listener.getsockname()[1]
    workers = _spawn_workers(world_size, host, port, plan, token, traits)
    try:
        return _rank0_transport(world_size, host, port, plan, listener, token, traits[0], public=public), workers
    except BaseException:
        kill_workers(workers)
        listener.close()
        raise


def _spawn_workers(
    world_size: int, host: str, port: int, plan: Plan, token: str | None, traits: list[NodeTraits]
) -> list[Any]:
    """Start ranks 1 to ``world_size - 1`` as local processes that serve actors (rank 0's store is at ``port``)."""
    context = multiprocessing.get_context("spawn")
    with environment({**_QUIET_ENV, WORKER_OF_ENV: str(os.getpid())}):
        workers = [
            context.Process(
                target=_serve,
                args=(World(rank, world_size, host, port, token, traits=traits[rank]), plan),
                name=f"actorch-node{rank}",
                daemon=True,
            )
            for rank in range(1, world_size)
        ]
        for worker in workers:
            worker.start()
    return workers


def _rank0_transport(
    world_size: int,
    host: str,
    port: int,
    plan: Plan,
    listener: socket.socket,
    token: str | None,
    traits: NodeTraits,
    *,
    public: bool = True,
) -> RpcTransport:
    """Rank 0's torch RPC transport for a local launch; elastic when there is a join ``token`` (``public`` or not)."""
    transport: RpcTransport
    if token is None:
        transport = RpcTransport(0, world_size, host, port, plan.options, listener)
    else:
        transport = ElasticRpcTransport(
            0,
            host,
            port,
            plan.options if public else dataclasses.replace(plan.options, device_maps=None),
            token=token,
            initial=world_size,
            listener=listener,
            shared=shared_settings(plan),
            public=public,
        )
    transport.traits = traits
    return transport


def _interrupts(plan: Plan, workers: list[Any] | None = None) -> InterruptPolicy:
    """Ctrl-C's and SIGTERM's bounds on rank 0, from ``stop_grace``; a forced end kills the local workers.

    ``main`` gets ``stop_grace + 1`` seconds to take the interrupt, as a
    stopping actor's handlers get ``stop_grace`` (the second keeps
    ``stop_grace=0`` from racing the signal handler), and the orderly shutdown
    then gets the bound that ``run`` keeps after ``main`` ends. SIGTERM (what
    schedulers send) ends the run the same way: every actor stops in order.
    """
    grace = plan.config.stop_grace
    return InterruptPolicy(
        respond_within=grace + 1.0,
        finish_within=4 * grace + 12.0,
        on_force=(lambda: kill_workers(workers)) if workers is not None else None,
        terminate=True,
    )


def _give_pool(host: ActorHost, transport: Transport, plan: Plan, workers: list[Any] | None) -> None:
    """Let rank 0's node start node processes on this host (``add_nodes``), or say why it cannot."""
    refusal = grow_refusal(transport, under_torchrun=all(var in os.environ for var in _TORCHRUN_VARS))
    if refusal is not None or workers is None:
        host.pool.refusal = refusal or host.pool.refusal
        return
    arguments = functools.partial(_newcomer_arguments, plan)
    host.pool.launcher = LocalLauncher(_serve_newcomer, arguments, transport.invitation, workers)


async def _lead(main: Main[T], transport: Transport, plan: Plan, workers: list[Any] | None = None) -> T:
    launched = list(workers or ())  # the launch's own workers, ranks 1..; processes started later join the list
    system, host = await start_node(
        transport, plan, launched, functools.partial(_give_pool, transport=transport, plan=plan, workers=workers)
    )
    failed = True
    status = None
    announced = Announcement(system.world_size, None)
    try:
        if plan.status is not None:
            status = StatusServer(host, *plan.status)
            await status.start()
            announced.status = status_address(plan.status[0], status.port)
        _announce(announced, host)
        result = await main(system)
        failed = False
        return result
    finally:
        announced.withdraw()
        if status is not None:
            await status.close()
        silent = await asyncio.shield(_shutdown_world(host, failed))
        for rank in silent:
            kill_lost(launched, rank)  # its loop is stuck: do not wait for its watchdog


def _announce(announced: Announcement, host: ActorHost) -> None:
    """Write rank 0's runtime file, for ``actorch status`` and ``actorch stop``; a failure is only logged."""
    try:
        path = announced.publish()
    except OSError as exc:
        host.node.log.warning("runtime file not written: actorch status will not find this system", error=str(exc))
    else:
        host.node.log.debug("runtime file written", path=str(path))


async def _shutdown_world(host: ActorHost, failed: bool) -> list[int]:
    """Stop every actor everywhere (``on_stop`` runs), then close this node; the workers follow.

    Rank 0 leaves first: each worker sees it go and exits, with code 1 if
    ``main`` failed. The other order makes torch log every dropped connection
    at rank 0, where torch may have been imported before its C++ log level
    could be set. Each node's share is bounded by ``2 * stop_grace`` (messages,
    then ``on_stop``) plus ``SHUTDOWN_TIMEOUT``.

    Returns:
        The ranks that did not answer in time (their event loop may be stuck).
    """
    node = host.node
    node.transport.stop_admitting()  # a node let in now would miss the shutdown
    peers = [rank for rank in node.ranks() if rank != 0 and rank not in node.lost]
    limit = 2 * host.config.stop_grace + SHUTDOWN_TIMEOUT
    answered = await _call_all(host, peers, NodeService.shutdown, limit, failed)
    await host.stop_all()
    node.departing = True
    await node.close()
    return [rank for rank, ok in zip(peers, answered, strict=True) if not ok]


async def _call_all(host: ActorHost, ranks: list[int], endpoint: Any, limit: float, *args: Any) -> list[bool]:
    """Call ``endpoint`` of every rank's service at once; whether each answered within ``limit`` seconds."""

    async def one(rank: int) -> bool:
        try:
            async with asyncio.timeout(limit):
                await host.services[rank].call(endpoint, *args)
        except (NodeLostError, ActorStoppedError):
            return True  # it is gone already, or it left the system meanwhile
        except Exception as exc:  # noqa: BLE001 - a node that fails here is reported, not fatal
            host.node.log.warning("node did not answer shutdown", peer=rank, error=repr(exc))
            return False
        return True

    return list(await asyncio.gather(*(one(rank) for rank in ranks)))
