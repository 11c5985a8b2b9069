"""``actorch.run``: start the world, run ``main`` on rank 0, and always shut down in bounded time.

Three ways to start: one process (``world_size`` 1 or None, in-process transport);
a plain script with ``world_size=N`` (this process is rank 0 and spawns N-1
local workers on loopback, on a free port); or under ``torchrun`` (the world
comes from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT). With
``elastic=True`` the world takes new nodes while it runs: ``actorch.serve``
joins one from any process that has the system's address and join token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import inspect
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, cast

from actorch._actors.host import ActorHost
from actorch._actors.service import NodeService
from actorch._actors.system import ActorSystem, open_system
from actorch._base.config import DEFAULT_MAX_MESSAGE, DEFAULT_WINDOW, SystemConfig, is_count, is_number
from actorch._base.errors import ActorStoppedError, NodeLostError
from actorch._base.resources import check_resources
from actorch._launch.eventloop import InterruptPolicy, Watchdog, run_bounded
from actorch._launch.guard import WORKER_OF_ENV, refuse_run_while_imported, worker_report
from actorch._launch.logs import configure_logging
from actorch._launch.nodes import (
    LocalLauncher,
    ParentWatch,
    ResourceSpec,
    can_grow,
    declared_resources,
    environment,
    grow_refusal,
)
from actorch._launch.runtime import Announcement, status_address
from actorch._launch.status import STATUS_PORT_ENV, StatusServer, check_status_port
from actorch._transport.base import NodeTraits, Transport
from actorch._transport.elastic import ElasticRpcTransport, prepare_join
from actorch._transport.lone import LoneTransport
from actorch._transport.membership import ADDRESS_ENV, TOKEN_ENV, new_token, parse_address
from actorch._transport.network import listen_socket
from actorch._transport.rpc import RpcTransport
from actorch._transport.rpc_setup import DeviceMapSpec, RpcOptions

__all__ = ["run", "serve"]

T = TypeVar("T")
Main = Callable[[ActorSystem], Awaitable[T]]

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_QUIET_ENV = {"TORCH_CPP_LOG_LEVEL": "ERROR"}
SHUTDOWN_TIMEOUT = 5.0
"""Seconds past the actors' own bounds (``2 * stop_grace``) that a node's shutdown may take."""
JOIN_TIMEOUT = 10.0
WORLD_SIZE_ENV = "ACTORCH_WORLD_SIZE"
"""Set by ``actorch run -n N``: the number of local processes, in place of ``run``'s ``world_size``."""
YOUNG_GC_THRESHOLD = 3_000
"""Allocations between two collections of the young generation when ``run`` tunes the collector (Python: 700)."""
OLD_GC_THRESHOLD = 100
"""Collections of the middle generation between two full ones when ``run`` tunes the collector (Python: 10)."""


Setup = Callable[[int], object]
"""A function run on every node with its rank before the node serves (may return an awaitable)."""
SystemSetup = Callable[[ActorSystem], object]
"""A ``serve`` setup that asks for the node's system: run once the node has joined (may return an awaitable)."""


@dataclass(frozen=True)
class _Plan:
    """What every node of a launch is started with."""

    config: SystemConfig
    options: RpcOptions
    setup: Setup | None
    tune_gc: bool
    status: tuple[str, int] | None = None  # where rank 0 serves the status (actorch status), if anywhere


@dataclass(frozen=True)
class _World:
    rank: int
    world_size: int
    host: str
    port: int
    token: str | None = None  # an elastic world's join token ("" to ask without one); None: a static world
    label: str | None = None
    traits: NodeTraits | None = None  # what the node says of itself (label, declared resources...), if more than label
    invited: bool = False  # a process the system started itself (add_nodes): a system that is not elastic takes it


@dataclass(frozen=True)
class _Newcomer:
    """What a node process started on demand (``add_nodes``) needs to join its system."""

    host: str
    port: int
    token: str
    traits: NodeTraits
    plan: _Plan


def _shared(plan: _Plan) -> dict[str, Any]:
    """The settings an elastic system's newcomers must run with (json-ready)."""
    local = ("device_maps", "init_timeout")  # elastic worlds have no maps; each newcomer waits as it chooses
    options = {key: value for key, value in dataclasses.asdict(plan.options).items() if key not in local}
    return {"config": dataclasses.asdict(plan.config), "options": options}


def _plan_from(shared: dict[str, Any], setup: Setup | None, join_timeout: float) -> _Plan:
    """The plan of a newcomer to an elastic system, from the settings its rank 0 published."""
    options = RpcOptions(device_maps=None, init_timeout=join_timeout, **shared["options"])
    return _Plan(SystemConfig(**shared["config"]), options, setup, tune_gc=True)


def run(
    main: Main[T],
    world_size: int | None = None,
    *,
    strict: bool = False,
    transport: str = "uv",
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
        world = _World(
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
        return run_bounded(_lead(main, _rpc_transport(world, plan.options), plan), interrupts=_interrupts(plan))
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
) -> _Plan:
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
    return _Plan(config, options, setup, tune_gc=tune_gc, status=_status_address(*status))


def takes_system(setup: Callable[..., object]) -> bool:
    """Whether ``setup`` asks for the node's system: its first parameter is named ``system`` or annotated so."""
    try:
        parameters = list(inspect.signature(setup).parameters.values())
    except (TypeError, ValueError):  # a callable without a signature takes the rank, as always
        return False
    if not parameters:
        return False
    first = parameters[0]
    annotation = first.annotation
    named = annotation.rpartition(".")[2] if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    return first.name == "system" or annotation is ActorSystem or named == "ActorSystem"


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
    plan: _Plan,
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


def _open_alone(host: str, port: int, plan: _Plan) -> ElasticRpcTransport:
    """The elastic world a system of one node opens when it first starts a node process (only those may join)."""
    listener = listen_socket(host, port)
    port = listener.getsockname()[1]
    options = dataclasses.replace(plan.options, device_maps=None)
    shared = _shared(plan)
    return ElasticRpcTransport(
        0, host, port, options, token=new_token(), listener=listener, shared=shared, public=False
    )


def _elastic_token(world_size: int | None, plan: _Plan, *, under_torchrun: bool) -> str:
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
    plan: _Plan,
    port: int,
    traits: list[NodeTraits],
    token: str | None = None,
) -> T:
    transport, workers = _local_world(world_size, host, plan, port, traits, token)
    try:
        return run_bounded(_lead(main, transport, plan, workers), interrupts=_interrupts(plan, workers))
    finally:
        _reap(workers)


def _local_world(
    world_size: int, host: str, plan: _Plan, port: int, traits: list[NodeTraits], token: str | None = None
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
        _kill_workers(workers)
        listener.close()
        raise


def _spawn_workers(
    world_size: int, host: str, port: int, plan: _Plan, token: str | None, traits: list[NodeTraits]
) -> list[Any]:
    """Start ranks 1 to ``world_size - 1`` as local processes that serve actors (rank 0's store is at ``port``)."""
    context = multiprocessing.get_context("spawn")
    with environment({**_QUIET_ENV, WORKER_OF_ENV: str(os.getpid())}):
        workers = [
            context.Process(
                target=_serve,
                args=(_World(rank, world_size, host, port, token, traits=traits[rank]), plan),
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
    plan: _Plan,
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
            shared=_shared(plan),
            public=public,
        )
    transport.traits = traits
    return transport


def _interrupts(plan: _Plan, workers: list[Any] | None = None) -> InterruptPolicy:
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
        on_force=(lambda: _kill_workers(workers)) if workers is not None else None,
        terminate=True,
    )


def _kill_workers(workers: list[Any]) -> str:
    """Kill the local workers that are still alive and reap them (for 1 s at most); say how many."""
    alive = [worker for worker in workers if worker.is_alive()]
    for worker in alive:
        worker.kill()
    deadline = time.monotonic() + 1.0
    for worker in alive:
        worker.join(max(0.0, deadline - time.monotonic()))
    return f"killed {len(alive)} local worker{'' if len(alive) == 1 else 's'}"


def _reap(workers: list[Any]) -> None:
    for worker in workers:
        worker.join(JOIN_TIMEOUT)
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(1.0)


def tune_gc() -> None:
    """Freeze what lives now (it lives all run) and collect the young generation less often (see ``run``)."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), middle, max(old, OLD_GC_THRESHOLD))


def _rpc_transport(world: _World, options: RpcOptions) -> RpcTransport:
    transport: RpcTransport
    if world.token is not None:
        transport = ElasticRpcTransport(
            world.rank, world.host, world.port, options, token=world.token, label=world.label, invited=world.invited
        )
    else:
        transport = RpcTransport(world.rank, world.world_size, world.host, world.port, options)
    if world.traits is not None:
        transport.traits = world.traits
    return transport


async def _leave_when(asked: asyncio.Event, host: ActorHost) -> None:
    """Begin ``host``'s node's leave once ``asked`` is set (SIGTERM came)."""
    await asked.wait()
    host.node.log.info("SIGTERM: leaving the system")
    host.begin_leave()


def _follow_rank0_on_sigterm(watchdog: Watchdog) -> None:
    """On SIGTERM, let rank 0 lead the shutdown (it most likely got one too), and exit by force if it does not.

    A process forked from this one (a data loader's worker) still ends on
    SIGTERM. Only in the main thread, and only where SIGTERM is at its default.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return
    owner = os.getpid()

    def on_sigterm(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        watchdog.arm("SIGTERM (rank 0 did not end the system)")

    signal.signal(signal.SIGTERM, on_sigterm)


def _on_signal(signum: int, handler: Callable[[], None]) -> bool:
    """Run ``handler`` on the loop when ``signum`` comes; False where that cannot be (not the main thread)."""
    try:
        asyncio.get_running_loop().add_signal_handler(signum, handler)
    except (ValueError, RuntimeError, NotImplementedError):
        return False
    return True


async def _start(
    transport: Transport,
    plan: _Plan,
    workers: list[Any] | None = None,
    prepare: Callable[[ActorHost], None] | None = None,
) -> tuple[ActorSystem, ActorHost]:
    """Open this node's system and join the world; ``prepare`` gets the host before other nodes can ask it anything."""
    if plan.setup is not None:
        done = plan.setup(transport.rank)
        if inspect.isawaitable(done):
            await done
    system, host = open_system(transport, plan.config)
    if prepare is not None:
        prepare(host)
    await host.start_services()
    starting = asyncio.ensure_future(transport.start())
    while not starting.done():
        await asyncio.wait([starting], timeout=0.1)
        dead = [worker for worker in workers or () if worker.exitcode is not None]
        if dead and not starting.done():
            starting.cancel()
            transport.stop_admitting()  # rank 0 of an elastic world stops waiting for the launch's workers
            await asyncio.wait([starting])
            with contextlib.suppress(Exception):  # its agent may be up already: take it down, or the exit aborts
                await transport.close()
            codes = ", ".join(_exit_of(worker) for worker in dead)
            raise RuntimeError(f"actor system failed to start: {codes}")
    starting.result()
    if plan.tune_gc:
        tune_gc()
    if workers:
        node = host.node
        host.node.on_peer_lost(lambda rank, why: None if rank in node.left else _kill_lost(workers, rank))
    return system, host


def _give_pool(host: ActorHost, transport: Transport, plan: _Plan, workers: list[Any] | None) -> None:
    """Let rank 0's node start node processes on this host (``add_nodes``), or say why it cannot."""
    refusal = grow_refusal(transport, under_torchrun=all(var in os.environ for var in _TORCHRUN_VARS))
    if refusal is not None or workers is None:
        host.pool.refusal = refusal or host.pool.refusal
        return
    arguments = functools.partial(_newcomer_arguments, plan)
    host.pool.launcher = LocalLauncher(_serve_newcomer, arguments, transport.invitation, workers)


def _newcomer_arguments(plan: _Plan, address: str, token: str, traits: NodeTraits) -> tuple[_Newcomer]:
    host, port = parse_address(address)
    options = dataclasses.replace(plan.options, device_maps=None)
    return (_Newcomer(host, port, token, traits, dataclasses.replace(plan, options=options, status=None)),)


def _serve_newcomer(newcomer: _Newcomer) -> NoReturn:
    """Entry point of a node process started on demand: join the system, serve until it ends or this node leaves.

    It ends as the launch's workers do: Ctrl-C is rank 0's to lead, SIGTERM
    waits for rank 0 to end the system, and it goes when the process that
    started it goes (``ParentWatch``). An actor's own process leaves once its
    actor stops.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    plan = newcomer.plan
    watch = ParentWatch(2 * plan.config.stop_grace + SHUTDOWN_TIMEOUT)
    configure_logging()
    timeout = plan.options.init_timeout
    rank, _ = prepare_join(newcomer.host, newcomer.port, timeout, invited=True)
    world = _World(rank, 0, newcomer.host, newcomer.port, newcomer.token, traits=newcomer.traits, invited=True)

    def serving(system: ActorSystem) -> None:
        watch.serving(system._host)
        if newcomer.traits.owner is not None:
            system._host.pool.expect_owner()

    raise SystemExit(run_bounded(_serve_async(world, plan, serving)))


def _exit_of(worker: Any) -> str:
    """How a local worker ended during the start: its exit code, and the reason it reported, if any."""
    report = worker_report(worker.pid)
    return f"{worker.name} exited with code {worker.exitcode}" + (f": {report}" if report else "")


def _kill_lost(workers: list[Any], rank: int) -> None:
    """Kill a local worker process that was lost while still running (stopped, cut off).

    Its names and calls are already gone; killed, it cannot come back as a
    stale node, and shutdown need not wait for it. Ranks that joined from
    elsewhere are not this process's to kill.
    """
    if not 1 <= rank <= len(workers):
        return
    worker = workers[rank - 1]
    if worker.is_alive():
        worker.kill()


async def _lead(main: Main[T], transport: Transport, plan: _Plan, workers: list[Any] | None = None) -> T:
    launched = list(workers or ())  # the launch's own workers, ranks 1..; processes started later join the list
    system, host = await _start(
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
            _kill_lost(launched, rank)  # its loop is stuck: do not wait for its watchdog


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


def serve(
    address: str | None = None,
    *,
    name: str | None = None,
    setup: Setup | SystemSetup | None = None,
    join_timeout: float = 60.0,
    resources: Mapping[str, float] | None = None,
    pool: bool = False,
    log_level: str | None = None,
    configure_logs: bool = True,
) -> int:
    """Join a running elastic system from this process, and serve actors until it ends or this node leaves.

    The node gets a fresh rank; every node sees ``NodeJoined``, and actors can
    be spawned on it. It runs with the settings the system was started with.
    The join token comes from ``ACTORCH_JOIN_TOKEN`` only (an environment
    variable, never an argument, so it stays off command lines). SIGTERM makes
    the node leave gracefully (``system.leave()``). Use it as
    ``sys.exit(actorch.serve())``.

    Args:
        address: The system's ``host:port`` (rank 0's); None reads ``ACTORCH_ADDRESS``.
        name: A label for this node, shown in ``system.nodes`` (``NodeInfo.label``).
        setup: As ``run``'s: called with this node's rank before it serves.
            A ``setup`` whose first parameter is named ``system`` (or
            annotated ``ActorSystem``) is called instead with the node's
            system once the node has joined (it may spawn, look up and call;
            the node serves meanwhile); if it raises, the node leaves and
            ``serve`` raises the error.
        join_timeout: Seconds to wait for the system to answer.
        resources: Amounts of resources this node declares over the CPUs,
            memory and GPUs it detects (``{"env_slots": 4}``), for ``Where`` placement.
        pool: Make this node the host agent of its host: ``add_nodes(...,
            host=...)`` (by this host's name or this node's ``name``) and
            ``Where(process="own", host=...)`` start their processes here. They
            end with this node: when it leaves, they leave first; if it dies,
            they leave by themselves.
        log_level: Log level for actorch's structlog output (else ``ACTORCH_LOG_LEVEL``).
        configure_logs: Configure structlog here (unless the program already did).

    Returns:
        The process's exit code: 0 when the system ended after ``main``
        returned or this node left; 1 when ``main`` raised or rank 0 was lost.

    Raises:
        JoinError: The system refused this node (a wrong or missing token),
            does not take new nodes, is shutting down, or did not answer.
        ValueError: No address, a malformed one, a bad ``name`` or ``resources``.
    """
    if configure_logs:
        configure_logging(log_level)
    host, port = join_target("serve", address, name, join_timeout)
    if setup is not None and not callable(setup):
        raise TypeError(f"setup must be a function of the node's rank or of its system, not {setup!r}")
    traits = NodeTraits(name, check_resources(resources), pool=bool(pool))
    joined = cast(SystemSetup, setup) if setup is not None and takes_system(setup) else None
    rank, shared = prepare_join(host, port, join_timeout)
    plan = _plan_from(shared, None if joined else cast(Setup | None, setup), join_timeout)
    token = os.environ.get(TOKEN_ENV, "")
    world = _World(rank, 0, host, port, token, name, traits)
    children: list[Any] = []
    launcher = None
    if pool:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        launcher = LocalLauncher(
            _serve_newcomer, functools.partial(_newcomer_arguments, plan), _invitation(address, token), children
        )
    try:
        return run_bounded(_serve_async(world, plan, joined, launcher))
    finally:
        _reap(children)


def _invitation(address: str, token: str) -> Callable[[], Awaitable[tuple[str, str]]]:
    """Where a host agent's processes join, and with which token: those it joined with itself."""

    async def invitation() -> tuple[str, str]:
        return address, token

    return invitation


def join_target(caller: str, address: str | None, name: str | None, join_timeout: float) -> tuple[str, int]:
    """Check what joining a system takes (for ``serve`` and ``connect``); the system's host and port.

    ``address`` None reads ``ACTORCH_ADDRESS``.
    """
    address = address or os.environ.get(ADDRESS_ENV)
    if not address:
        raise ValueError(f"{caller}() needs the system's address: pass address= or set {ADDRESS_ENV}")
    host, port = parse_address(address)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"name must be a non-empty str or None, not {name!r}")
    if not is_number(join_timeout, inclusive=False):
        raise ValueError(f"join_timeout must be a positive number of seconds, not {join_timeout!r}")
    return host, port


def _serve(world: _World, plan: _Plan) -> NoReturn:
    """Entry point of a worker rank: serve actors until rank 0 ends the system, then exit.

    The exit code is 0 when rank 0 ended the system after ``main`` returned,
    and 1 when ``main`` raised or rank 0 was lost.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 leads the shutdown on Ctrl-C
    configure_logging()
    raise SystemExit(run_bounded(_serve_async(world, plan)))


async def _serve_async(
    world: _World, plan: _Plan, joined: SystemSetup | None = None, launcher: LocalLauncher | None = None
) -> int:
    """Serve actors as node ``world.rank`` until the system ends or this node leaves; the exit code.

    ``joined`` (``serve``'s ``setup`` that asks for the system) is called once
    the node has joined; if it raises, the node leaves and the error propagates.
    With a ``launcher``, the node starts node processes on its host when asked.
    """
    transport = _rpc_transport(world, plan.options)
    watchdog = Watchdog(2 * plan.config.stop_grace + SHUTDOWN_TIMEOUT)

    def on_lost(rank: int, why: str) -> None:  # on a torch thread: works while the loop is stuck too
        if rank == 0:
            watchdog.arm(f"rank 0 was lost ({why})")

    transport.lost_in_thread = on_lost
    # SIGTERM makes a node of an elastic system leave gracefully; one that comes while it joins waits for the join.
    # A static world's node waits for rank 0 to end the system (a scheduler signals every process), bounded.
    terminated = asyncio.Event()
    leave_on_term = transport.elastic and _on_signal(signal.SIGTERM, terminated.set)
    if not transport.elastic:
        _follow_rank0_on_sigterm(watchdog)
    try:
        system, host = await _start(transport, plan, prepare=None if launcher is None else launcher.serve)
    except BaseException:
        if leave_on_term:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        raise
    leaving = asyncio.ensure_future(_leave_when(terminated, host))
    failed: Exception | None = None
    try:
        if joined is not None:
            failed = await _set_up(joined, system, host)
        await host.wait_ended()
        host.node.departing = True
        await host.stop_all()
    finally:
        leaving.cancel()
        if leave_on_term:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        await host.node.close()
    if failed is not None:
        raise failed
    if host.exit_code is None:
        host.node.log.error("rank 0 was lost; this node shut down", why=host.node.lost.get(0))
        return 1
    return host.exit_code


async def _set_up(setup: SystemSetup, system: ActorSystem, host: ActorHost) -> Exception | None:
    """Run a ``setup`` that takes the system, on a node that has joined; if it raises, begin the leave and say why."""
    try:
        done = setup(system)
        if inspect.isawaitable(done):
            await done
    except Exception as exc:  # noqa: BLE001 - handed back once the node has left
        host.node.log.error("setup failed; this node leaves the system", error=repr(exc))
        host.begin_leave()
        return exc
    return None
