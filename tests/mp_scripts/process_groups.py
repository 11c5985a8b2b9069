"""Process groups beside actors: collectives and DDP between actors of two nodes, and the ways a meeting fails.

Usage: ``python process_groups.py``; three processes, members on ranks 1 and 2,
``lookup_timeout`` 3 s (the meeting's bound without a deadline). The last check
kills node 2 while node 1 waits in a collective, so the run also shows that
shutdown stays bounded with a group whose member died.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

# isort: off
import actorch
import torch
import torch.distributed as dist
from actors import attempt, emit, run_checks
from torch.nn.parallel import DistributedDataParallel

# isort: on

MEMBERS = [1, 2]


class Member(actorch.Actor):
    """Joins process groups and runs collectives and DDP steps in the last one it joined."""

    def __init__(self) -> None:
        self.group: Any = None

    async def join(self, ranks: list[int] | None) -> dict[str, Any]:
        self.group = await self.system.process_group(ranks)
        return {"rank": self.group.rank(), "size": self.group.size(), "ranks": dist.get_process_group_ranks(self.group)}

    async def join_within(self, ranks: list[int], seconds: float) -> dict[str, Any]:
        async def join() -> None:
            async with asyncio.timeout(seconds):
                await self.system.process_group(ranks)

        return await attempt(join())

    async def all_reduce(self, value: float) -> float:
        tensor = torch.tensor([value])
        await asyncio.to_thread(dist.all_reduce, tensor, group=self.group)  # collectives block: off the loop
        return tensor.item()

    async def broadcast_from(self, src: int) -> float:
        tensor = torch.tensor([float(self.system.rank)])
        await asyncio.to_thread(dist.broadcast, tensor, src=src, group=self.group)
        return tensor.item()

    async def ddp_steps(self, steps: int) -> dict[str, Any]:
        torch.manual_seed(self.system.rank)  # different start on each node: DDP broadcasts group rank 0's
        model = DistributedDataParallel(torch.nn.Linear(4, 2), process_group=self.group)
        start = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def train() -> None:
            for _ in range(steps):
                optimizer.zero_grad()
                model(torch.randn(8, 4) * self.system.rank).pow(2).sum().backward()  # different data per node
                optimizer.step()

        await asyncio.to_thread(train)
        params = [p.detach() for p in model.parameters()]
        return {
            "params": [p.flatten().tolist() for p in params],
            "moved": any(not torch.equal(a, b) for a, b in zip(start, params, strict=True)),
        }


class EagerMember(actorch.Actor):
    """Joins a group from on_start: spawned one after another, the first waits for a member not yet there."""

    async def on_start(self) -> None:
        await self.system.process_group(MEMBERS)


async def together(members: list[actorch.ActorRef[Member]], ranks: list[int] | None) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(m.call(Member.join, ranks) for m in members)))


async def all_reduce(members: list[actorch.ActorRef[Member]]) -> list[float]:
    return list(await asyncio.gather(*(m.call(Member.all_reduce, float(m.rank)) for m in members)))


async def spawned_one_after_another(system: actorch.ActorSystem) -> dict[str, Any]:
    members = [await system.spawn(Member, name=f"member/{rank}", on=rank) for rank in MEMBERS]
    joined = await together(members, MEMBERS)
    return {
        "joined": joined,
        "sums": await all_reduce(members),
        "broadcast": list(await asyncio.gather(*(m.call(Member.broadcast_from, 2) for m in members))),
    }


async def ddp(system: actorch.ActorSystem) -> dict[str, Any]:
    members = [await system.lookup(f"member/{rank}") for rank in MEMBERS]
    return {"results": list(await asyncio.gather(*(m.call(Member.ddp_steps, 3) for m in members)))}


async def again_and_beside(system: actorch.ActorSystem) -> dict[str, Any]:
    """The same members make a group again; then one over every node, rank 0's main included."""
    members = [await system.lookup(f"member/{rank}") for rank in MEMBERS]
    again = await together(members, MEMBERS)
    sums_again = await all_reduce(members)
    world, *joined = await asyncio.gather(system.process_group(), *(m.call(Member.join, None) for m in members))
    tensor = torch.tensor([10.0])
    reduced = asyncio.gather(*(m.call(Member.all_reduce, float(m.rank)) for m in members))
    await asyncio.to_thread(dist.all_reduce, tensor, group=world)
    return {
        "again": again,
        "sums_again": sums_again,
        "world": {"rank": world.rank(), "size": world.size(), "joined": joined},
        "world_sums": [tensor.item(), *await reduced],
    }


async def lone_member(system: actorch.ActorSystem) -> dict[str, Any]:
    members = [await system.lookup(f"member/{rank}") for rank in MEMBERS]
    lone = await members[0].call(Member.join_within, MEMBERS, 0.5)
    after = await together(members, MEMBERS)  # the lone member's meeting left nothing behind
    return {"lone": lone, "after": after, "sums_after": await all_reduce(members)}


async def member_killed(system: actorch.ActorSystem) -> dict[str, Any]:
    members = [await system.lookup(f"member/{rank}") for rank in MEMBERS]
    waiting = asyncio.ensure_future(members[0].call(Member.all_reduce, 1.0))  # node 2 never joins it
    await asyncio.sleep(0.3)
    os.kill(system.nodes[2].pid, signal.SIGKILL)
    return {"outcome": await attempt(waiting)}  # then main returns: shutdown goes on without node 2


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    # No deadline around this spawn: the meeting in on_start is bounded by lookup_timeout alone.
    emit("eager_members", spawn=await attempt(system.spawn(EagerMember, on=1)))
    checks = [
        ("spawned_one_after_another", spawned_one_after_another),
        ("ddp", ddp),
        ("again_and_beside", again_and_beside),
        ("lone_member", lone_member),
        ("member_killed", member_killed),
    ]
    return await run_checks(system, checks, seconds=20.0)


if __name__ == "__main__":
    emit("returned", value=actorch.run(main, world_size=3, lookup_timeout=3.0))
