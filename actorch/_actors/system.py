"""``ActorSystem``: the per-node handle users spawn, look up and watch through, as ``Actor.system`` is typed.

Its public surface and documentation only, naming nothing of the runtime beneath,
so that ``Actor`` can name it in turn; each node's system is a
:class:`~actorch._actors.node.node_system.NodeSystem`, made by ``open_system``.
``spawn`` and ``spawn_group`` declare their keywords here and nowhere else:
they hand them inward as one :class:`SpawnOptions`.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._actors.actor import Actor
from actorch._base.config import SystemConfig
from actorch._base.constructors import NoPublicConstructorABC
from actorch._base.errors import UnsupportedError
from actorch._transport.base import NodeInfo

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from actorch._actors.ref import ActorRef
    from actorch._actors.restart import Restart
    from actorch._actors.where import Where
    from actorch._engine.timeline import Timeline

__all__ = ["ActorSystem", "MembershipEvent", "NodeInfo", "SpawnOptions", "hand_over"]

A = TypeVar("A", bound=Actor)


class MembershipEvent:
    """Base class of the events ``ActorSystem.events()`` yields (match on the subclasses)."""

    __slots__ = ()


@dataclass(frozen=True)
class SpawnOptions:
    """The keywords of one ``spawn`` or ``spawn_group`` call, as they were given, in one value.

    ``ActorSystem`` declares the keywords, with their defaults and
    documentation, and makes this; the system's spawner checks and places
    what it says. Each attribute is the keyword of ``ActorSystem.spawn`` of
    that name; a group's has no ``device`` and lends no ``gpus``.
    """

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] | None
    name: str | None
    on: int | Where | None
    restart: Restart | None
    device: str | torch.device | None
    gpus: int


class ActorSystem(metaclass=NoPublicConstructorABC):
    """The actor system as seen from one node: spawn actors, find them by name.

    Made by :func:`actorch.run` and handed to ``main``; inside an actor it is
    ``self.system``.
    """

    _made_by = "actorch.run(), actorch.start() and actorch.connect()"
    _shutdown: Callable[[], Awaitable[None]] | None = None
    config: SystemConfig

    def __repr__(self) -> str:
        return f"<ActorSystem node {self.rank} of {self.world_size}>"

    @property
    @abstractmethod
    def rank(self) -> int:
        """This node's rank (0 runs ``main``)."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """How many nodes the system has (lost ones included; in an elastic system it changes)."""

    @property
    @abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """The nodes of the system now (rank, worker name, host, pid, GPUs...), by rank.

        Nodes that left are not among them, nor nodes this node knows are lost:
        ``lost_nodes`` has those, with why.
        """

    @property
    @abstractmethod
    def lost_nodes(self) -> dict[int, str]:
        """Ranks of the nodes this node knows are lost (killed, frozen, cut off), with why; not those that left."""

    @property
    @abstractmethod
    def elastic(self) -> bool:
        """Whether nodes may join and leave this system while it runs (``run(..., elastic=True)``)."""

    @abstractmethod
    def join_env(self) -> dict[str, str]:
        """The environment a process needs to join this system with ``actorch.serve()``.

        ``ACTORCH_ADDRESS`` (rank 0's store) and ``ACTORCH_JOIN_TOKEN``. Pass
        them in the environment, not on a command line, where other users of
        the machine could read the token.

        Raises:
            UnsupportedError: The system is not elastic, or this is not rank 0.
        """

    @abstractmethod
    async def leave(self, rank: int | None = None) -> None:
        """Have a node leave the system, draining it first: this node, or node ``rank``.

        The node announces it (nothing more is spawned there), stops its actors
        (``on_stop`` runs, queued messages finish within ``stop_grace``, names
        go), tells every node it has left (they see ``NodeLeft``; calls still
        waiting on it end in ``ActorStoppedError``), and its process exits with
        code 0. On the leaving node itself this returns once the leave has
        begun (the calling actor stops with the others); for another node it
        returns once that node has left the system (its process exits just
        after, and the node that started it reaps it at once).

        Raises:
            UnsupportedError: The system is not elastic.
            ValueError: ``rank`` is 0 (rank 0 runs ``main``) or not a node of the system.
            NodeLostError: Node ``rank`` was lost.
            TimeoutError: Node ``rank`` was not gone within ``2 * stop_grace`` plus 10 s.
        """

    async def shutdown(self) -> None:
        """End what this process drives: the whole system from ``actorch.start``, this node from ``actorch.connect``.

        A system from ``start`` shuts down as ``run`` ends one when ``main``
        returns: every actor on every node stops (``on_stop`` runs, within
        ``stop_grace``) and the local worker processes exit. A node from
        ``connect`` leaves the system, which goes on (see ``leave``). Both are
        bounded, and a second call waits for the first. ``async with`` does
        it on exit.

        Raises:
            UnsupportedError: This system came from ``actorch.run`` (return
                from ``main`` instead), or this is a node serving actors.
        """
        if self._shutdown is None:
            raise UnsupportedError(
                f"node {self.rank} is not driven by actorch.start() or actorch.connect(): a system from "
                "actorch.run() shuts down when main returns"
            )
        await self._shutdown()

    async def spawn(
        self,
        cls: type[A],
        *,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        on: int | Where | None = None,
        restart: Restart | None = None,
        device: str | torch.device | None = None,
        gpus: int = 0,
    ) -> ActorRef[A]:
        """Build an actor of class ``cls`` on node ``on`` (default: this node) and start it.

        Args:
            cls: An ``Actor`` subclass importable on the target node.
            args: Positional arguments for ``cls.__init__``.
            kwargs: Keyword arguments for ``cls.__init__``.
            name: A unique, path-shaped name (``rl/observers/3``) to find it by.
            on: Rank of the node to host it (``Where(rank=on)``); or a ``Where``
                that describes the node (label, host, resources the actor holds
                until it stops) or asks for a process of the actor's own (see ``Where``).
            restart: Restart the actor when it fails (a handler raises one of
                its class's ``fatal_errors``, or ``on_start`` raises); None
                stops it instead. With a policy, a first start that raises is
                tried again the same way, and ``spawn`` returns once the actor
                has started, or raises the last error when the policy is used up.
                ``Restart(relocate=True)`` also moves it to another node when
                its node is lost; such an actor never lives on rank 0.
            device: The actor's device (``"cuda:1"``), instead of its class's
                ``device``; node ``on`` must have it. The actor's hooks and
                handlers run with it current, as ``self.device``. It holds the
                device for no one: other actors may run there too, and ``gpus=``
                spawns may still be lent it.
            gpus: Lend the actor this many GPUs of one node, none of them lent
                to another actor, until it stops (restarts keep them); its
                device is the first. It asks what ``Where(gpus=...)`` asks:
                without ``on``, the node is this one if it has enough free,
                else the lowest rank that has (lost and leaving nodes, and
                actors' own processes, skipped). Not with ``device``.

        Raises:
            NameTakenError: ``name`` belongs to a live actor.
            InvalidNameError: ``name`` breaks the naming rule.
            NodeLostError: Node ``on`` was lost.
            PlacementError: No node (or not node ``on``) has ``gpus`` free
                GPUs (the message says what each node has and who holds it),
                no node fits ``on=Where(...)`` (the message names each node
                and why), or node ``on`` is leaving the system.
            UnsupportedError: ``Where(process="own")`` in a system that
                cannot start node processes (the message says why).
            JoinError: The actor's own process could not join the system.
            RemoteError: ``__init__`` or ``on_start`` raised.
            TypeError: ``cls`` is no importable actor class, or has a public plain ``def`` method.
            ValueError: ``device`` is not a device, or node ``on`` does not have
                it; ``gpus`` is not an int >= 0, or comes with ``device``; the
                actor is relocatable and would live on rank 0 or in its own process.
        """
        options = SpawnOptions(args, kwargs, name, on, restart, device, gpus)
        return await self._spawn(cls, options)

    @abstractmethod
    async def _spawn(self, cls: type[A], options: SpawnOptions) -> ActorRef[A]:
        """Spawn an actor of ``cls`` as ``spawn`` says, with the keywords it was given."""

    async def spawn_group(
        self,
        cls: type[A],
        count: int,
        *,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        on: int | Where | None = None,
        spread: bool = False,
        restart: Restart | None = None,
    ) -> list[ActorRef[A]]:
        """Spawn ``count`` actors of ``cls`` at once, spread across nodes or packed onto few; all or none.

        Pass the refs to ``actorch.ActorGroup`` to call them together. Each
        member is placed as ``spawn`` places one, except that the group is
        planned in one go from what every node has free: with ``spread`` each
        member goes to the fitting node with the fewest members so far (this
        node first, then by rank), else each node is filled before the next
        (packed). With ``on=Where(process="own")`` each member gets a process
        of its own, all started at once. If any member cannot be spawned, those
        that were are stopped and the error is raised.

        Args:
            cls: As ``spawn``'s.
            count: How many members (>= 1).
            args: As ``spawn``'s, the same for every member.
            kwargs: As ``spawn``'s, the same for every member.
            name: Names the members ``name/0`` ... ``name/<count-1>``
                (``lookup_all("name/*")`` finds them); None: unnamed.
            on: A rank (every member there), a ``Where`` (every member holds
                what it asks), or None: any node.
            spread: Spread the members across the nodes that fit, rather than pack them.
            restart: As ``spawn``'s, for every member.

        Returns:
            The members' refs, in member order.

        Raises:
            PlacementError: The nodes that fit have room for fewer than
                ``count`` members; the message names each node and why.
            ValueError: ``count`` is not an int >= 1; or as ``spawn`` raises it,
                as it raises the other errors listed there.
        """
        options = SpawnOptions(args, kwargs, name, on, restart, device=None, gpus=0)
        return await self._spawn_group(cls, count, options, spread)

    @abstractmethod
    async def _spawn_group(self, cls: type[A], count: int, options: SpawnOptions, spread: bool) -> list[ActorRef[A]]:
        """Spawn ``count`` actors of ``cls`` as ``spawn_group`` says, with the keywords it was given."""

    @abstractmethod
    async def add_nodes(
        self,
        count: int,
        *,
        label: str | None = None,
        resources: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
    ) -> list[NodeInfo]:
        """Start ``count`` new node processes that join this system; them, once they serve.

        Rank 0 starts them on its own host, or the host agent of ``host``
        (``actorch serve --pool``) on its host. They join as nodes joining an
        elastic system do (every node sees ``NodeJoined``), under fresh ranks,
        with the settings the system runs with, and ``run``'s ``setup`` runs on
        them first. Any system started from a script or a notebook grows so,
        elastic or not; they leave it with ``leave(rank)``, and end with it:
        when ``main`` returns, on Ctrl-C or SIGTERM, and when rank 0 dies.
        Waits until the caller's deadline (``asyncio.timeout``) or two minutes.

        Args:
            count: How many processes (>= 1).
            label: Their label (``NodeInfo.label``), for ``Where(label=...)``.
            resources: Amounts they declare over what they detect (``{"env_slots": 4}``).
            env: Environment variables for the new processes (``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``).
            host: Start them on that host, through its agent, named by host name or label.

        Returns:
            The new nodes, in the order started.

        Raises:
            UnsupportedError: The system cannot start node processes (under
                torchrun; with device maps; an in-process test world), or no
                host agent serves ``host``; the message says which.
            JoinError: A process exited before it joined, or they did not all
                join in time; those that started are ended.
            ValueError: A bad ``count``, ``label``, ``resources`` or ``env``.
        """

    @abstractmethod
    async def wait_nodes(
        self,
        count: int,
        *,
        label: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - torchelastic's --nnodes has its timeout too
    ) -> list[NodeInfo]:
        """Wait until the system has at least ``count`` live nodes (with ``label``, if given); those nodes.

        Nodes lost or leaving are not counted; this node is. It returns at once
        when they are there already.

        Args:
            count: How many nodes (>= 1).
            label: Count only nodes with this label.
            timeout: Seconds to wait; None: until the caller's deadline
                (``asyncio.timeout``) or, without one, the system's ``lookup_timeout``.

        Returns:
            Every live node that matches, by rank (``count`` or more).

        Raises:
            TimeoutError: Fewer nodes were there when the wait ended; the message says how many.
        """

    @abstractmethod
    async def lookup(self, name: str) -> ActorRef[Any]:
        """The actor named ``name``, waiting until it exists.

        Waits until the enclosing deadline (``asyncio.timeout``, ``anyio.fail_after``)
        or, without one, the system's ``lookup_timeout``. A name whose node this
        node knows to be lost counts as not there yet: the lookup waits for a
        replacement rather than returning a dead ref.

        Raises:
            ActorNotFoundError: No actor took the name in time.
            InvalidNameError: ``name`` breaks the naming rule.
        """

    @abstractmethod
    def events(self, pattern: str | None = None) -> AsyncIterator[MembershipEvent]:
        """Membership events, as they happen: nodes joined and lost, names registered and removed.

        It first yields the current state (``NodeJoined`` for every live node,
        ``NameRegistered`` for every name), then each change, in order, until
        this node shuts down. Use it in ``async for``; leaving the loop (or
        ``aclose()``) ends the subscription.

        Args:
            pattern: Only name events whose name matches this glob (node events always come).
        """

    @abstractmethod
    async def lookup_all(self, pattern: str) -> list[ActorRef[Any]]:
        """Actors whose names match the glob ``pattern`` (``rl/observers/*``), sorted by name.

        ``*`` and ``?`` match within one path segment, ``**`` across segments.
        Does not wait: it lists the names that exist now.
        """

    @abstractmethod
    def rref(self, value: Any) -> Any:
        """Wrap ``value`` in a ``torch.distributed.rpc.RRef`` owned by this node.

        For torch's own distributed tools (``torch.distributed.autograd``,
        ``DistributedOptimizer``), which work on RRefs. RRefs can be sent inside
        calls and replies like any value.

        Raises:
            UnsupportedError: If the system does not run on torch RPC (in-process worlds).
        """

    @abstractmethod
    async def process_group(self, ranks: Iterable[int] | None = None, *, backend: str = "gloo") -> dist.ProcessGroup:
        """A ``torch.distributed`` process group over the nodes ``ranks``, for DDP and collectives beside actors.

        Call it on every member node (from an actor's handler, or ``main`` on
        rank 0) with the same arguments, at the same time: for instance through
        ``asyncio.gather`` over the member actors' endpoints. The members meet
        in the store the world already shares, so no port is needed, also
        under torchrun. Each call makes a new group; groups over different
        ranks may coexist. Pass the group as ``process_group=`` to
        ``DistributedDataParallel`` or as ``group=`` to the collectives; the
        group's global ranks are actorch's node ranks, and group rank ``i`` is
        the ``i``-th smallest member (``group.rank()``, ``group.size()``). The
        node destroys the group when it shuts down.

        Waits for the other members until the enclosing deadline
        (``asyncio.timeout``, ``anyio.fail_after``) or, without one, the
        system's ``lookup_timeout``.

        Args:
            ranks: The member nodes' ranks; this node must be one of them.
                None: every node not lost.
            backend: The ``torch.distributed`` backend; ``"gloo"`` (CPU tensors) only.

        Returns:
            The process group, entered in ``torch.distributed``'s table of groups
            (torch's default group is left alone).

        Raises:
            TimeoutError: Some members did not call it in time; the message names them.
            NodeLostError: A member node was lost.
            ValueError: ``ranks`` holds a rank twice, a rank outside the
                system, or not this node's rank.
            UnsupportedError: ``backend`` is not ``"gloo"``, or the system does
                not run on torch RPC (in-process worlds).
        """

    @abstractmethod
    def trace(
        self, path: str | os.PathLike[str], *, sample: float = 1.0, max_events: int = 200_000
    ) -> AbstractAsyncContextManager[Timeline]:
        """Record a timeline of the whole system while the ``async with`` block runs, written to ``path`` at its end.

        Every node records each call (from its send to its outcome), tell,
        handler run and mailbox wait, on a track per actor (``main`` for
        code outside actors), with an arrow from each caller to the handler
        that served it, the path it took (``lane``, ``torch_rpc``, ``local``)
        and its bytes. The file is Chrome Trace Event JSON: open it in
        ui.perfetto.dev or chrome://tracing. Nodes on one machine share its
        clock; another machine's offset is estimated from round trips and
        kept consistent with the arrows. ``run(trace=PATH)`` (``actorch run
        --trace PATH``) traces a whole run. See docs/guides/seeing-inside.md.

        Args:
            path: The file to write (its directory must exist); it is replaced whole.
            sample: The fraction of messages recorded, in (0, 1]: both ends of
                a message decide alike, so a sampled call has its caller's
                span, its handler's and the arrow.
            max_events: Events one node keeps at most (a bound on memory);
                those past it are counted in the file's ``otherData.dropped``.

        Yields:
            The ``Timeline``: ``path`` and ``settings`` at once; ``events``,
            ``dropped`` and ``missing`` (nodes lost, or not answering within
            10 s) once the block has ended and it is written.

        Raises:
            ValueError: ``sample`` or ``max_events`` is out of range.
            TraceRunningError: This node already records a trace (one that
                ``run(trace=...)`` started for the whole run, or another block's).
            FileNotFoundError: ``path``'s directory does not exist.
        """

    @abstractmethod
    def statistics(self) -> dict[str, Any]:
        """This node's counters, for monitoring.

        Calls and tells sent and received, messages refused (from lost or
        unknown nodes), calls pending and calls waiting for room in a mailbox,
        actors hosted, and transport batches sent.
        """


def hand_over(system: ActorSystem, shutdown: Callable[[], Awaitable[None]]) -> None:
    """Let ``system.shutdown()`` end what this process drives (``actorch.start``'s system, ``connect``'s node)."""
    system._shutdown = shutdown
