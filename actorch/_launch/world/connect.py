"""``actorch.connect``: join a running elastic system from a running event loop, and drive it from there.

``serve`` gives a joining process to the system: it serves actors until the
system ends. ``connect`` makes the process a driver too, as rank 0's ``main``
is: the node joins the same way (a fresh rank, rank 0's settings, the join
token), hosts what is spawned on it, and hands the caller its ``ActorSystem``
to spawn, look up and call with. Leaving the ``async with`` block (or
``await system.shutdown()``) makes the node leave gracefully, as
``system.leave()`` does; the system goes on. If the system ends first (rank 0
returned from ``main``, or was lost), the node stops its actors and closes,
and what the driver does with it then fails with actorch's errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections.abc import Mapping
from typing import Any

from actorch._actors.node.host import ActorHost
from actorch._actors.system import ActorSystem, hand_over
from actorch._base.errors import JoinError
from actorch._base.resources import check_resources
from actorch._launch.options.environment import effective_log_level
from actorch._launch.services.logs import configure_logging
from actorch._launch.world.serving import join_target
from actorch._launch.world.start import Opening, wake_for_interrupts
from actorch._launch.world.startup import SHUTDOWN_TIMEOUT, World, node_transport, plan_from, start_node
from actorch._transport.base import NodeTraits
from actorch._transport.kinds import prepare_join, running
from actorch._transport.membership import TOKEN_ENV

__all__ = ["connect"]


def connect(
    address: str | None = None,
    *,
    token: str | None = None,
    name: str | None = None,
    join_timeout: float = 60.0,
    resources: Mapping[str, float] | None = None,
    log_level: str | None = None,
    configure_logs: bool = True,
) -> Opening:
    """Join a running elastic system as a node of this process, and drive it from the running event loop.

    ``async with actorch.connect("10.0.0.5:29500") as system:`` joins the
    system started with ``run(..., elastic=True)`` (or ``start``) under a
    fresh rank, with the settings it was started with, and gives this node's
    ``ActorSystem``: spawn (here or on any node), look up and call as rank 0's
    ``main`` does; actors spawned on this node run in this process. On leaving
    the block the node leaves gracefully, as ``system.leave()`` does: its
    actors stop (queued messages finish within ``stop_grace``, ``on_stop``
    runs), every node sees ``NodeLeft``, and the system goes on.
    ``system = await actorch.connect(...)`` and ``await system.shutdown()`` do
    the same in two steps.

    Args:
        address: The system's ``host:port`` (rank 0's); None reads ``ACTORCH_ADDRESS``.
        token: The system's join token; None reads ``ACTORCH_JOIN_TOKEN``.
        name: A label for this node, shown in ``system.nodes`` (``NodeInfo.label``).
        join_timeout: Seconds to wait for the system to answer: for the
            connection to its address, then for its answer on that connection
            (which comes at once from a system that runs). An address that
            refuses the connection (nothing listens there) fails at once.
        resources: Amounts of resources this node declares over the CPUs,
            memory and GPUs it detects (``{"env_slots": 4}``), for ``Where`` placement.
        log_level: As ``run``'s, for this node.
        configure_logs: Configure structlog here (unless the program already did).

    Returns:
        An ``Opening``: await it for the system, or use it in ``async with``.
        Bad arguments raise here, before anything is sent.

    Raises:
        JoinError: (when awaited) The address refused the connection or
            does not resolve (at once), the system refused this node (a wrong
            or missing token), does not take new nodes, is shutting down, or
            nothing answered within ``join_timeout``; the message names the address.
        ValueError: No address, a malformed one, a bad ``name``, ``join_timeout`` or ``resources``.
        RuntimeError: (when awaited) This process already runs a node on torch RPC.
    """
    host, port = join_target("connect", address, name, join_timeout)
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token must be a str or None, not {token!r}")
    traits = NodeTraits(name, check_resources(resources))
    level = effective_log_level(log_level)
    if configure_logs:
        configure_logging(level)
    secret = token if token is not None else os.environ.get(TOKEN_ENV, "")
    return Opening(f"actorch.connect({host}:{port})", lambda: _join(host, port, secret, traits, join_timeout))


async def _join(address: str, port: int, token: str, traits: NodeTraits, join_timeout: float) -> ActorSystem:
    if running():  # before a rank is taken in the system
        raise RuntimeError("this process already runs a node on torch RPC (one per process): shut it down first")
    joining: dict[str, Any] = {}

    def ask() -> None:  # blocking socket and store calls, bounded by join_timeout: in a thread, off the loop
        _refuse_unreachable(address, port, join_timeout)
        joining["rank"], joining["shared"] = prepare_join(address, port, join_timeout)

    await asyncio.to_thread(ask)
    plan = dataclasses.replace(plan_from(joining["shared"], None, join_timeout), tune_gc=False)
    world = World(joining["rank"], 0, address, port, token, traits.label, traits)
    transport = node_transport(world, plan)
    system, host = await start_node(transport, plan)
    follower = asyncio.get_running_loop().create_task(_follow(host), name=f"actorch-node{host.rank}")
    hand_over(system, lambda: _leave(host, follower))
    return system


def _refuse_unreachable(host: str, port: int, timeout: float) -> None:
    """Fail where a TCP connection to ``host:port`` cannot be made: at once if refused, else within ``timeout``.

    A driver connects to a system that runs, so a refusal means nothing listens
    there (a wrong port, a system that ended), and waiting for one to come up,
    as ``serve`` does, would only delay the error. Once the connection is made,
    the join itself waits for an answer, within ``timeout`` again.

    Raises:
        JoinError: The connection was refused, the host name does not resolve,
            or nothing answered within ``timeout``; the message names the address.
    """
    reach = f"cannot reach an actorch system at {host}:{port}"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except ConnectionRefusedError:
        raise JoinError(f"{reach}: the connection was refused (nothing listens there)") from None
    except TimeoutError:
        raise JoinError(f"{reach}: nothing answered within {timeout:g} s") from None
    except OSError as exc:  # unresolvable, unreachable: no later try would do better
        raise JoinError(f"{reach}: {exc.strerror or exc}") from None


async def _follow(host: ActorHost) -> None:
    """Close the node once the system has ended for it: rank 0 ended it or was lost, or this node left."""
    waking = wake_for_interrupts()
    try:
        await host.wait_ended()
        host.depart()
        await host.stop_all()
    finally:
        if waking is not None:
            waking.cancel()
        await host.close()
    if host.exit_code is None:
        host.log.warning("rank 0 was lost; this node closed", why=host.lost.get(0))


async def _leave(host: ActorHost, follower: asyncio.Task[None]) -> None:
    """Leave the system gracefully, unless it has ended already, and wait (bounded) until the node has closed."""
    if not follower.done() and host.exit_code is None and not host.closed:
        host.begin_leave()
    limit = 2 * host.config.stop_grace + 2 * SHUTDOWN_TIMEOUT
    try:
        async with asyncio.timeout(limit):
            await asyncio.shield(follower)
    except TimeoutError:
        host.log.error("the node did not leave in time; closing it", seconds=limit)
        follower.cancel()
        await asyncio.wait([follower])
