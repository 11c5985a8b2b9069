"""``ActorSystem``'s methods that place work by what nodes have: groups, node processes on demand, waiting for nodes.

:class:`SystemPlacement` implements ``spawn_group``, ``add_nodes`` and
``wait_nodes`` (documented on ``ActorSystem``) through the node's
:class:`~actorch._actors.placing.Placer`; ``spawn(on=Where(...))`` goes the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, TypeVar

from actorch._actors.actor import Actor, class_path
from actorch._actors.placing import all_or_none
from actorch._actors.ref import ActorRef
from actorch._actors.restart import Restart
from actorch._actors.spawn_request import SpawnRequest
from actorch._actors.system_spawning import SystemSpawning, check_spawnable
from actorch._actors.where import Where
from actorch._base.config import is_number
from actorch._base.names import check_name
from actorch._base.resources import check_resources
from actorch._transport.base import NodeInfo

__all__ = ["SystemPlacement"]

A = TypeVar("A", bound=Actor)


def check_count(count: object, what: str) -> int:
    """``count`` if it is an int >= 1, else ``ValueError`` naming ``what``."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{what} must be an int >= 1, not {count!r}")
    return count


def member_names(name: str | None, count: int) -> list[str | None]:
    """The names of a group's members: ``name/0`` ... ``name/<count-1>``, or none."""
    return [None] * count if name is None else [f"{name}/{index}" for index in range(count)]


class SystemPlacement(SystemSpawning):
    """``ActorSystem``'s methods for groups, node processes and waiting for nodes."""

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
        return await self._placer.spawn(what, request, names, owners, spread, functools.partial(self._spawn_on, cls))

    async def add_nodes(
        self,
        count: int,
        *,
        label: str | None = None,
        resources: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
    ) -> list[NodeInfo]:
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
        check_count(count, "wait_nodes(count=...)")
        if timeout is not None and not is_number(timeout):
            raise ValueError(f"timeout must be a number of seconds >= 0 or None, not {timeout!r}")
        return await self._placer.wait_nodes(count, label, timeout)
