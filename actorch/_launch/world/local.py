"""How a launch from a script makes its world: rank 0's transport, the local worker processes, what each node declares.

Rank 0 listens on ``host:port`` (a free port for 0) and spawns ranks 1 to
N-1 as local processes that serve actors (``serving._serve``). A launch that
is not elastic still runs on an elastic world, private to the node processes
it starts itself, unless its transport's options fix the world at its start
(torch RPC's device maps); one node alone opens no network until it starts a
node process.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from typing import Any

from actorch._launch.options.system_options import ResourceSpec
from actorch._launch.world.guard import WORKER_OF_ENV
from actorch._launch.world.nodes import QUIET_ENV, declared_resources, environment
from actorch._launch.world.serving import _serve
from actorch._launch.world.startup import Plan, World, shared_settings
from actorch._launch.world.workers import kill_workers
from actorch._transport.base import NodeTraits, Transport
from actorch._transport.kinds import open_transport
from actorch._transport.membership import TOKEN_ENV, new_token
from actorch._transport.network import listen_socket
from actorch._transport.world import WorldSpec

__all__ = ["elastic_token", "launch_traits", "local_world"]


def launch_traits(resources: ResourceSpec, world_size: int) -> list[NodeTraits]:
    """What each node of a local launch says of itself: the resources it declares; rank 0 starts node processes."""
    declared = declared_resources(resources, world_size)
    return [NodeTraits(resources=declared.get(rank, {}), pool=rank == 0) for rank in range(world_size)]


def elastic_token(world_size: int | None, plan: Plan, *, under_torchrun: bool) -> str:
    """Check an elastic launch's options; the join token (``ACTORCH_JOIN_TOKEN``, else a new one)."""
    if under_torchrun:
        raise ValueError("elastic=True starts from a plain script, not under torchrun (torchrun fixes the world)")
    refusal = plan.transport.refuses_elastic()
    if refusal is not None:
        raise ValueError(refusal)
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size must be a positive int, not {world_size!r}")
    return os.environ.get(TOKEN_ENV) or new_token()


def local_world(
    world_size: int, host: str, plan: Plan, port: int, traits: list[NodeTraits], token: str | None = None
) -> tuple[Transport, list[Any]]:
    """Rank 0's transport for a local launch, and the other ranks' processes, started.

    An elastic launch has a join ``token``. Any other runs on an elastic world
    too, private to the node processes it starts itself (``add_nodes``), so
    that it can start them; unless its transport's options fix the world at
    its start (torch RPC's device maps). One node alone needs no network until
    it starts one.
    """
    if world_size == 1 and token is None:
        spec = WorldSpec(
            0,
            1,
            host,
            port,
            traits=traits[0],
            shared=shared_settings(plan),
            alone=True,
            liveness_timeout=plan.liveness_timeout,
        )
        return open_transport(spec, plan.transport), []
    public = token is not None
    if token is None and plan.transport.fixes_world() is None:
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
    """Start ranks 1 to ``world_size - 1`` as local processes that serve actors (rank 0's store is at ``port``).

    They are forked from multiprocessing's forkserver, which has imported
    actorch, torch included, once: each worker then starts in a fraction of
    a second where a spawned one would import torch again (8 workers on 2
    cores took 3.4x as long; benchmarks/bench_startup.py). As with ``spawn``,
    each imports the main script anew, so its classes resolve there. The
    server keeps the environment it was started with, so each worker is given
    this process's environment as it is now and takes it on first.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["actorch"])
    environ = {**os.environ, **QUIET_ENV, WORKER_OF_ENV: str(os.getpid())}
    with environment({**QUIET_ENV, WORKER_OF_ENV: str(os.getpid())}):  # the server's own, if this starts it
        workers = [
            context.Process(
                target=_serve_in,
                args=(environ, World(rank, world_size, host, port, token, traits=traits[rank]), plan),
                name=f"actorch-node{rank}",
                daemon=True,
            )
            for rank in range(1, world_size)
        ]
        for worker in workers:
            worker.start()
    return workers


def _serve_in(environ: dict[str, str], world: World, plan: Plan) -> None:
    """A worker's entry point: take on rank 0's environment, then serve (``_serve``)."""
    os.environ.clear()
    os.environ.update(environ)
    _serve(world, plan)


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
) -> Transport:
    """Rank 0's transport for a local launch; elastic when there is a join ``token`` (``public`` or not)."""
    spec = WorldSpec(
        0,
        world_size,
        host,
        port,
        traits=traits,
        token=token,
        public=public,
        initial=world_size,
        liveness_timeout=plan.liveness_timeout,
        listener=listener,
        shared=None if token is None else shared_settings(plan),
    )
    return open_transport(spec, plan.transport)
