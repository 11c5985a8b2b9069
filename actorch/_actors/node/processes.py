"""Node processes on demand: a node that starts new node processes on its host, and keeps them until they end.

Rank 0 starts the processes that ``add_nodes`` asks for on its own host, and a
host agent (``actorch serve --pool``) those on its host. A node's
:class:`NodePool` does it through a :class:`Launcher`, which the launch layer
gives it (only it knows how a node process is started); without one it
refuses, saying why. The pool waits until each new process has joined the
system (it is in the node's peers, under its pid) and returns their ranks; a
process that exits first, or a wait past its bound, fails the whole call and
ends what it started. It then keeps the processes: it reaps each as it exits,
kills one whose node was lost while it still runs, and on leaving the system
asks them to leave first. A node with an *owner* is one actor's own process:
it leaves when that actor stops, or if no owner comes; a ``stop()`` of that
actor returns once the node is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol

from actorch._actors.node.service import NodeService
from actorch._actors.node_request import NodeRequest
from actorch._actors.restart import ActorExit
from actorch._base.errors import JoinError, UnsupportedError
from actorch._base.reaping import watch_exit
from actorch._transport.base import NodeInfo, NodeTraits

if TYPE_CHECKING:
    from actorch._actors.ref import ActorRef

__all__ = ["ADD_TIMEOUT", "OWNER_WAIT", "Launcher", "NodePool", "NodeProcess"]

ADD_TIMEOUT = 120.0
"""Seconds ``add_nodes`` waits for its processes to serve when the caller set no deadline."""
OWNER_WAIT = 60.0
"""Seconds an actor's own process waits for that actor before it leaves the system by itself."""
LEAVE_WAIT = 10.0
"""Seconds a leaving pool waits for its processes to leave before it kills them."""


class NodeProcess(Protocol):
    """A node process a launcher started (a ``multiprocessing.Process``)."""

    @property
    def pid(self) -> int | None:
        """Its process id."""

    @property
    def exitcode(self) -> int | None:
        """Its exit code, once it has exited."""

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when it exits."""

    def is_alive(self) -> bool:
        """Whether it still runs (this also reaps it once it has exited)."""

    def kill(self) -> None:
        """SIGKILL it."""


class Launcher(Protocol):
    """Starts node processes on this host that join the system (given to a pool by the launch layer)."""

    async def start(self, traits: Sequence[NodeTraits], env: Mapping[str, str]) -> list[NodeProcess]:
        """Start one process per item of ``traits``, with ``env`` added to their environment."""


class PoolHost(Protocol):
    """What a pool needs of its node's actor host: the nodes as it knows them, refs to their services, its leave."""

    rank: int
    services: Mapping[int, ActorRef[NodeService]]

    @property
    def lost(self) -> Mapping[int, str]:
        """The nodes gone for good, with why."""

    @property
    def left(self) -> AbstractSet[int]:
        """The nodes that said they have left."""

    @property
    def departing(self) -> bool:
        """Whether this node is ending or leaving already."""

    @property
    def log(self) -> Any:
        """The node's logger."""

    def peers(self) -> list[NodeInfo]:
        """Every node of the world, by rank."""

    def peer(self, rank: int) -> NodeInfo:
        """What node ``rank`` says of itself."""

    def on_peer_joined(self, listener: Callable[[NodeInfo], None]) -> None:
        """Call ``listener(info)`` when a node joins."""

    def on_peer_lost(self, listener: Callable[[int, str], None]) -> None:
        """Call ``listener(rank, why)`` when a node is lost."""

    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """How a local actor ended, once it has."""

    def begin_leave(self) -> None:
        """Start leaving the system (once)."""


class NodePool:
    """The node processes this node started on its host: starting them, waiting for them, ending them."""

    def __init__(self, host: PoolHost) -> None:
        self._host = host
        self.launcher: Launcher | None = None
        self.refusal = (
            "this node starts no node processes (an in-process world cannot; in a launched system rank 0 and "
            "host agents, `actorch serve --pool`, do)"
        )
        """Why this node starts none, when it has no launcher."""
        self._children: dict[int, NodeProcess] = {}  # by pid
        self._ranks: dict[int, int] = {}  # pid -> rank, once joined
        self._joining: dict[int, asyncio.Future[int]] = {}  # pid -> its rank, once it has joined
        self._owner_task: asyncio.Task[None] | None = None
        self._owner_id: int | None = None  # the actor whose own process this is, once built
        self._emptied = asyncio.Event()
        host.on_peer_joined(self._on_joined)
        host.on_peer_lost(self._on_lost)

    def __repr__(self) -> str:
        return f"<NodePool node {self._host.rank} processes={len(self._children)}>"

    @property
    def processes(self) -> dict[int, NodeProcess]:
        """The processes this node started that still run, by pid."""
        return dict(self._children)

    # ------------------------------------------------------------------ starting

    async def add(self, request: NodeRequest) -> list[int]:
        """Start the node processes ``request`` asks for here and return their ranks once every one serves.

        Waits until the caller's deadline or ``ADD_TIMEOUT``; past it, or if a
        process exits first, ends those it started (the ones that joined
        leave) and raises.

        Raises:
            UnsupportedError: This node starts no processes (the message says why).
            JoinError: A process exited before it joined, or they did not all join within ``ADD_TIMEOUT``.
        """
        if self.launcher is None:
            raise UnsupportedError(self.refusal)
        traits = [
            NodeTraits(request.label, dict(request.resources), owner, self._host.rank)
            for owner in request.owner_of_each()
        ]
        started = await self.launcher.start(traits, request.env)
        loop = asyncio.get_running_loop()
        waits = []
        for process in started:
            assert process.pid is not None
            self._children[process.pid] = process
            waits.append(self._joining.setdefault(process.pid, loop.create_future()))
            watch_exit(process, loop, functools.partial(self._on_exit, process))
            self._catch_up(process.pid)
        try:
            try:
                async with asyncio.timeout(ADD_TIMEOUT):
                    return list(await asyncio.gather(*waits))
            except TimeoutError:
                raise JoinError(
                    f"add_nodes({request.count}): the new processes did not all serve within {ADD_TIMEOUT:g} s"
                ) from None
        except BaseException:
            await asyncio.shield(self._abandon(started))
            raise
        finally:
            for process in started:
                if process.pid is not None:
                    self._joining.pop(process.pid, None)

    def _catch_up(self, pid: int) -> None:
        """Resolve the wait for ``pid`` if its node has joined already (before the wait was set)."""
        here = self._host.peer(self._host.rank).host
        for info in self._host.peers():
            if info.pid == pid and info.host == here and info.parent == self._host.rank:
                self._on_joined(info)

    def _on_joined(self, info: NodeInfo) -> None:
        if info.parent != self._host.rank or info.pid not in self._children:
            return
        self._ranks[info.pid] = info.rank
        waiting = self._joining.get(info.pid)
        if waiting is not None and not waiting.done():
            waiting.set_result(info.rank)

    def _on_exit(self, process: NodeProcess) -> None:
        """A process this node started has exited, and is reaped: forget it; fail whoever waits for it to join."""
        pid = process.pid
        if pid is None:
            return
        self._children.pop(pid, None)
        self._ranks.pop(pid, None)
        if not self._children:
            self._emptied.set()
        waiting = self._joining.get(pid)
        if waiting is not None and not waiting.done():
            waiting.set_exception(
                JoinError(f"a new node process (pid {pid}) exited with code {process.exitcode} before it joined")
            )

    def _on_lost(self, rank: int, why: str) -> None:
        """Kill a process of this node whose node was lost while it still runs (stopped, cut off)."""
        if rank in self._host.left:
            return
        for pid, known in list(self._ranks.items()):
            process = self._children.get(pid)
            if known == rank and process is not None and process.is_alive():
                process.kill()

    async def _abandon(self, started: Sequence[NodeProcess]) -> None:
        """End the processes of a failed ``add``: those that joined leave, the others are killed."""
        leaving = []
        for process in started:
            rank = self._ranks.get(process.pid or -1)
            if rank is not None and rank not in self._host.lost:
                leaving.append(self._ask_to_leave(rank))
            elif process.is_alive():
                process.kill()
        await asyncio.gather(*leaving)

    async def _ask_to_leave(self, rank: int) -> None:
        try:
            async with asyncio.timeout(LEAVE_WAIT):
                await self._host.services[rank].call(NodeService.leave)
        except Exception as exc:  # noqa: BLE001 - it is killed instead
            self._host.log.warning("node process did not leave; killing it", peer=rank, error=repr(exc))
            for pid, known in self._ranks.items():
                if known == rank and pid in self._children:
                    self._children[pid].kill()

    # ------------------------------------------------------------------ ending

    async def close(self) -> None:
        """Have every process of this node leave the system (this node leaves), and kill those that do not."""
        ranks = [rank for rank in self._ranks.values() if rank not in self._host.lost]
        await asyncio.gather(*(self._ask_to_leave(rank) for rank in ranks))
        if self._children:
            self._emptied.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LEAVE_WAIT):
                    await self._emptied.wait()
        for process in list(self._children.values()):
            if process.is_alive():
                process.kill()

    # ------------------------------------------------------------------ an actor's own process

    def expect_owner(self) -> None:
        """On an actor's own process: leave the system if its actor has not come within ``OWNER_WAIT``."""
        if self._owner_task is None:
            self._owner_task = asyncio.get_running_loop().create_task(self._leave_unless_owned())

    async def _leave_unless_owned(self) -> None:
        await asyncio.sleep(OWNER_WAIT)
        self._host.log.warning("no actor came to this process of its own; leaving the system")
        self._leave()

    async def build_owner(self, build: Callable[[], Awaitable[ActorRef[Any]]]) -> ActorRef[Any]:
        """Build this process's owner actor; the node leaves the system when it stops (or if building fails)."""
        if self._owner_task is not None:
            self._owner_task.cancel()
        try:
            ref = await build()
        except BaseException:
            self._leave()
            raise
        self._owner_id = ref._actor_id
        self._owner_task = asyncio.get_running_loop().create_task(self._leave_after(ref))
        return ref

    async def follow_owner(self, actor_id: int) -> None:
        """Once actor ``actor_id`` was stopped on request: if it owns this process, leave, and never return.

        The stop call that awaits this is then answered by the node's going,
        not by a reply: it ends at the caller once this node has left and is
        gone from the system (``ActorStoppedError``, which ``ActorRef.stop``
        takes as done), so that ``stop()`` returns only then; the process
        exits next, and the node that started it reaps it.
        """
        if actor_id != self._owner_id:
            return
        self._leave()
        await asyncio.get_running_loop().create_future()  # never set: the node closes under it, answering nothing

    async def _leave_after(self, ref: ActorRef[Any]) -> None:
        exit_ = await self._host.wait_stopped(ref._actor_id)
        self._host.log.info("the owner of this process stopped; leaving the system", reason=exit_.reason)
        self._leave()

    def _leave(self) -> None:
        if self._host.departing:
            return  # the system is ending, or this node leaves already
        with contextlib.suppress(Exception):  # the system ended for this node meanwhile
            self._host.begin_leave()
