"""The part of ``ActorSystem`` that places work by what nodes have: groups, node processes on demand, waiting for nodes.

``ActorSystem`` inherits these methods; they do their work through the node's
:class:`~actorch._actors.placing.Placer`. ``spawn(on=Where(...))`` goes the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._actors.actor import Actor, class_path
from actorch._actors.placing import PlacedSpawn, Placer, all_or_none, check_count, member_names
from actorch._actors.ref import ActorRef, resolve_class
from actorch._actors.registry import Registry
from actorch._actors.relocator import Relocator
from actorch._actors.restart import Restart
from actorch._actors.service import NodeService
from actorch._actors.where import Where
from actorch._base.config import is_number
from actorch._base.names import check_name
from actorch._base.resources import GPUS, check_resources
from actorch._transport.base import NodeInfo

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from actorch._actors.host import ActorHost

__all__ = ["SystemPlacement", "check_spawnable"]

A = TypeVar("A", bound=Actor)


def check_spawnable(cls: object, restart: object) -> None:
    """Refuse what cannot be spawned: not an actor class, one other nodes cannot import, a bad restart policy."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)) or cls in (NodeService, Registry, Relocator):
        raise TypeError(f"spawn() takes an actorch.Actor subclass, not {cls!r}")
    if resolve_class(class_path(cls)) is not cls:
        raise TypeError(
            f"actor class {cls.__qualname__} cannot be imported as {class_path(cls)!r}: define actor "
            "classes at module level, so every node can import them"
        )
    if restart is not None and not isinstance(restart, Restart):
        raise TypeError(f"restart must be an actorch.Restart or None, not {restart!r}")


class SystemPlacement:
    """``ActorSystem``'s methods for groups, node processes and waiting for nodes (it inherits them)."""

    _host: ActorHost

    if TYPE_CHECKING:  # ActorSystem's own, which these methods build on
        spawn: Callable[..., Coroutine[Any, Any, ActorRef[Any]]]
        _spawn_on: Callable[..., Coroutine[Any, Any, ActorRef[Any]]]

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
            ValueError: ``count`` is not an int >= 1.
            And what ``spawn`` raises.
        """
        check_count(count, "spawn_group(count=...)")
        check_spawnable(cls, restart)
        names = member_names(check_name(name) if name is not None else None, count)
        if on is None and spread:
            on = Where()
        if not isinstance(on, Where):  # every member on node ``on``, or on this one
            return await all_or_none(
                self.spawn(cls, args=args, kwargs=kwargs, name=member, on=on, restart=restart) for member in names
            )
        what = f"spawn_group({cls.__qualname__}, {count}, on={on!r}, spread={spread})"
        owners = [member or cls.__qualname__ for member in names]
        spawn_there = self._placed_spawn(cls, args, kwargs, restart, None, on)
        return await self._placer.spawn(what, on, names, owners, spread, spawn_there)

    def _placed_spawn(
        self,
        cls: type[A],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None,
        restart: Restart | None,
        device: str | None,
        where: Where,
    ) -> PlacedSpawn[ActorRef[A]]:
        """How the placer spawns on the node it chose: holding what ``Where`` asks, maybe as the node's owner."""
        fits = (where.label, where.host)

        async def spawn_there(rank: int, name: str | None, needs: Mapping[str, float], own: bool) -> ActorRef[A]:
            counted = {resource: amount for resource, amount in needs.items() if resource != GPUS}
            gpus = int(needs.get(GPUS, 0))
            return await self._spawn_on(
                rank, cls, args, kwargs, name, restart, device, gpus, counted, own=own, fits=fits
            )

        return spawn_there

    @functools.cached_property
    def _placer(self) -> Placer:
        return Placer(self._host)

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
        check_count(count, "add_nodes(count=...)")
        where = Where(label=label, host=host, env=env, process="own")  # checks label, host and env
        declared = check_resources(resources, "add_nodes(resources=...)")
        return await self._placer.add_nodes(count, where.label, declared, where.env or {}, where.host)

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
        check_count(count, "wait_nodes(count=...)")
        if timeout is not None and not is_number(timeout):
            raise ValueError(f"timeout must be a number of seconds >= 0 or None, not {timeout!r}")
        return await self._placer.wait_nodes(count, label, timeout)
