"""Process groups beside actors: ``torch.distributed`` groups over chosen nodes, met through the world's own store.

Every member node calls :meth:`ProcessGroups.make` with the same ranks. The
members meet in the TCPStore the world already shares (the transport's
``shared_store``; torchrun's agent store under torchrun), so no port is picked
and nothing else listens. Each set of members (with its backend) has a key of
its own, and each meeting there is a *round*: a member reads the current
round, writes its presence under it, and waits until every member is present;
the first to see them all moves the round on, so a group made again later
meets under fresh keys. A member that gives up (deadline, cancellation, a lost
member) takes its presence back, so a later round is not misled by it.

The waiting runs in a daemon thread, polling the store, so the event loop stays
free and nothing waits past the deadline. The group is a ``ProcessGroup`` with a
Gloo backend, built as ``torch.distributed.new_group`` builds one and entered in
torch's table of groups with the members' actorch ranks as its global ranks, so
``DistributedDataParallel(..., process_group=group)``, the collectives
(``all_reduce(..., group=group)``, ``broadcast(src=rank, group=group)``) and
``get_process_group_ranks`` work, while torch's default group stays free. The
node destroys its groups when it shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from actorch._base.deadline import current_deadline
from actorch._base.errors import NodeLostError, SystemClosedError, UnsupportedError
from actorch._engine.node import Node, describe_ranks
from actorch._transport.bridge import in_daemon_thread
from actorch._transport.capabilities import NO_SHARED_STORE, require_torch_interop

__all__ = ["BACKENDS", "ProcessGroups"]

BACKENDS = ("gloo",)
"""The backends :meth:`ProcessGroups.make` builds."""

POLL = 0.02
"""Seconds between two looks at the store while members are missing."""

CONNECT_MINIMUM = 1.0
"""Seconds the members get to connect once all are present, however little of the deadline is left."""

CLOSE_TIMEOUT = 2.0
"""Seconds a node's shutdown waits for its groups to be destroyed."""


class _GaveUpError(Exception):
    """The caller stopped waiting: the meeting thread gives up quietly."""


@dataclass
class _Meeting:
    """One member's side of one meeting; the waiting thread and the caller's task share it.

    Its thread may outlive its last use by a moment, and hold the meeting then.
    A torch object whose last reference a daemon thread drops while the
    interpreter exits aborts the process (its destructor releases the GIL, and
    the thread is ended in the middle of it), so the thread lets go of the
    store before it ends and the caller takes the group out with :meth:`take`.
    """

    store: Any
    base: str
    rank: int
    members: tuple[int, ...]
    backend: str
    deadline: float  # time.monotonic()
    lost: Callable[[], list[int]]
    missing: list[int] = field(default_factory=list)
    connecting: bool = False
    group: dist.ProcessGroup | None = None
    name: str = ""
    group_store: Any = None
    _abandoned: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def abandon(self) -> dist.ProcessGroup | None:
        """Stop the thread at its next look; the group, if it is already built (the caller destroys it)."""
        with self._lock:
            self._abandoned = True
            group, self.group = self.group, None
            return group

    def take(self) -> tuple[dist.ProcessGroup, Any]:
        """The group and its store; the meeting keeps neither."""
        with self._lock:
            group, self.group = self.group, None
            store, self.group_store = self.group_store, None
        assert group is not None, "the meeting ended without a group or an error"
        return group, store

    def run(self) -> None:
        """Meet the other members in the store, then build the group (blocking; runs in a thread)."""
        store, self.store = self.store, None  # this frame's reference ends with the call, before the thread does
        self._meet(store)

    def _meet(self, store: Any) -> None:
        round_key = f"{self.base}/round"
        current = int(store.add(round_key, 0))
        here = f"{self.base}/{current}"
        keys = {rank: f"{here}/member/{rank}" for rank in self.members}
        store.set(keys[self.rank], "1")
        try:
            while True:
                self.missing = [rank for rank, key in keys.items() if not store.check([key])]
                if not self.missing:
                    break
                if self.lost() or self._abandoned or time.monotonic() >= self.deadline:
                    raise _GaveUpError
                time.sleep(min(POLL, max(self.deadline - time.monotonic(), 0.0)))
        except BaseException:
            with contextlib.suppress(Exception):
                store.delete_key(keys[self.rank])
            raise
        store.compare_set(round_key, str(current), str(current + 1))
        self.connecting = True
        self.name = f"{here}/group"
        group_store = dist.PrefixStore(f"{self.name}/", store)  # type: ignore[attr-defined]
        connect = max(self.deadline - time.monotonic(), CONNECT_MINIMUM)
        group = _build(group_store, self.members.index(self.rank), len(keys), connect)
        with self._lock:
            if self._abandoned:
                group.shutdown()
                raise _GaveUpError
            self.group, self.group_store = group, group_store


def _build(store: Any, group_rank: int, size: int, connect: float) -> dist.ProcessGroup:
    """A ProcessGroup with one Gloo backend for every device, as ``new_group`` builds it (blocks until connected)."""
    group = dist.ProcessGroup(store, group_rank, size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    cpu_store = dist.PrefixStore("cpu/", store)  # type: ignore[attr-defined]
    gloo = dist.ProcessGroupGloo(cpu_store, group_rank, size, timedelta(seconds=connect))
    gloo._set_sequence_number_for_group()
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    group.set_timeout(c10d.default_pg_timeout)  # collectives: torch's own bound, not the meeting's
    return group


class ProcessGroups:
    """This node's ``torch.distributed`` process groups: made by meeting in the shared store, destroyed at shutdown."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._groups: list[dist.ProcessGroup] = []
        self._locks: dict[str, asyncio.Lock] = {}
        self._made = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"<ProcessGroups node {self._node.rank} groups={len(self._groups)}>"

    def statistics(self) -> dict[str, int]:
        """Groups this node holds now, and groups it made."""
        return {"groups": len(self._groups), "made": self._made}

    def members(self, ranks: Iterable[int] | None) -> tuple[int, ...]:
        """The sorted member ranks that ``ranks`` asks for (None: every live node); checked.

        Raises:
            ValueError: A rank is not a node of the system, appears twice, or this node is not among them.
            NodeLostError: A member was lost.
        """
        node = self._node
        if ranks is None:
            members = tuple(rank for rank in node.ranks() if rank not in node.lost)
        else:
            asked = list(ranks)
            if not all(isinstance(rank, int) and not isinstance(rank, bool) for rank in asked):
                raise ValueError(f"process_group(ranks={asked!r}): ranks are node ranks (ints)")
            members = tuple(sorted(set(asked)))
            if len(members) != len(asked):
                raise ValueError(f"process_group(ranks={asked!r}): a rank appears twice")
            known = node.ranks()
            strange = [rank for rank in members if rank not in known]
            if strange:
                raise ValueError(
                    f"process_group(ranks={asked!r}): {strange} are not ranks of this system ({describe_ranks(known)})"
                )
        if node.rank not in members:
            raise ValueError(
                f"process_group(ranks={list(members)!r}) called on node {node.rank}, which is not a member: "
                "call it on the member nodes only"
            )
        lost = [rank for rank in members if rank in node.lost]
        if lost:
            raise NodeLostError(
                f"process group over nodes {list(members)}: node {lost[0]} was lost ({node.lost[lost[0]]})"
            )
        return members

    async def make(self, ranks: Iterable[int] | None, backend: str, limit: float) -> dist.ProcessGroup:
        """Meet the other members and return the group; see ``ActorSystem.process_group``.

        Waits until the enclosing deadline or, without one, ``limit`` seconds.
        """
        if backend not in BACKENDS:
            raise UnsupportedError(
                f"process_group(backend={backend!r}): actorch builds {', '.join(map(repr, BACKENDS))} groups only"
            )
        members = self.members(ranks)
        try:
            store = require_torch_interop(self._node.transport, NO_SHARED_STORE).shared_store()
        except UnsupportedError as exc:
            raise UnsupportedError(
                f"process_group(ranks={list(members)!r}) needs a system on torch RPC (actorch.run or torchrun), "
                f"with a store the nodes share: {exc}"
            ) from None
        base = f"actorch/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/process_groups/{backend}/" + "-".join(
            map(str, members)
        )
        loop = asyncio.get_running_loop()
        enclosing = current_deadline()
        seconds = (enclosing - loop.time()) if enclosing is not None else limit
        lock = self._locks.setdefault(base, asyncio.Lock())
        async with lock:  # two callers on one node, same members: one meeting each, in turn
            meeting = _Meeting(
                store, base, self._node.rank, members, backend, time.monotonic() + seconds, self._lost_of(members)
            )
            try:
                await in_daemon_thread(meeting.run)
            except _GaveUpError:
                self._raise_for(meeting, seconds)
            except asyncio.CancelledError:
                orphan = meeting.abandon()
                if orphan is not None:
                    orphan.shutdown()
                if enclosing is not None and loop.time() >= enclosing:
                    self._raise_for(meeting, seconds)
                raise
            except RuntimeError as exc:
                if meeting.connecting or meeting.lost():  # Gloo could not connect every member
                    self._raise_for(meeting, seconds, exc)
                raise  # the store failed
        group, group_store = meeting.take()
        if self._closed:
            group.shutdown()
            raise SystemClosedError(
                f"node {self._node.rank} shut down while making a process group over {list(members)}"
            )
        _register(group, group_store, meeting.name, meeting.backend, members)
        self._groups.append(group)
        self._made += 1
        return group

    def _lost_of(self, members: tuple[int, ...]) -> Callable[[], list[int]]:
        lost = self._node.lost  # the loop writes it; the meeting thread only tests membership

        def lost_members() -> list[int]:
            return [rank for rank in members if rank in lost]

        return lost_members

    def _raise_for(self, meeting: _Meeting, seconds: float, cause: BaseException | None = None) -> None:
        """Raise what ended ``meeting`` early: a lost member, or the deadline."""
        members = list(meeting.members)
        what = f"process group over nodes {members} ({meeting.backend})"
        lost = meeting.lost()
        if lost:
            raise NodeLostError(f"{what}: node {lost[0]} was lost ({self._node.lost.get(lost[0])})") from cause
        if meeting.connecting:
            raise TimeoutError(
                f"{what}: every member arrived but they did not all connect within the deadline "
                f"(node {meeting.rank}): {cause}"
            ) from cause
        missing = meeting.missing or [rank for rank in members if rank != meeting.rank]
        raise TimeoutError(
            f"{what}: node(s) {missing} did not call process_group within {seconds:.3g} s (node {meeting.rank} "
            "waited). Call system.process_group with the same ranks on every member at the same time, e.g. "
            "through asyncio.gather over their actors' endpoints, not one member after another (such as from "
            "on_start of actors spawned one by one)."
        ) from cause

    async def close(self) -> None:
        """Destroy this node's groups (the node shuts down); bounded by ``CLOSE_TIMEOUT``."""
        self._closed = True
        groups, self._groups = self._groups, []
        if not groups:
            return

        def destroy() -> None:
            # Pop each group, so that this thread holds none once it ends (see _Meeting).
            while groups:
                group = groups.pop()
                try:
                    dist.destroy_process_group(group)
                except ValueError:  # the user destroyed it already, or it was never entered in torch's table
                    group.shutdown()

        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await in_daemon_thread(destroy)
        except Exception as exc:  # noqa: BLE001 - shutdown goes on; the process exit takes the rest
            self._node.log.warning("process groups were not destroyed cleanly", error=repr(exc))


def _register(group: dist.ProcessGroup, store: Any, name: str, backend: str, members: tuple[int, ...]) -> None:
    """Enter ``group`` in torch's table of groups, with actorch ranks as its global ranks, as ``new_group`` does.

    ``DistributedDataParallel`` and ``all_reduce`` work without it; ``broadcast(src=...)``,
    ``get_process_group_ranks`` and the functional collectives look groups up there.
    """
    group._set_group_name(c10d.GroupName(name))
    register = getattr(c10d, "_register_pg_in_world", None)
    if register is not None:  # torch 2.13's helper; without it the group still works for DDP and collectives
        ranks = {rank: index for index, rank in enumerate(members)}
        register(group, backend, store, name, f"cpu:{backend}", rank_mapping=ranks)
