"""``ActorSystem``: the per-node handle users spawn, look up and watch through, and nothing more.

Each node's :class:`~actorch._actors.host.ActorHost` does the work: it hosts a
``NodeService`` actor (id 1) that builds actors spawned on the node, stops and
watches them, evicts names from the node's cache and takes part in shutdown;
rank 0 also hosts the ``Registry`` (id 2) and the ``Relocator`` (id 3). :func:`open_system` makes a node's
host and its system together, for the launcher and the test worlds.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._actors.actor import Actor, attach, class_path
from actorch._actors.events import MembershipEvent, NameRegistered, NodeJoined, Subscription
from actorch._actors.host import ActorHost
from actorch._actors.placement import GpuShare, candidate_ranks, place_on_gpus
from actorch._actors.ref import ActorRef
from actorch._actors.registry import Registry
from actorch._actors.relocation import check_home, relocatable_homes
from actorch._actors.restart import Restart
from actorch._actors.service import NodeService
from actorch._actors.system_placement import SystemPlacement, check_spawnable
from actorch._actors.where import Where
from actorch._base.config import SystemConfig, is_count
from actorch._base.deadline import current_deadline
from actorch._base.devices import parse_device
from actorch._base.errors import ActorNotFoundError, NodeLostError, PlacementError, UnsupportedError
from actorch._base.names import check_name, compile_pattern
from actorch._engine.node import describe_ranks
from actorch._transport.base import NodeInfo, Transport

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = ["ActorSystem", "NodeInfo", "hand_over", "open_system"]

A = TypeVar("A", bound=Actor)

STALE_NAME_RETRY = 0.05
"""Seconds a lookup waits before asking again for a name the registry still gives to a lost node."""


def open_system(transport: Transport, config: SystemConfig) -> tuple[ActorSystem, ActorHost]:
    """The system of the node that ``transport`` connects, on the running event loop, and its host."""
    system = object.__new__(ActorSystem)
    host = ActorHost(transport, config, functools.partial(_attach, system=system))
    system._host = host
    system.config = config
    return system, host


def hand_over(system: ActorSystem, shutdown: Callable[[], Awaitable[None]]) -> None:
    """Let ``system.shutdown()`` end what this process drives (``actorch.start``'s system, ``connect``'s node)."""
    system._shutdown = shutdown


def _defined_interactively(cls: type) -> bool:
    """Whether ``cls`` lives in a ``__main__`` without a file (a notebook, ``python -c``): no other process has it."""
    main = sys.modules.get("__main__")
    return cls.__module__ == "__main__" and main is not None and getattr(main, "__file__", None) is None


def _attach(instance: Actor, ref: ActorRef[Any], *, system: ActorSystem) -> None:
    attach(instance, ref, system)


class ActorSystem(SystemPlacement):
    """The actor system as seen from one node: spawn actors, find them by name.

    Made by :func:`actorch.run` and handed to ``main``; inside an actor it is
    ``self.system``.
    """

    _host: ActorHost
    _shutdown: Callable[[], Awaitable[None]] | None = None
    config: SystemConfig

    def __init__(self) -> None:
        raise TypeError("ActorSystem objects are made by actorch.run(), actorch.start() and actorch.connect()")

    def __repr__(self) -> str:
        return f"<ActorSystem node {self.rank} of {self.world_size}>"

    @property
    def rank(self) -> int:
        """This node's rank (0 runs ``main``)."""
        return self._host.rank

    @property
    def world_size(self) -> int:
        """How many nodes the system has (lost ones included; in an elastic system it changes)."""
        return self._host.node.world_size

    @property
    def nodes(self) -> list[NodeInfo]:
        """Every node of the system (rank, worker name, host, pid, GPUs), by rank; nodes that left are not."""
        return self._host.node.peers()

    @property
    def lost_nodes(self) -> dict[int, str]:
        """Ranks of nodes that were lost, with why (not those that left on purpose)."""
        node = self._host.node
        return {rank: why for rank, why in node.lost.items() if rank not in node.left}

    @property
    def elastic(self) -> bool:
        """Whether nodes may join and leave this system while it runs (``run(..., elastic=True)``)."""
        return self._host.node.transport.elastic

    def join_env(self) -> dict[str, str]:
        """The environment a process needs to join this system with ``actorch.serve()``.

        ``ACTORCH_ADDRESS`` (rank 0's store) and ``ACTORCH_JOIN_TOKEN``. Pass
        them in the environment, not on a command line, where other users of
        the machine could read the token.

        Raises:
            UnsupportedError: The system is not elastic, or this is not rank 0.
        """
        if self.rank != 0:
            raise UnsupportedError(f"join_env() is rank 0's (this is node {self.rank})")
        return self._host.node.transport.join_env()

    async def leave(self, rank: int | None = None) -> None:
        """Have a node leave the system, draining it first: this node, or node ``rank``.

        The node announces it (nothing more is spawned there), stops its actors
        (``on_stop`` runs, queued messages finish within ``stop_grace``, names
        go), tells every node it has left (they see ``NodeLeft``; calls still
        waiting on it end in ``ActorStoppedError``), and its process exits with
        code 0. On the leaving node itself this returns once the leave has
        begun (the calling actor stops with the others); for another node it
        returns once that node has left the system (its process exits just after).

        Raises:
            UnsupportedError: The system is not elastic.
            ValueError: ``rank`` is 0 (rank 0 runs ``main``) or not a node of the system.
            NodeLostError: Node ``rank`` was lost.
            TimeoutError: Node ``rank`` was not gone within ``2 * stop_grace`` plus 10 s.
        """
        host = self._host
        node = host.node
        target = self.rank if rank is None else rank
        host.check_leave(target)
        if target in node.left:
            return  # it has left already
        if target not in node.ranks():
            raise ValueError(f"leave(rank={rank!r}): not a node of this system ({describe_ranks(node.ranks())})")
        if target in node.lost:
            raise NodeLostError(f"node {target} cannot leave: it was lost ({node.lost[target]})")
        if target == self.rank:
            host.begin_leave()
            return
        await host.services[target].call(NodeService.leave)
        await host.wait_gone(target, 2 * self.config.stop_grace + 10.0)

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
            on: Rank of the node to host it; or a ``Where`` that describes the
                node (label, host, resources the actor holds until it stops)
                or asks for a process of the actor's own (see ``Where``).
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
                device is the first. Without ``on``, the node is this one if it
                has enough free, else the lowest rank that has (lost nodes
                skipped). Not with ``device``.

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
            ValueError: ``device`` is not a device, or node ``on`` does not have
                it; ``gpus`` is not an int >= 0, or comes with ``device``; the
                actor is relocatable and would live on rank 0.
        """
        check_spawnable(cls, restart)
        if not is_count(gpus, 0):
            raise ValueError(f"gpus must be an int >= 0, not {gpus!r}")
        if gpus and device is not None:
            raise ValueError(
                f"spawn({cls.__qualname__}): give device= or gpus=, not both (gpus= places the actor on "
                "the first GPU it is lent)"
            )
        if name is not None:
            check_name(name)
        placed = None if device is None else str(parse_device(device))
        if isinstance(on, Where):
            if gpus or (placed is not None and on.gpus):
                raise ValueError(f"spawn({cls.__qualname__}): ask for GPUs in Where(gpus=...) alone, without device=")
            what = f"spawn({cls.__qualname__}, on={on!r})"
            placed_spawn = self._placed_spawn(cls, args, kwargs, restart, placed, on)
            return (await self._placer.spawn(what, on, [name], [name or cls.__qualname__], None, placed_spawn))[0]
        rank = self.rank if on is None else on
        node = self._host.node
        if isinstance(rank, int) and (rank in self._host.leaving or rank in node.left):
            raise PlacementError(f"cannot spawn {cls.__qualname__} on node {rank}: it is leaving the system")
        if not isinstance(rank, int) or rank not in node.ranks():
            raise ValueError(f"on={on!r} is not a rank of this system ({describe_ranks(node.ranks())})")
        if rank in node.lost:
            raise NodeLostError(f"cannot spawn {cls.__qualname__} on node {rank}: it was lost")
        if not gpus:
            return await self._spawn_on(rank, cls, args, kwargs, name, restart, placed, 0)

        async def spawn_there(rank: int) -> ActorRef[A]:
            return await self._spawn_on(rank, cls, args, kwargs, name, restart, None, gpus)

        what = f"spawn({cls.__qualname__}, gpus={gpus}{'' if on is None else f', on={on}'})"
        ranks = candidate_ranks(self.rank, [rank for rank in node.ranks() if rank not in self._host.leaving], on)
        if restart is not None and restart.relocate:
            ranks = relocatable_homes(cls.__qualname__, ranks)
        return await place_on_gpus(what, gpus, ranks, self._gpu_share, spawn_there)

    async def _gpu_share(self, rank: int) -> GpuShare | None:
        """Node ``rank``'s GPUs and who holds them; None if the node is lost."""
        try:
            devices, holders = await self._host.services[rank].call(NodeService.gpus)
        except NodeLostError:
            return None
        return GpuShare(rank, tuple(devices), holders)

    async def _spawn_on(
        self,
        rank: int,
        cls: type[A],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None,
        name: str | None,
        restart: Restart | None,
        device: str | None,
        gpus: int,
        needs: Mapping[str, float] | None = None,
        *,
        own: bool = False,
        fits: tuple[str | None, str | None] | None = None,
    ) -> ActorRef[A]:
        """Reserve ``name`` for node ``rank``, have the node build the actor there, bind the name.

        ``fits``: the label and host a ``Where`` asked for, which a relocatable
        actor's new node must have too.
        """
        if restart is not None and restart.relocate:
            check_home(cls.__qualname__, rank)
            if own:
                raise ValueError(
                    f"spawn({cls.__qualname__}): an actor in a process of its own (Where(process='own')) is not "
                    "relocated: its process ends with its node; relocate it with a Where that names a label instead"
                )
        if rank != self.rank and _defined_interactively(cls):
            raise TypeError(
                f"cannot spawn {cls.__qualname__} on node {rank}: it is defined in the __main__ of an interactive "
                "session (a notebook cell), which other processes cannot import; define it in a module (a .py "
                "file beside the notebook) and import it from there"
            )
        if name is not None:
            await self._host.registry.call(Registry.reserve, name, rank)
        try:
            options: dict[str, Any] = {}  # a plain spawn's message stays as it was
            if needs:
                options["needs"] = dict(needs)
            if own:
                options["own"] = True
            if fits is not None and restart is not None and restart.relocate and fits != (None, None):
                options["fits"] = fits
            ref: ActorRef[A] = await self._host.services[rank].call(
                NodeService.spawn,
                class_path(cls),
                list(args),
                dict(kwargs or {}),
                name,
                restart,
                device,
                gpus,
                **options,
            )
        except BaseException:
            if name is not None:
                await asyncio.shield(self._host.release_name(name))
            raise
        if name is not None:
            await self._host.registry.call(Registry.bind, name, ref)
        return ref

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
        check_name(name)
        cached = self._host.cache.get(name)
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        own_limit = loop.time() + self.config.lookup_timeout
        enclosing = current_deadline()
        try:
            generation = self._host.cache.generation()
            ref = await self._host.registry.call(Registry.resolve, name, False)  # a name that exists: no timer
            if ref is None or ref.rank in self._host.node.lost:
                async with asyncio.timeout_at(own_limit):
                    while True:
                        generation = self._host.cache.generation()
                        ref = await self._host.registry.call(Registry.resolve, name, True)
                        if ref is None or ref.rank not in self._host.node.lost:
                            break
                        await asyncio.sleep(STALE_NAME_RETRY)  # the registry has yet to hear of that loss
        except TimeoutError:
            raise ActorNotFoundError(
                f"no actor named {name!r} appeared within {self.config.lookup_timeout:g} s "
                f"(lookup from node {self.rank})"
            ) from None
        except asyncio.CancelledError:
            if enclosing is not None and loop.time() >= enclosing:
                raise ActorNotFoundError(
                    f"no actor named {name!r} appeared before the caller's deadline (lookup from node {self.rank})"
                ) from None
            raise
        if ref is None:  # resolve(wait=True) only returns once bound
            raise ActorNotFoundError(f"no actor named {name!r} (lookup from node {self.rank})")
        self._host.cache.put(name, ref, generation)
        return ref

    async def events(self, pattern: str | None = None) -> AsyncIterator[MembershipEvent]:
        """Membership events, as they happen: nodes joined and lost, names registered and removed.

        It first yields the current state (``NodeJoined`` for every live node,
        ``NameRegistered`` for every name), then each change, in order, until
        this node shuts down. Use it in ``async for``; leaving the loop (or
        ``aclose()``) ends the subscription.

        Args:
            pattern: Only name events whose name matches this glob (node events always come).
        """
        regex = compile_pattern(pattern) if pattern is not None else None
        subscription = Subscription(regex)
        self._host.events.subscriptions.add(subscription)
        try:
            seq, names = await self._host.registry.call(Registry.subscribe, self.rank)
            self._host.events.snapshot_came(subscription, seq)
            for info in self.nodes:
                if info.rank not in self._host.node.lost:
                    yield NodeJoined(info.rank, info)
            for name, ref in names:
                if regex is None or regex.fullmatch(name):
                    yield NameRegistered(name, ref)
            while (event := await subscription.queue.get()) is not None:
                yield event
        finally:
            self._host.events.subscriptions.discard(subscription)

    async def lookup_all(self, pattern: str) -> list[ActorRef[Any]]:
        """Actors whose names match the glob ``pattern`` (``rl/observers/*``), sorted by name.

        ``*`` and ``?`` match within one path segment, ``**`` across segments.
        Does not wait: it lists the names that exist now.
        """
        compile_pattern(pattern)
        return await self._host.registry.call(Registry.match, pattern)

    def rref(self, value: Any) -> Any:
        """Wrap ``value`` in a ``torch.distributed.rpc.RRef`` owned by this node.

        For torch's own distributed tools (``torch.distributed.autograd``,
        ``DistributedOptimizer``), which work on RRefs. RRefs can be sent inside
        calls and replies like any value.

        Raises:
            UnsupportedError: If the system does not run on torch RPC (in-process worlds).
        """
        return self._host.node.transport.make_rref(value)

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
        return await self._host.process_groups.make(ranks, backend, self.config.lookup_timeout)

    def statistics(self) -> dict[str, Any]:
        """This node's counters, for monitoring.

        Calls and tells sent and received, messages refused (from lost or
        unknown nodes), calls pending and calls waiting for room in a mailbox,
        actors hosted, and transport batches sent.
        """
        node = self._host.node
        return {**node.statistics(), "transport_batches": node.transport.bundles_sent}
