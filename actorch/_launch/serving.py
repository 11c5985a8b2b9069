"""What every node process runs: start its node, serve actors until the system ends, and ``actorch.serve``.

``run`` (``run.py``) starts a system and leads it from rank 0. Every other node
serves, by one of three entry points: a worker the launch started
(``_serve``), a process that joins a running elastic system by itself
(``serve``, also the ``actorch serve`` command and a host agent), and a node
process the system started on demand (``_serve_newcomer``, for ``add_nodes``
and an actor's own process). Each opens its node (``_start``), serves until
rank 0 ends the system, or this node leaves, or rank 0 is lost, and exits in
bounded time. The plan every node of a launch starts with, and how a node's
transport is made, live here too, with the reaping of local processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import inspect
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from actorch._actors.host import ActorHost
from actorch._actors.system import ActorSystem
from actorch._actors.system_node import NodeSystem, open_system
from actorch._base.config import SystemConfig, is_number
from actorch._base.resources import check_resources
from actorch._launch.eventloop import Watchdog, run_bounded
from actorch._launch.guard import worker_report
from actorch._launch.logs import configure_logging
from actorch._launch.nodes import LocalLauncher, ParentWatch
from actorch._transport.base import NodeTraits, Transport
from actorch._transport.elastic import ElasticRpcTransport, prepare_join
from actorch._transport.membership import ADDRESS_ENV, TOKEN_ENV, parse_address
from actorch._transport.rpc import RpcTransport
from actorch._transport.rpc_setup import RpcOptions

__all__ = [
    "JOIN_TIMEOUT",
    "SHUTDOWN_TIMEOUT",
    "Setup",
    "SystemSetup",
    "join_target",
    "serve",
    "takes_system",
    "tune_gc",
]

JOIN_TIMEOUT = 10.0
"""Seconds the launch waits for each local process to exit once the system has ended, before it kills it."""

SHUTDOWN_TIMEOUT = 5.0
"""Seconds past the actors' own bounds (``2 * stop_grace``) that a node's shutdown may take."""


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
                transport.stop_admitting()  # rank 0 of an elastic world stops waiting for the launch's workers
                await asyncio.wait([starting])
                codes = ", ".join(_exit_of(worker) for worker in dead)
                raise RuntimeError(f"actor system failed to start: {codes}")
        starting.result()
    except BaseException:
        await asyncio.shield(_abandon_start(host))
        raise
    if plan.tune_gc:
        tune_gc()
    if workers:
        node = host.node
        host.node.on_peer_lost(lambda rank, why: None if rank in node.left else _kill_lost(workers, rank))
    return system, host


async def _abandon_start(host: ActorHost) -> None:
    """A node whose start failed stops what it hosts and closes (its agent may be up: the exit would abort).

    Peers reach a node of an elastic world as soon as its torch RPC agent is
    up, before its start returns: they may have spawned actors here already,
    whose ``on_stop`` runs now.
    """
    host.node.departing = True
    with contextlib.suppress(Exception):
        await host.stop_all()
    with contextlib.suppress(Exception):
        await host.node.close()


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
        assert isinstance(system, NodeSystem)  # what _serve_async opened
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
            ``Where(process="own", host=...)`` start their processes here
            (``setup`` runs on this node only). They end with this node: when
            it leaves, they leave first; if it dies, they leave by themselves.
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
        arguments = functools.partial(_newcomer_arguments, dataclasses.replace(plan, setup=None))  # setup: here only
        launcher = LocalLauncher(_serve_newcomer, arguments, _invitation(address, token), children)
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
    and 1 when ``main`` raised (0 under torchrun, whose summary then names
    rank 0's error) or rank 0 was lost.
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
    if host.exit_code and "TORCHELASTIC_RUN_ID" in os.environ:
        # main failed on rank 0, which reports it. torchrun names the first process to fail as the root
        # cause of the run: a worker that ended with it would take the place of main's error in the summary.
        return 0
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
