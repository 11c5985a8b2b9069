"""What every node process runs but rank 0: serve actors until the system ends, and ``actorch.serve``.

``run`` (``run.py``) starts a system and leads it from rank 0. Every other node
serves, by one of three entry points: a worker the launch started
(``_serve``), a process that joins a running elastic system by itself
(``serve``, also the ``actorch serve`` command and a host agent), and a node
process the system started on demand (``_serve_newcomer``, for ``add_nodes``
and an actor's own process). Each opens its node (``start_node``, in
``startup``), serves until rank 0 ends the system, or this node leaves, or
rank 0 is lost, and exits in bounded time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from actorch._actors.node.host import ActorHost
from actorch._actors.node.node_system import NodeSystem
from actorch._actors.system import ActorSystem
from actorch._base.config import is_number
from actorch._base.resources import check_resources
from actorch._launch.options.environment import effective_log_level
from actorch._launch.options.setup import Setup, SystemSetup, takes_system
from actorch._launch.services.logs import configure_logging
from actorch._launch.world.eventloop import Watchdog, run_bounded
from actorch._launch.world.nodes import LocalLauncher, ParentWatch
from actorch._launch.world.startup import SHUTDOWN_TIMEOUT, Plan, World, node_transport, plan_from, start_node
from actorch._launch.world.workers import reap_workers
from actorch._transport.base import NodeTraits
from actorch._transport.capabilities import is_elastic
from actorch._transport.kinds import prepare_join
from actorch._transport.membership import ADDRESS_ENV, TOKEN_ENV, parse_address

__all__ = [
    "END_BLOCKED",
    "NEWCOMER_JOIN_TIMEOUT",
    "describe_running",
    "join_target",
    "serve",
]

NEWCOMER_JOIN_TIMEOUT = 60.0
"""Seconds a node process started on demand waits for its system's rendezvous to answer."""

END_BLOCKED = "end blocked"
"""What rank 0 asks a node off its loop (``Transport.ask_off_loop``) to end it: its loop stayed blocked at shutdown."""


@dataclass(frozen=True)
class _Newcomer:
    """What a node process started on demand (``add_nodes``) needs to join its system."""

    host: str
    port: int
    token: str
    traits: NodeTraits
    plan: Plan


def describe_running(running: Mapping[str, Any] | None) -> str:
    """The handler a node runs on its loop's thread now (``Node.answer_off_loop``'s ``running``), in words."""
    if not running:
        return "no handler (something else holds its event loop)"
    seconds = running.get("seconds")
    since = "" if seconds is None else f" (running for {seconds:.1f} s)"
    return f"handler {running['endpoint']!r} of {running['actor']}{since}"


def _answer_or_end(host: ActorHost, watchdog: Watchdog, question: str) -> Any:
    """A node's answer to another node's question off its loop; ``END_BLOCKED`` ends its process instead.

    Rank 0 asks it when this node's event loop stayed blocked by a handler
    ``stop_grace`` into the shutdown (nothing can stop that handler), as it
    kills a local worker of its own: on a thread of the transport, which
    still runs.
    """
    if question == END_BLOCKED:
        running = describe_running(host.answer_off_loop("loop").get("running"))
        grace = host.config.stop_grace
        host.log.warning("node ended: its event loop is blocked", handler=running, stop_grace=grace)
        watchdog.end_now(f"{running} blocks its event loop {grace:g} s into the shutdown, which rank 0 ends without it")
    return host.answer_off_loop(question)


async def _leave_when(asked: asyncio.Event, host: ActorHost) -> None:
    """Begin ``host``'s node's leave once ``asked`` is set (SIGTERM came)."""
    await asked.wait()
    host.log.info("SIGTERM: leaving the system")
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


def _newcomer_arguments(plan: Plan, address: str, token: str, traits: NodeTraits) -> tuple[_Newcomer]:
    host, port = parse_address(address)
    joining = dataclasses.replace(plan, transport=plan.transport.joining(), status=None)
    return (_Newcomer(host, port, token, traits, joining),)


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
    configure_logging(plan.log_level)
    rank, _ = prepare_join(newcomer.host, newcomer.port, NEWCOMER_JOIN_TIMEOUT, invited=True, options=plan.transport)
    world = World(rank, 0, newcomer.host, newcomer.port, newcomer.token, traits=newcomer.traits, invited=True)

    def serving(system: ActorSystem) -> None:
        assert isinstance(system, NodeSystem)  # what _serve_async opened
        watch.serving(system.host)
        if newcomer.traits.owner is not None:
            system.host.pool.expect_owner()

    raise SystemExit(run_bounded(_serve_async(world, plan, serving)))


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
        log_level: As ``run``'s, for this node and the node processes it starts (with ``pool``).
        configure_logs: Configure structlog here (unless the program already did).

    Returns:
        The process's exit code: 0 when the system ended after ``main``
        returned or this node left; 1 when ``main`` raised or rank 0 was lost.

    Raises:
        JoinError: The system refused this node (a wrong or missing token),
            does not take new nodes, is shutting down, or did not answer.
        ValueError: No address, a malformed one, a bad ``name`` or ``resources``.
    """
    level = effective_log_level(log_level)  # checked whether or not logs are configured: the node's processes use it
    if configure_logs:
        configure_logging(level)
    host, port = join_target("serve", address, name, join_timeout)
    if setup is not None and not callable(setup):
        raise TypeError(f"setup must be a function of the node's rank or of its system, not {setup!r}")
    traits = NodeTraits(name, check_resources(resources), pool=bool(pool))
    joined = cast(SystemSetup, setup) if setup is not None and takes_system(setup) else None
    rank, shared = prepare_join(host, port, join_timeout)
    plan = plan_from(shared, None if joined else cast(Setup | None, setup), join_timeout, level)
    token = os.environ.get(TOKEN_ENV, "")
    world = World(rank, 0, host, port, token, name, traits)
    children: list[Any] = []
    launcher = None
    if pool:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        arguments = functools.partial(_newcomer_arguments, dataclasses.replace(plan, setup=None))  # setup: here only
        launcher = LocalLauncher(_serve_newcomer, arguments, _invitation(address, token), children)
    try:
        return run_bounded(_serve_async(world, plan, joined, launcher))
    finally:
        reap_workers(children)


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


def _serve(world: World, plan: Plan) -> NoReturn:
    """Entry point of a worker rank: serve actors until rank 0 ends the system, then exit.

    The exit code is 0 when rank 0 ended the system after ``main`` returned,
    and 1 when ``main`` raised (0 under torchrun, whose summary then names
    rank 0's error) or rank 0 was lost.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 leads the shutdown on Ctrl-C
    configure_logging(plan.log_level)
    raise SystemExit(run_bounded(_serve_async(world, plan)))


async def _serve_async(
    world: World, plan: Plan, joined: SystemSetup | None = None, launcher: LocalLauncher | None = None
) -> int:
    """Serve actors as node ``world.rank`` until the system ends or this node leaves; the exit code.

    ``joined`` (``serve``'s ``setup`` that asks for the system) is called once
    the node has joined; if it raises, the node leaves and the error propagates.
    With a ``launcher``, the node starts node processes on its host when asked.
    """
    transport = node_transport(world, plan)
    watchdog = Watchdog(2 * plan.config.stop_grace + SHUTDOWN_TIMEOUT)

    def on_lost(rank: int, why: str) -> None:  # on a torch thread: works while the loop is stuck too
        if rank == 0:
            watchdog.arm(f"rank 0 was lost ({why})")

    transport.lost_in_thread = on_lost
    # SIGTERM makes a node of an elastic system leave gracefully; one that comes while it joins waits for the join.
    # A static world's node waits for rank 0 to end the system (a scheduler signals every process), bounded.
    terminated = asyncio.Event()
    elastic = is_elastic(transport)
    leave_on_term = elastic and _on_signal(signal.SIGTERM, terminated.set)
    if not elastic:
        _follow_rank0_on_sigterm(watchdog)
    try:
        system, host = await start_node(transport, plan, prepare=None if launcher is None else launcher.serve)
    except BaseException:
        if leave_on_term:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        raise
    transport.off_loop = functools.partial(_answer_or_end, host, watchdog)
    leaving = asyncio.ensure_future(_leave_when(terminated, host))
    failed: Exception | None = None
    try:
        if joined is not None:
            failed = await _set_up(joined, system, host)
        await host.wait_ended()
        host.depart()
        await host.stop_all()
    finally:
        leaving.cancel()
        if leave_on_term:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        await host.close()
    if failed is not None:
        raise failed
    if host.exit_code is None:
        host.log.error("rank 0 was lost; this node shut down", why=host.lost.get(0))
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
        host.log.error("setup failed; this node leaves the system", error=repr(exc))
        host.begin_leave()
        return exc
    return None
