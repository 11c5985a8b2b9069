"""Rank 0's part of a launch: open its node, run ``main``, and end the whole system in bounded time, also on Ctrl-C.

``lead`` serves the status and writes the runtime file while ``main`` runs;
when ``main`` returns or raises, every actor everywhere stops in order, rank 0
leaves first, and local workers that do not answer in time are killed: at
once once a worker's handlers have had ``stop_grace`` and its event loop does
not answer (a handler blocks it), else after the whole shutdown's bound. The
first Ctrl-C says on stderr what rank 0 waits for (``describe_waits``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Any, ClassVar, TypeVar

from actorch._actors.node.host import ActorHost
from actorch._actors.node.service import NodeService
from actorch._actors.system import ActorSystem
from actorch._base.errors import ActorStoppedError, NodeLostError, describe
from actorch._engine.wire import handler_traceback
from actorch._launch.services.runtime import Announcement, status_address
from actorch._launch.services.status import StatusServer
from actorch._launch.world.eventloop import interruption
from actorch._launch.world.interrupts import InterruptPolicy
from actorch._launch.world.nodes import LocalLauncher, grow_refusal
from actorch._launch.world.serving import END_BLOCKED, _newcomer_arguments, _serve_newcomer, describe_running
from actorch._launch.world.startup import SHUTDOWN_TIMEOUT, TORCHRUN_VARS, Plan, start_node
from actorch._launch.world.workers import kill_lost, kill_workers
from actorch._transport.base import Transport
from actorch._transport.capabilities import elastic_of, require_elastic

__all__ = ["PING_WAIT", "Main", "call_main", "check_main", "describe_waits", "interrupt_policy", "lead"]

T = TypeVar("T")
Main = Callable[[ActorSystem], Awaitable[T]]
"""The async function that rank 0 runs with the system: ``run``'s ``main``."""
PING_WAIT = 2.0
"""Seconds a worker that has not stopped ``stop_grace`` into the shutdown has to show that its event loop runs."""
_SHOWN_WAITS = 3
"""Calls the first Ctrl-C's line names, the oldest first; the others are counted."""
_MAIN_MUST_BE = "run(main): main must be an async function that takes the system (async def main(system): ...), not "


class _Led:
    """The node that rank 0 leads now, if any: what the first Ctrl-C describes (one system per process)."""

    host: ClassVar[ActorHost | None] = None


def check_main(main: object) -> None:
    """Refuse, before anything starts, a ``main`` that is sure not to give an awaitable.

    ``run`` awaits what ``main(system)`` returns. What passes: an ``async
    def`` function or method, a ``functools.partial`` of one, an object whose
    ``__call__`` is ``async def``, a function wrapped by a decorator that keeps
    ``__wrapped__`` (``functools.wraps``), and any other callable that may
    return an awaitable (a lambda, ``lambda system: train(system, split)``;
    an object with a plain ``__call__``): ``call_main`` checks what those
    return. What is refused here: a plain ``def`` function or method (it would
    run to its end before failing to be awaited), a class, and what is not
    callable.

    Raises:
        TypeError: ``main`` is one of those; the message says what it is.
    """
    inner = inspect.unwrap(main) if callable(main) else main
    while isinstance(inner, functools.partial):
        inner = inspect.unwrap(inner.func)
    if inspect.iscoroutinefunction(inner):
        return
    if isinstance(inner, type):
        given = f"the class {inner.__qualname__!r}: pass an async function that takes the system"
    elif inspect.isfunction(inner) or inspect.ismethod(inner):
        if inner.__name__ == "<lambda>":
            return  # a lambda cannot be async: what it returns is checked when it is called
        given = f"the plain function {inner.__qualname__!r}: declare it async def"
    elif callable(inner):
        return  # a builtin, or an object whose __call__ may return an awaitable: checked when called
    else:
        given = f"{main!r} ({type(main).__name__})"
    raise TypeError(f"{_MAIN_MUST_BE}{given}")


def call_main(main: Main[T], system: ActorSystem) -> Awaitable[T]:
    """``main(system)``, refused with ``check_main``'s message if what it returned cannot be awaited.

    Raises:
        TypeError: ``main`` returned something that is not awaitable (a lambda
            around a plain function); the message names it and what it returned.
    """
    returned = main(system)
    if not inspect.isawaitable(returned):
        raise TypeError(f"{_MAIN_MUST_BE}{main!r}, which returned {type(returned).__name__}, not an awaitable")
    return returned


def interrupt_policy(plan: Plan, workers: list[Any] | None = None) -> InterruptPolicy:
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
        describe=functools.partial(describe_waits, grace),
    )


def describe_waits(grace: float) -> str:
    """What rank 0 waits for now, in words: its calls not yet answered (node, actor, handler, for how long).

    Called on the interrupt watcher's thread: it only reads (a copy of) the
    pending calls and the cells' counters, and says the shutdown's bounds.
    """
    host = _Led.host
    bound = (
        f"handlers get stop_grace ({grace:g} s) to end, then a node whose event loop they still block "
        f"is killed ({PING_WAIT:g} s later)"
    )
    if host is None:
        return f"the system is not up yet; {bound}"
    now = monotonic()
    sent = host.calls_waiting()
    waits = [
        f"handler {call.endpoint!r} of {call.label} (running for {now - call.sent_at:.1f} s)"
        for call in sent[:_SHOWN_WAITS]
    ]
    if len(sent) > _SHOWN_WAITS:
        waits.append(f"{len(sent) - _SHOWN_WAITS} more calls")
    busy = host.busy_actors()
    waits += [f"{cell.label} ({cell.running} handler{'s' if cell.running > 1 else ''} running)" for cell in busy]
    return f"waiting for {', '.join(waits)}; {bound}" if waits else bound


async def lead(main: Main[T], transport: Transport, plan: Plan, workers: list[Any] | None = None) -> T:
    """Open rank 0's node, run ``main`` with its system, then shut the whole system down; what ``main`` returned."""
    launched = list(workers or ())  # the launch's own workers, ranks 1..; processes started later join the list
    system, host = await start_node(
        transport, plan, launched, functools.partial(_give_pool, transport=transport, plan=plan, workers=workers)
    )
    outcome = "failed"  # what the run's record says of it: ok, failed, or interrupted (Ctrl-C, SIGTERM)
    status = None
    announced = Announcement(system.world_size, None)
    try:
        if plan.status is not None:
            status = StatusServer(host, *plan.status)
            await status.start()
            announced.status = status_address(plan.status[0], status.port)
        _announce(announced, host)
        _record_start(host, system.world_size)
        _Led.host = host
        try:
            if plan.trace is None:
                result = await call_main(main, system)
            else:
                async with system.trace(plan.trace):
                    result = await call_main(main, system)
        except BaseException as exc:
            outcome = _record_end_of_main(host, exc)
            raise
        outcome = "ok"
        return result
    finally:
        announced.withdraw()
        if status is not None:
            await status.close()
        try:
            silent = await asyncio.shield(_shutdown_world(host, transport, outcome))
        finally:
            _Led.host = None
        for rank in silent:
            kill_lost(launched, rank)  # its loop is stuck: do not wait for its watchdog


def _give_pool(host: ActorHost, transport: Transport, plan: Plan, workers: list[Any] | None) -> None:
    """Let rank 0's node start node processes on this host (``add_nodes``), or say why it cannot."""
    under_torchrun = all(var in os.environ for var in TORCHRUN_VARS)
    refusal = grow_refusal(transport, plan.transport, under_torchrun=under_torchrun)
    if refusal is not None or workers is None:
        host.pool.refusal = refusal or host.pool.refusal
        return
    arguments = functools.partial(_newcomer_arguments, plan)
    host.pool.launcher = LocalLauncher(_serve_newcomer, arguments, require_elastic(transport).invitation, workers)


def _record_start(host: ActorHost, world_size: int) -> None:
    """Open rank 0's record of the run with what was run, where and by whom (``actorch history`` lists it so)."""
    host.write_record(
        "run started",
        script=sys.argv[0],
        argv=sys.argv[1:],
        world_size=world_size,
        host=socket.gethostname(),
        pid=os.getpid(),
        cwd=os.getcwd(),
    )


def _record_end_of_main(host: ActorHost, exc: BaseException) -> str:
    """Record how ``main`` ended when it raised ``exc``: interrupted (Ctrl-C, SIGTERM), or failed; the outcome."""
    by = interruption() if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit) else None
    if by is not None:
        host.write_record("main interrupted", by=by)
        return "interrupted"
    host.write_record("main failed", error=describe(exc), traceback=handler_traceback(exc).rstrip())
    return "failed"


def _announce(announced: Announcement, host: ActorHost) -> None:
    """Write rank 0's runtime file, for ``actorch status`` and ``actorch stop``; a failure is only logged."""
    try:
        path = announced.publish()
    except OSError as exc:
        host.log.warning("runtime file not written: actorch status will not find this system", error=str(exc))
    else:
        host.log.debug("runtime file written", path=str(path))


async def _shutdown_world(host: ActorHost, transport: Transport, outcome: str) -> list[int]:
    """Stop every actor everywhere (``on_stop`` runs), record the run's ``outcome``, then close this node.

    The workers follow. The run's record ends here, after the shutdown, so
    that the time it gives the run covers the shutdown too.

    Rank 0 leaves first: each worker sees it go and exits, with code 1 if
    ``main`` did not return (``outcome`` is not ``"ok"``). The other order makes torch log every dropped connection
    at rank 0, where torch may have been imported before its C++ log level
    could be set. Each node's share is bounded by ``2 * stop_grace`` (messages,
    then ``on_stop``) plus ``SHUTDOWN_TIMEOUT``.

    Returns:
        The ranks that did not answer in time (their event loop may be stuck).
    """
    elastic = elastic_of(transport)
    if elastic is not None:
        elastic.stop_admitting()  # a node let in now would miss the shutdown
    peers = [rank for rank in host.ranks() if rank != 0 and rank not in host.lost]
    limit = 2 * host.config.stop_grace + SHUTDOWN_TIMEOUT
    answered = await _call_all(host, peers, NodeService.shutdown, limit, outcome != "ok")
    await host.stop_all()
    host.write_record("run ended", outcome=outcome)
    host.depart()
    await host.close()
    return [rank for rank, ok in zip(peers, answered, strict=True) if not ok]


async def _call_all(host: ActorHost, ranks: list[int], endpoint: Any, limit: float, *args: Any) -> list[bool]:
    """Call ``endpoint`` of every rank's service at once; whether each answered within ``limit`` seconds.

    A rank that has not answered ``stop_grace`` seconds in, and does not
    answer a ping within ``PING_WAIT`` either, has its event loop blocked (a
    handler in blocking code, which no cancellation reaches): it counts as
    not answering then, rather than when ``limit`` runs out.
    """
    grace = host.config.stop_grace

    async def one(rank: int) -> bool:
        call = asyncio.ensure_future(host.services[rank].call(endpoint, *args))
        try:
            async with asyncio.timeout(limit):
                await _settled_within(call, grace)
                if not call.done() and not await _answers_ping(host, rank):
                    call.cancel()
                    await _end_blocked(host, rank)
                    return False
                await call
        except (NodeLostError, ActorStoppedError):
            return True  # it is gone already, or it left the system meanwhile
        except Exception as exc:  # noqa: BLE001 - a node that fails here is reported, not fatal
            call.cancel()
            host.log.warning("node did not answer shutdown", peer=rank, error=repr(exc))
            return False
        return True

    return list(await asyncio.gather(*(one(rank) for rank in ranks)))


async def _end_blocked(host: ActorHost, rank: int) -> None:
    """Say which handler blocks node ``rank``'s event loop, and have the node end its process.

    A thread of the node still answers (``Transport.ask_off_loop``): it names
    the handler on its loop's thread, and ends the process when asked
    (``END_BLOCKED``), wherever the node runs; under torchrun and on other
    hosts no other process of the run could end it before its watchdog.
    Either question may go unanswered (the transport cannot ask, or the node
    ended first): the shutdown goes on all the same.
    """
    grace = host.config.stop_grace
    try:
        state = await asyncio.to_thread(host.ask_off_loop, rank, "loop", PING_WAIT)
    except Exception:  # noqa: BLE001 - the handler goes unnamed
        state = {}
    running = describe_running(state.get("running")) if "running" in state else "a handler (not named: no answer)"
    host.log.warning(
        "node did not answer shutdown: its event loop is blocked (a handler in blocking code?)",
        peer=rank,
        stop_grace=grace,
        handler=running,
    )
    host.log.warning("node killed", peer=rank, why=f"{running} blocked its event loop past stop_grace ({grace:g} s)")
    # It ends before it answers: this returns when it is gone. The bound is for a loaded host, where its thread
    # may be slow to take the question; past it a local worker is killed all the same (kill_lost, in lead).
    with contextlib.suppress(Exception):
        await asyncio.to_thread(host.ask_off_loop, rank, END_BLOCKED, SHUTDOWN_TIMEOUT)


async def _settled_within(call: asyncio.Future[Any], seconds: float) -> None:
    """Wait until ``call`` has its outcome or ``seconds`` have passed, whichever comes first; ``call`` goes on."""
    settled = asyncio.Event()
    call.add_done_callback(lambda _: settled.set())
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await settled.wait()


async def _answers_ping(host: ActorHost, rank: int) -> bool:
    """Whether node ``rank``'s event loop answers within ``PING_WAIT`` (a node that is gone answers too)."""
    try:
        async with asyncio.timeout(PING_WAIT):
            await host.services[rank].call(NodeService.ping)
    except TimeoutError:
        return False
    except Exception:  # noqa: BLE001 - lost, left, or failing: not blocked; the shutdown call says the rest
        return True
    return True
