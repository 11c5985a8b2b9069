"""Broadcast over real torch RPC: members on three processes, one copy of the tensor per node.

Usage: ``python broadcast_world.py``. It prints one ``RESULT {json}`` line with
what it observed (or ``failed`` with the exception); the test asserts on it. The
actor class lives in this script: the workers import it by name.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import torch
from actors import describe, run_checks

import actorch
from actorch import broadcast, broadcast_tell
from actorch.group import ActorGroup

MB = 1 << 20


class Receiver(actorch.Actor):
    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.received: list[Any] = []

    async def digest(self, data: torch.Tensor) -> list[Any]:
        return [self.tag, self.system.rank, float(data.sum())]

    async def fail_if(self, tag: int) -> int:
        if tag == self.tag:
            raise ValueError(f"receiver {tag} refuses")
        return self.tag

    async def record(self, value: Any) -> None:
        self.received.append(value)

    async def recorded(self) -> list[Any]:
        return self.received


async def check_broadcast(system: actorch.ActorSystem) -> dict[str, Any]:
    ranks = (0, 1, 1, 1, 2, 2, 2)
    refs = [await system.spawn(Receiver, args=(tag,), on=rank) for tag, rank in enumerate(ranks)]
    plane = system.host.node.plane  # tensors apart from messages, on whichever channel (shared memory here)
    data = torch.ones(MB)
    before = dict(plane.sent_to)
    digests = await ActorGroup(refs).call(Receiver.digest, data)
    sent = {rank: plane.sent_to.get(rank, 0) - before.get(rank, 0) for rank in (1, 2)}
    outcomes = await asyncio.gather(*broadcast(refs, Receiver.fail_if, 4), return_exceptions=True)
    broadcast_tell(refs, Receiver.record, "told")
    for ref in refs:
        ref.tell(Receiver.record, "after")
    recorded = await ActorGroup(refs).call(Receiver.recorded)
    return {
        "digests": digests,
        "tensor_bytes": sent,
        "nbytes": data.nbytes,
        "outcomes": [describe(item) if isinstance(item, BaseException) else item for item in outcomes],
        "recorded": recorded,
    }


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    return await run_checks(system, [("broadcast", check_broadcast)])


if __name__ == "__main__":
    result = actorch.run(main, world_size=3)
    print("RETURNED " + json.dumps(result), flush=True)
