"""``Spawner``: how a node's system spawns actors, one or a group: what a spawn says, checked, then placed.

Whatever a spawn says of its node (a rank, GPUs to lend, a ``Where``, or
nothing), it becomes one ``Where`` in the spawn's ``SpawnRequest``, and the
node's one :class:`~actorch._actors.placement.where_placer.Placer` finds the
node, or plans a group in one go. On the chosen node the node service builds
the actor; the registry reserves its name first and binds it once the actor
has started.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._actors.actor import Actor, check_plain_methods, class_path
from actorch._actors.node.service import NodeService
from actorch._actors.placement.gpus import check_device
from actorch._actors.placement.where_placer import Placer
from actorch._actors.ref import ActorRef, resolve_class
from actorch._actors.registry import Registry
from actorch._actors.relocation.relocator import Relocator
from actorch._actors.relocation.spec import check_home
from actorch._actors.restart import Restart
from actorch._actors.spawn_request import SpawnRequest
from actorch._actors.system import SpawnOptions
from actorch._actors.where import Where, where_of
from actorch._base.config import is_count
from actorch._base.devices import parse_device
from actorch._base.errors import NameTakenError, NodeLostError, PlacementError
from actorch._base.names import check_name
from actorch._engine.node import describe_ranks

if TYPE_CHECKING:
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


def _spawn_call(cls: type, on: int | Where | None, gpus: int) -> str:
    """The spawn as its errors name it, in the words it was called with: ``spawn(Learner, gpus=2, on=1)``."""
    if isinstance(on, Where):
        return f"spawn({cls.__qualname__}, on={on!r})"
    said = ([f"gpus={gpus}"] if gpus else []) + ([] if on is None else [f"on={on}"])
    return f"spawn({', '.join([cls.__qualname__, *said])})"


def _defined_interactively(cls: type) -> bool:
    """Whether ``cls`` lives in a ``__main__`` without a file (a notebook, ``python -c``): no other process has it."""
    main = sys.modules.get("__main__")
    return cls.__module__ == "__main__" and main is not None and getattr(main, "__file__", None) is None


class Spawner:
    """Spawns actors for one node's system: checks what a spawn says, then has the one ``Placer`` place it."""

    def __init__(self, host: ActorHost, placer: Placer) -> None:
        self._host = host
        self._placer = placer

    def __repr__(self) -> str:
        return f"<Spawner node {self._host.rank}>"

    async def spawn(self, cls: type[A], options: SpawnOptions) -> ActorRef[A]:
        """Spawn an actor of ``cls`` as ``ActorSystem.spawn`` says: its arguments checked, then placed.

        ``on=rank`` and ``gpus=`` become parts of the request's one ``Where``
        (``where_of``), so that the placer takes every spawn alike.
        """
        on, gpus, device = options.on, options.gpus, options.device
        check_spawnable(cls, options.restart, on, options.args, options.kwargs)
        if not is_count(gpus, 0):
            raise ValueError(f"gpus must be an int >= 0, not {gpus!r}")
        if gpus and device is not None:
            raise ValueError(
                f"spawn({cls.__qualname__}): give device= or gpus=, not both (gpus= places the actor on "
                "the first GPU it is lent)"
            )
        if options.name is not None:
            check_name(options.name)
        placed = None if device is None else str(parse_device(device))
        if isinstance(on, Where) and (gpus or (placed is not None and on.gpus)):
            raise ValueError(f"spawn({cls.__qualname__}): ask for GPUs in Where(gpus=...) alone, without device=")
        self._check_rank(cls, on)
        request = SpawnRequest(
            class_path(cls),
            tuple(options.args),
            dict(options.kwargs or {}),
            options.name,
            options.restart,
            placed,
            where=where_of(on, self._host.rank, gpus=gpus),
        )
        names, owners = [options.name], [options.name or cls.__qualname__]
        return (await self._place(cls, _spawn_call(cls, on, gpus), request, names, owners))[0]

    async def spawn_group(self, cls: type[A], count: int, options: SpawnOptions, spread: bool) -> list[ActorRef[A]]:
        """Spawn ``count`` actors of ``cls`` as ``ActorSystem.spawn_group`` says, all or none."""
        check_count(count, "spawn_group(count=...)")
        on = options.on
        check_spawnable(cls, options.restart, on, options.args, options.kwargs, "spawn_group")
        names = member_names(check_name(options.name) if options.name is not None else None, count)
        self._check_rank(cls, on)
        where = where_of(on, self._host.rank, anywhere=spread)
        request = SpawnRequest(
            class_path(cls), tuple(options.args), dict(options.kwargs or {}), restart=options.restart, where=where
        )
        what = f"spawn_group({cls.__qualname__}, {count}, on={on!r}, spread={spread})"
        owners = [member or cls.__qualname__ for member in names]
        return await self._place(cls, what, request, names, owners, spread)

    async def _place(
        self,
        cls: type[A],
        what: str,
        request: SpawnRequest,
        names: list[str | None],
        owners: list[str],
        spread: bool | None = None,
    ) -> list[ActorRef[A]]:
        """Have the placer spawn ``request`` once per name (``spread`` given: as a group) on the nodes it finds."""
        named = request.where.rank
        if request.relocatable and named is not None:
            check_home(cls.__qualname__, named)  # said at once, not as a node that does not fit
        return await self._placer.spawn(what, request, names, owners, spread, functools.partial(self.spawn_on, cls))

    def _check_rank(self, cls: type[Actor], on: int | Where | None) -> None:
        """Refuse the rank ``on`` names (``on=rank``, ``Where(rank=...)``) unless its node may take an actor now.

        Raises:
            PlacementError: The node is leaving the system.
            ValueError: ``on`` is no rank of the system.
            NodeLostError: The node was lost.
        """
        rank = on.rank if isinstance(on, Where) else on
        if rank is None:
            return
        host = self._host
        # Leaving first: a node that has left is no longer among the ranks, and is said to be leaving.
        if isinstance(rank, int) and (rank in host.leaving or rank in host.left):
            raise PlacementError(f"cannot spawn {cls.__qualname__} on node {rank}: it is leaving the system")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank not in host.ranks():
            raise ValueError(f"on={on!r} is not a rank of this system ({describe_ranks(host.ranks())})")
        if rank in host.lost:
            raise NodeLostError(f"cannot spawn {cls.__qualname__} on node {rank}: it was lost")

    async def spawn_on(self, cls: type[A], rank: int, request: SpawnRequest) -> ActorRef[A]:
        """Reserve the request's name for node ``rank``, have the node build the actor ``cls`` there, bind the name."""
        if rank != self._host.rank and _defined_interactively(cls):
            raise TypeError(
                f"cannot spawn {cls.__qualname__} on node {rank}: it is defined in the __main__ of an interactive "
                "session (a notebook cell), which other processes cannot import; define it in a module (a .py "
                "file beside the notebook) and import it from there"
            )
        if not request.lent():  # refused here, before the name is held: the node checks again as it builds
            chosen = cls.device if request.device is None else parse_device(request.device)
            check_device(cls.__qualname__, str(chosen), rank, self._host.peer(rank).devices)
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
