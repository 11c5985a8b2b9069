"""``Spawner``: how a node's system spawns actors, one or a group, and on which node.

One actor goes to a rank, to GPUs lent to it (``gpus=``), or where a ``Where``
places it (through the node's :class:`~actorch._actors.placement.where_placer.Placer`); a
group is planned by the ``Placer`` in one go. On the chosen node the node
service builds the actor; the registry reserves its name first and binds it
once the actor has started.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._actors.actor import Actor, check_plain_methods, class_path
from actorch._actors.node.service import NodeService
from actorch._actors.node.spawn_request import NOWHERE, SpawnRequest
from actorch._actors.placement.gpus import GpuShare, candidate_ranks, check_device, place_on_gpus
from actorch._actors.placement.where import Where
from actorch._actors.placement.where_placer import Placer, all_or_none
from actorch._actors.ref import ActorRef, resolve_class
from actorch._actors.registry import Registry
from actorch._actors.relocation.relocator import Relocator
from actorch._actors.relocation.spec import check_home, relocatable_homes
from actorch._actors.restart import Restart
from actorch._base.config import is_count
from actorch._base.devices import parse_device
from actorch._base.errors import NameTakenError, NodeLostError, PlacementError
from actorch._base.names import check_name
from actorch._engine.node import describe_ranks

if TYPE_CHECKING:
    import torch

    from actorch._actors.node.host import ActorHost

__all__ = ["Spawner", "check_count", "check_spawnable"]

A = TypeVar("A", bound=Actor)


def check_count(count: object, what: str) -> int:
    """``count`` if it is an int >= 1, else ``ValueError`` naming ``what``."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{what} must be an int >= 1, not {count!r}")
    return count


def member_names(name: str | None, count: int) -> list[str | None]:
    """The names of a group's members: ``name/0`` ... ``name/<count-1>``, or none."""
    return [None] * count if name is None else [f"{name}/{index}" for index in range(count)]


def check_spawnable(
    cls: object, restart: object, on: object = None, args: object = (), kwargs: object = None, call: str = "spawn"
) -> None:
    """Refuse what cannot be spawned, before anything starts.

    That is: not an actor class, one other nodes cannot import, one with a
    public plain ``def`` method, arguments for it that are not a tuple (or
    list) and a dict with ``str`` keys, a bad restart policy, a relocatable
    actor in a process of its own. ``call`` names the method in the messages.
    """
    if not (isinstance(cls, type) and issubclass(cls, Actor)) or cls in (NodeService, Registry, Relocator):
        raise TypeError(f"{call}() takes an actorch.Actor subclass, not {cls!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(
            f"{call}({cls.__qualname__}): args must be a tuple of positional arguments for "
            f"{cls.__qualname__}.__init__, not {args!r} ({type(args).__name__}); one argument is args=(x,)"
        )
    if kwargs is not None and not (isinstance(kwargs, Mapping) and all(isinstance(key, str) for key in kwargs)):
        raise TypeError(
            f"{call}({cls.__qualname__}): kwargs must be a dict of keyword arguments for "
            f"{cls.__qualname__}.__init__ (str keys), not {kwargs!r} ({type(kwargs).__name__})"
        )
    check_plain_methods(cls)
    if resolve_class(class_path(cls)) is not cls:
        raise TypeError(
            f"actor class {cls.__qualname__} cannot be imported as {class_path(cls)!r}: define actor "
            "classes at module level, so every node can import them"
        )
    if restart is not None and not isinstance(restart, Restart):
        raise TypeError(f"restart must be an actorch.Restart or None, not {restart!r}")
    if isinstance(on, Where) and on.own and restart is not None and restart.relocate:
        raise ValueError(_OWN_NOT_RELOCATED.format(cls.__qualname__))


_OWN_NOT_RELOCATED = (
    "spawn({}): an actor in a process of its own (Where(process='own')) is not relocated: its process ends with "
    "its node; relocate it with a Where that names a label instead"
)


def _defined_interactively(cls: type) -> bool:
    """Whether ``cls`` lives in a ``__main__`` without a file (a notebook, ``python -c``): no other process has it."""
    main = sys.modules.get("__main__")
    return cls.__module__ == "__main__" and main is not None and getattr(main, "__file__", None) is None


class Spawner:
    """Spawns actors for one node's system: one on a rank or on GPUs lent to it, or through the ``Placer``."""

    def __init__(self, host: ActorHost, placer: Placer) -> None:
        self._host = host
        self._placer = placer

    def __repr__(self) -> str:
        return f"<Spawner node {self._host.rank}>"

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
        """Spawn an actor of ``cls`` as ``ActorSystem.spawn`` says: its arguments checked, then on the node chosen."""
        check_spawnable(cls, restart, on, args, kwargs)
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
        if isinstance(on, Where) and (gpus or (placed is not None and on.gpus)):
            raise ValueError(f"spawn({cls.__qualname__}): ask for GPUs in Where(gpus=...) alone, without device=")
        where = on if isinstance(on, Where) else NOWHERE
        request = SpawnRequest(class_path(cls), tuple(args), dict(kwargs or {}), name, restart, placed, gpus, where)
        spawn_there = functools.partial(self.spawn_on, cls)
        if isinstance(on, Where):
            what = f"spawn({cls.__qualname__}, on={on!r})"
            return (await self._placer.spawn(what, request, [name], [name or cls.__qualname__], None, spawn_there))[0]
        rank = self._host.rank if on is None else on
        node = self._host.node
        if isinstance(rank, int) and (rank in self._host.leaving or rank in node.left):
            raise PlacementError(f"cannot spawn {cls.__qualname__} on node {rank}: it is leaving the system")
        if not isinstance(rank, int) or rank not in node.ranks():
            raise ValueError(f"on={on!r} is not a rank of this system ({describe_ranks(node.ranks())})")
        if rank in node.lost:
            raise NodeLostError(f"cannot spawn {cls.__qualname__} on node {rank}: it was lost")
        if not gpus:
            return await spawn_there(rank, request)
        what = f"spawn({cls.__qualname__}, gpus={gpus}{'' if on is None else f', on={on}'})"
        ranks = candidate_ranks(self._host.rank, [rank for rank in node.ranks() if rank not in self._host.leaving], on)
        if request.relocatable:
            ranks = relocatable_homes(cls.__qualname__, ranks)
        return await place_on_gpus(what, gpus, ranks, self._gpu_share, lambda rank: spawn_there(rank, request))

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
        """Spawn ``count`` actors of ``cls`` as ``ActorSystem.spawn_group`` says, all or none."""
        check_count(count, "spawn_group(count=...)")
        check_spawnable(cls, restart, on, args, kwargs, "spawn_group")
        names = member_names(check_name(name) if name is not None else None, count)
        if on is None and spread:
            on = Where()
        if not isinstance(on, Where):  # every member on node ``on``, or on this one
            return await all_or_none(
                self.spawn(cls, args=args, kwargs=kwargs, name=member, on=on, restart=restart) for member in names
            )
        what = f"spawn_group({cls.__qualname__}, {count}, on={on!r}, spread={spread})"
        owners = [member or cls.__qualname__ for member in names]
        request = SpawnRequest(class_path(cls), tuple(args), dict(kwargs or {}), restart=restart, where=on)
        return await self._placer.spawn(what, request, names, owners, spread, functools.partial(self.spawn_on, cls))

    async def _gpu_share(self, rank: int) -> GpuShare | None:
        """Node ``rank``'s GPUs and who holds them; None if the node is lost."""
        try:
            devices, holders = await self._host.services[rank].call(NodeService.gpus)
        except NodeLostError:
            return None
        return GpuShare(rank, tuple(devices), holders)

    async def spawn_on(self, cls: type[A], rank: int, request: SpawnRequest) -> ActorRef[A]:
        """Reserve the request's name for node ``rank``, have the node build the actor ``cls`` there, bind the name."""
        if request.relocatable:
            check_home(cls.__qualname__, rank)
            if request.own:
                raise ValueError(_OWN_NOT_RELOCATED.format(cls.__qualname__))
        if rank != self._host.rank and _defined_interactively(cls):
            raise TypeError(
                f"cannot spawn {cls.__qualname__} on node {rank}: it is defined in the __main__ of an interactive "
                "session (a notebook cell), which other processes cannot import; define it in a module (a .py "
                "file beside the notebook) and import it from there"
            )
        if not request.lent():  # refused here, before the name is held: the node checks again as it builds
            chosen = cls.device if request.device is None else parse_device(request.device)
            check_device(cls.__qualname__, str(chosen), rank, self._host.node.transport.peer(rank).devices)
        name = request.name
        if name is not None:
            await self._registry_call(Registry.reserve, name, rank)
        try:
            ref: ActorRef[A] = await self._host.services[rank].call(NodeService.spawn, request)
        except BaseException:
            if name is not None:
                await asyncio.shield(self._host.lifecycle.release_name(name))
            raise
        if name is not None:
            await self._registry_call(Registry.bind, name, ref)
        return ref

    async def _registry_call(
        self, endpoint: Callable[[Registry, str, Any], Awaitable[None]], name: str, arg: Any
    ) -> None:
        """Reserve or bind ``name`` in the registry; its refusal raised as the ``NameTakenError`` it is.

        The registry is an actor, so its refusal would reach here as a
        ``RemoteError`` mixed with ``NameTakenError``, which reads as if the
        spawned actor's code had raised it.
        """
        try:
            await self._host.registry.call(endpoint, name, arg)
        except NameTakenError as exc:
            raise NameTakenError(str(exc)) from None
