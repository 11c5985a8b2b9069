"""Starting node processes on demand on this host, and tying them to the process that started them.

Rank 0 (``run``, ``start``) and a host agent (``actorch serve --pool``) give
their node's pool a :class:`LocalLauncher`. It starts each process the way
``run`` starts its local workers (multiprocessing's ``spawn``, so the main
script's classes resolve there too, with torch's C++ warnings quieted), with
the caller's environment variables added, and hands it where the system is
and its token inside the process's arguments, never on a command line or in
its environment. The processes go in the launch's list of workers, so that
every way the launch ends them (its shutdown, Ctrl-C forced, the exit hook of
``start``) ends these too.

A started process watches the one that started it (:class:`ParentWatch`):
if that process dies, even killed, one that has not joined yet exits at
once, and one that serves leaves the system and exits, within a bound.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from actorch._actors.node.host import ActorHost
from actorch._base.resources import check_resources
from actorch._launch.options.system_options import ResourceSpec
from actorch._launch.world.eventloop import Watchdog
from actorch._transport.base import NodeTraits, Transport
from actorch._transport.capabilities import elastic_of
from actorch._transport.kind import KindOptions

__all__ = [
    "LocalLauncher",
    "ParentWatch",
    "declared_resources",
    "environment",
    "grow_refusal",
]

QUIET_ENV = {"TORCH_CPP_LOG_LEVEL": "ERROR"}
"""What every node process's environment gets: torch's C++ warnings off before torch loads."""
PARENT_GONE_EXIT = 1
"""Exit code of a node process whose starter died before it joined."""


def declared_resources(spec: ResourceSpec, world_size: int) -> dict[int, dict[str, float]]:
    """``run(resources=...)`` by rank: one mapping for every rank, or the mappings given by rank, checked.

    Raises:
        TypeError: ``spec`` is not a mapping.
        ValueError: A rank outside the world, or a bad name or amount.
    """
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise TypeError(f"resources must be a mapping of names to amounts, or of ranks to those, not {spec!r}")
    if spec and all(isinstance(key, int) and not isinstance(key, bool) for key in spec):
        by_rank: dict[int, dict[str, float]] = {}
        for rank, amounts in spec.items():
            assert isinstance(rank, int)
            if not 0 <= rank < world_size:
                raise ValueError(f"resources: {rank!r} is not a rank of this launch (0..{world_size - 1})")
            by_rank[rank] = check_resources(amounts, f"resources[{rank}]")
        return by_rank
    every = check_resources(spec)
    return dict.fromkeys(range(world_size), every)


def grow_refusal(transport: Transport, options: KindOptions, *, under_torchrun: bool) -> str | None:
    """Why the system whose rank 0 runs on ``transport`` (of ``options``) cannot start node processes, or None."""
    if elastic_of(transport) is not None:
        return None
    if under_torchrun:
        return (
            "a system under torchrun is torchrun's fixed world: it cannot start node processes (start the script "
            "with python, or actorch run without torchrun's flags, to let it grow)"
        )
    return options.fixes_world() or f"a world on {type(transport).__name__} takes no new nodes"


@contextlib.contextmanager
def environment(added: Mapping[str, str]) -> Iterator[None]:
    """Set ``added`` in this process's environment for the block (processes started in it inherit them)."""
    saved = {key: os.environ.get(key) for key in added}
    os.environ.update(added)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class LocalLauncher:
    """Starts node processes on this host that join the system (a node pool's ``Launcher``).

    Args:
        target: The function each process runs (``run``'s entry for a node started on demand).
        arguments: Its arguments for one process: from the system's address, its token, and the node's traits.
        invitation: Where the system is and its token: ``(host:port, token)``.
        processes: The launch's list of processes, to which the new ones are added.
    """

    def __init__(
        self,
        target: Callable[..., Any],
        arguments: Callable[[str, str, NodeTraits], tuple[Any, ...]],
        invitation: Callable[[], Awaitable[tuple[str, str]]],
        processes: list[Any],
    ) -> None:
        self._target = target
        self._arguments = arguments
        self._invitation = invitation
        self._processes = processes

    def __repr__(self) -> str:
        return f"<LocalLauncher processes={len(self._processes)}>"

    def serve(self, host: ActorHost) -> None:
        """Start node processes for ``host``'s node from now on (its pool's launcher)."""
        host.pool.launcher = self

    async def start(self, traits: Sequence[NodeTraits], env: Mapping[str, str]) -> list[Any]:
        """Start one process per item of ``traits``, with ``env`` added to their environment."""
        address, token = await self._invitation()
        context = multiprocessing.get_context("spawn")
        started = [
            context.Process(
                target=self._target,
                args=self._arguments(address, token, said),
                name=f"actorch-{said.owner or said.label or 'node'}",
                daemon=False,  # its actors may start processes (a DataLoader's workers); the launch reaps it
            )
            for said in traits
        ]
        with environment({**QUIET_ENV, **env}):
            for process in started:
                process.start()
                self._processes.append(process)
        return started


class ParentWatch:
    """In a node process started on demand: end with the process that started it, even if it was killed.

    multiprocessing hands every process it starts a file descriptor that
    reads end-of-file once its parent has exited; a daemon thread waits on it.
    Before the node serves, the process exits at once with
    ``PARENT_GONE_EXIT``; once it serves (:meth:`serving`), its node leaves the
    system, and a watchdog ends the process if that takes longer than ``limit``.
    """

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._host: ActorHost | None = None
        self._lock = threading.Lock()
        parent = multiprocessing.parent_process()
        if parent is not None:
            threading.Thread(target=self._watch, args=(parent.sentinel,), name="actorch-parent", daemon=True).start()

    def __repr__(self) -> str:
        return f"<ParentWatch serving={self._host is not None}>"

    def serving(self, host: ActorHost) -> None:
        """The node serves now: when the parent goes, it leaves the system."""
        with self._lock:
            self._host = host

    def _watch(self, sentinel: int) -> None:
        multiprocessing.connection.wait([sentinel])
        with self._lock:
            host = self._host
            if host is None:
                os._exit(PARENT_GONE_EXIT)
        Watchdog(self._limit).arm("the process that started this node exited")
        with contextlib.suppress(RuntimeError):  # the loop has closed: the node is gone already
            host.loop.call_soon_threadsafe(_leave, host)


def _leave(host: ActorHost) -> None:
    with contextlib.suppress(Exception):  # the system ended for this node already
        host.begin_leave()
