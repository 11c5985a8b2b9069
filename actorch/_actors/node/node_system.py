"""``NodeSystem``: the ``ActorSystem`` of one node, doing its work through the node's ``ActorHost``.

Each node's :class:`~actorch._actors.node.host.ActorHost` hosts a ``NodeService``
actor that builds actors spawned on the node, stops and watches them, evicts
names from the node's cache and takes part in shutdown; rank 0 also hosts the
``Registry`` and the ``Relocator`` (their ids: ``_engine.system_ids``). The
system holds the host, a :class:`~actorch._actors.node.spawner.Spawner` (spawn,
spawn_group, with the keywords ``ActorSystem`` declares, in a ``SpawnOptions``)
and a :class:`~actorch._actors.placement.where_placer.Placer` (the node every spawn
goes to, node processes on demand); it keeps the view of the nodes and the
names (lookups, events) itself. :func:`open_system` makes a node's system, and
its host with it, for the launcher and the test worlds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._actors.actor import Actor, attach
from actorch._actors.events import NameRegistered, NodeJoined, Subscription
from actorch._actors.node.host import ActorHost
from actorch._actors.node.service import NodeService
from actorch._actors.node.spawner import Spawner, check_count
from actorch._actors.node_request import NodeRequest
from actorch._actors.placement.where_placer import Placer
from actorch._actors.ref import ActorRef
from actorch._actors.registry import Registry
from actorch._actors.system import ActorSystem, MembershipEvent, SpawnOptions
from actorch._actors.tracing import record_timeline
from actorch._base.config import SystemConfig, is_number
from actorch._base.deadline import current_deadline
from actorch._base.errors import ActorNotFoundError, NodeLostError, UnsupportedError
from actorch._base.names import check_name, compile_pattern
from actorch._engine.node import describe_ranks
from actorch._engine.timeline import Timeline
from actorch._engine.tracing import TraceSettings
from actorch._transport.base import NodeInfo, Transport
from actorch._transport.capabilities import NO_RREFS, NOT_ELASTIC, is_elastic, require_elastic, require_torch_interop

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["NodeSystem", "open_system"]

A = TypeVar("A", bound=Actor)

STALE_NAME_RETRY = 0.05
"""Seconds a lookup waits before asking again for a name the registry still gives to a lost node."""


def open_system(transport: Transport, config: SystemConfig) -> tuple[NodeSystem, ActorHost]:
    """The system of the node that ``transport`` connects, on the running event loop, and its host."""
    system = NodeSystem._create(transport, config)
    return system, system.host


class NodeSystem(ActorSystem):
    """The ``ActorSystem`` of one node, composed of its host, a spawner and a placer.

    It spawns through the spawner (which places through the placer), adds
    and waits for nodes through the placer, and knows the nodes, names and
    events through the host.
    """

    def __init__(self, transport: Transport, config: SystemConfig) -> None:
        self.config = config
        self._transport = transport  # what it can do beyond moving messages: elastic membership, RRefs
        self._host = ActorHost(transport, config, self._attach)
        self._placer = Placer(self._host)
        self._spawner = Spawner(self._host, self._placer)

    def _attach(self, instance: Actor, ref: ActorRef[Any]) -> None:
        """Give a new actor instance of this node its ref and this system."""
        attach(instance, ref, self)

    @property
    def host(self) -> ActorHost:
        """This node's actor host, for the launcher and the test worlds (not part of ``ActorSystem``)."""
        return self._host

    @property
    def rank(self) -> int:
        return self._host.rank

    @property
    def world_size(self) -> int:
        return self._host.world_size

    @property
    def nodes(self) -> list[NodeInfo]:
        host = self._host
        return [info for info in host.peers() if info.rank not in host.lost]

    @property
    def lost_nodes(self) -> dict[int, str]:
        host = self._host
        return {rank: why for rank, why in host.lost.items() if rank not in host.left}

    @property
    def elastic(self) -> bool:
        return is_elastic(self._transport)

    def join_env(self) -> dict[str, str]:
        if self.rank != 0:
            raise UnsupportedError(f"join_env() is rank 0's (this is node {self.rank})")
        return require_elastic(self._transport, NOT_ELASTIC).join_env()

    async def leave(self, rank: int | None = None) -> None:
        host = self._host
        target = self.rank if rank is None else rank
        host.check_leave(target)
        if target in host.left:
            return  # it has left already
        if target not in host.ranks():
            raise ValueError(f"leave(rank={rank!r}): not a node of this system ({describe_ranks(host.ranks())})")
        if target in host.lost:
            raise NodeLostError(f"node {target} cannot leave: it was lost ({host.lost[target]})")
        if target == self.rank:
            host.begin_leave()
            return
        await host.services[target].call(NodeService.leave)
        await host.wait_gone(target, 2 * self.config.stop_grace + 10.0)

    async def _spawn(self, cls: type[A], options: SpawnOptions) -> ActorRef[A]:
        return await self._spawner.spawn(cls, options)

    async def _spawn_group(self, cls: type[A], count: int, options: SpawnOptions, spread: bool) -> list[ActorRef[A]]:
        return await self._spawner.spawn_group(cls, count, options, spread)

    async def add_nodes(
        self,
        count: int,
        *,
        label: str | None = None,
        resources: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
    ) -> list[NodeInfo]:
        declared = {} if resources is None else resources
        request = NodeRequest(count, label, declared, {} if env is None else env, host)  # which checks them all
        return await self._placer.add_nodes(request)

    async def wait_nodes(
        self,
        count: int,
        *,
        label: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - torchelastic's --nnodes has its timeout too
    ) -> list[NodeInfo]:
        check_count(count, "wait_nodes(count=...)")
        if timeout is not None and not is_number(timeout):
            raise ValueError(f"timeout must be a number of seconds >= 0 or None, not {timeout!r}")
        return await self._placer.wait_nodes(count, label, timeout)

    async def lookup(self, name: str) -> ActorRef[Any]:
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
            if ref is None or ref.rank in self._host.lost:
                async with asyncio.timeout_at(own_limit):
                    while True:
                        generation = self._host.cache.generation()
                        ref = await self._host.registry.call(Registry.resolve, name, True)
                        if ref is None or ref.rank not in self._host.lost:
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
        regex = compile_pattern(pattern) if pattern is not None else None
        subscription = Subscription(regex)
        self._host.events.subscriptions.add(subscription)
        try:
            seq, names = await self._host.registry.call(Registry.subscribe, self.rank)
            self._host.events.snapshot_came(subscription, seq)
            for info in self.nodes:
                if info.rank not in self._host.lost:
                    yield NodeJoined(info.rank, info)
            for name, ref in names:
                if regex is None or regex.fullmatch(name):
                    yield NameRegistered(name, ref)
            while (event := await subscription.queue.get()) is not None:
                yield event
        finally:
            self._host.events.subscriptions.discard(subscription)

    async def lookup_all(self, pattern: str) -> list[ActorRef[Any]]:
        compile_pattern(pattern)
        return await self._host.registry.call(Registry.match, pattern)

    def rref(self, value: Any) -> Any:
        return require_torch_interop(self._transport, NO_RREFS).make_rref(value)

    async def process_group(self, ranks: Iterable[int] | None = None, *, backend: str = "gloo") -> dist.ProcessGroup:
        return await self._host.process_groups.make(ranks, backend, self.config.lookup_timeout)

    def trace(
        self, path: str | os.PathLike[str], *, sample: float = 1.0, max_events: int = 200_000
    ) -> AbstractAsyncContextManager[Timeline]:
        return record_timeline(self._host, path, TraceSettings(sample, max_events))

    def statistics(self) -> dict[str, Any]:
        return {**self._host.statistics(), "transport_batches": self._transport.bundles_sent}
