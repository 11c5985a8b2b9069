"""``ParameterClient``: the trainer's side of a (sharded) parameter server, one state dict over many shards.

A plain object, not an actor: a trainer builds it from the refs of the
:class:`~actorch.ParameterServer` shards and pulls from and pushes to all of
them at once, as if they were one server. It remembers each shard's version, so
a pull transfers only the shards that changed, and a shard's failure reaches the
trainer as a ``GroupError`` whose message names each failed shard and its error,
with one shard as with many. Given a ``device``, it moves
the parameters it receives there, all shards' in one transfer per pull.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from actorch._actors.ref import ActorRef
from actorch._base.errors import GroupError
from actorch._stock.parameter_server import Parameters, ParameterServer
from actorch._stock.transfer import DeviceLike, as_device, to_device

__all__ = ["ParameterClient"]


class ParameterClient:
    """Pulls from and pushes to every shard of a parameter server at once.

    Keeps the latest parameters it has seen and each shard's version, so a pull
    only transfers the shards that changed. Works the same with one unsharded
    server.

    Example:
        >>> shards = await system.lookup_all("ps/*")
        >>> client = ParameterClient(shards, device=self.device)  # in a trainer actor
        >>> model.load_state_dict(await client.pull() or client.parameters, strict=False)
        >>> new = await client.push({n: p.grad for n, p in model.named_parameters()})

    Args:
        servers: One server's ref, or the refs of all shards (any order).
        device: Where the trainer wants the parameters (a trainer actor passes
            its ``self.device``): what a pull or push returns is moved there on
            arrival, in one transfer, whatever device the shards keep them on.
            None leaves them where the runtime delivers them: on a shard's own
            device when it shares the trainer's node, else staged to the
            calling actor's device (or mapped).

    Raises:
        ValueError: If ``servers`` is empty or ``device`` names no device.
    """

    def __init__(
        self,
        servers: ActorRef[ParameterServer] | Sequence[ActorRef[ParameterServer]],
        *,
        device: DeviceLike | None = None,
    ) -> None:
        refs = [servers] if isinstance(servers, ActorRef) else list(servers)
        if not refs:
            raise ValueError("a ParameterClient needs at least one server")
        self.servers = refs
        self.device = None if device is None else as_device(device)
        self.versions: list[int | None] = [None] * len(refs)
        self.parameters: dict[str, torch.Tensor] = {}
        self._owner: dict[str, int] | None = None

    def __repr__(self) -> str:
        where = "" if self.device is None else f" device={self.device}"
        return f"<ParameterClient shards={len(self.servers)} versions={self.versions}{where}>"

    async def pull(self) -> dict[str, torch.Tensor] | None:
        """Fetch what changed since the last pull; return all parameters, or ``None`` if nothing did.

        Raises:
            GroupError: If some shards failed; the others' parameters are kept.
        """
        replies = await self._each(lambda i: self.servers[i].call(ParameterServer.pull, self.versions[i]))
        if all(reply is None for reply in replies):
            return None
        self._update(replies)
        return dict(self.parameters)

    async def push(self, grads: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Send each shard its gradients (every shard gets a push, maybe empty); return the new parameters.

        Raises:
            KeyError: If a gradient's name belongs to no shard (nothing is sent).
            GroupError: If some shards failed; the others' parameters are kept.
        """
        owner = await self._ownership()
        unknown = sorted(set(grads) - set(owner))
        if unknown:
            raise KeyError(f"no shard holds the parameters {unknown}")
        parts: list[dict[str, torch.Tensor]] = [{} for _ in self.servers]
        for name, grad in grads.items():
            parts[owner[name]][name] = grad
        replies = await self._each(lambda i: self.servers[i].call(ParameterServer.push, parts[i]))
        self._update(replies)
        return dict(self.parameters)

    async def _ownership(self) -> dict[str, int]:
        if self._owner is None:
            names = await self._each(lambda i: self.servers[i].call(ParameterServer.names))
            self._owner = {name: index for index, owned in enumerate(names) for name in owned}
        return self._owner

    def _update(self, replies: Sequence[Parameters | None]) -> None:
        arrived: dict[str, torch.Tensor] = {}
        for index, reply in enumerate(replies):
            if reply is not None:
                self.versions[index] = reply.version
                arrived.update(reply.tensors)
        self.parameters.update(arrived if self.device is None else to_device(arrived, self.device))

    async def _each(self, call: Any) -> list[Any]:
        results = await asyncio.gather(*(call(i) for i in range(len(self.servers))), return_exceptions=True)
        failed = GroupError.from_outcomes("parameter shards", lambda i: f"shard {i} ({self.servers[i]!r})", results)
        if failed is not None:
            self._update([r if isinstance(r, Parameters) else None for r in results])
            raise failed
        return list(results)
