"""Group calls over real torch RPC: one worker on each of three processes.

Usage: ``python group_basics.py``. Every check prints one ``RESULT {json}`` line
with what it observed (or ``failed`` with the exception); the test asserts on
them. The workers' class lives in this script, which the workers import by
name; the shared ``Rendezvous`` comes from ``actors``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import torch
from actors import Rendezvous, describe, run_checks

import actorch
from actorch.group import ActorGroup, batch_partitioner, mean_reducer, sum_reducer

Check = Callable[[actorch.ActorSystem], Awaitable[dict[str, Any]]]


class GroupWorker(actorch.Actor):
    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.received: list[Any] = []
        self.events: list[str] = []

    async def where(self) -> list[int]:
        return [self.tag, self.system.rank, os.getpid()]

    async def meet(self, rendezvous: actorch.ActorRef[Rendezvous]) -> int:
        await rendezvous.call(Rendezvous.arrive)
        return self.tag

    async def fail_if(self, tag: int) -> int:
        if tag == self.tag:
            raise ValueError(f"worker {self.tag} refuses")
        return self.tag

    async def sleep(self, seconds: float) -> int:
        self.events.append("started")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise
        self.events.append("finished")
        return self.tag

    async def history(self) -> list[str]:
        return self.events

    async def record(self, value: Any) -> None:
        self.received.append(value)

    async def recorded(self) -> list[Any]:
        return self.received

    async def loss(self, batch: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            loss: torch.Tensor = model(batch).square().mean()
        return loss

    async def stats(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {"rows": batch["x"].shape[0], "sum": batch["x"].sum(), "pid": os.getpid()}


class SlowWorker(GroupWorker):
    max_concurrency = 4  # so status calls run beside a sleeping handler


async def spawn_group(
    system: actorch.ActorSystem, prefix: str, cls: type[GroupWorker] = GroupWorker
) -> ActorGroup[GroupWorker]:
    for rank in range(system.world_size):
        await system.spawn(cls, args=(rank,), name=f"{prefix}/{rank}", on=rank)
    return ActorGroup(await system.lookup_all(f"{prefix}/*"))


async def check_fan_out(system: actorch.ActorSystem) -> dict[str, Any]:
    group = await spawn_group(system, "fan")
    where = await group.call(GroupWorker.where)
    return {
        "where": where,
        "by_name": await group.call("fail_if", -1),
        "repr": repr(group),
        "main_pid": os.getpid(),
    }


async def check_concurrent(system: actorch.ActorSystem) -> dict[str, Any]:
    group = await spawn_group(system, "meet")
    rendezvous = await system.spawn(Rendezvous, args=(len(group),), on=1)
    started = time.monotonic()
    try:
        async with asyncio.timeout(10):
            tags = await group.call(GroupWorker.meet, rendezvous)
    except TimeoutError:
        return {"tags": None, "seconds": time.monotonic() - started}
    return {"tags": tags, "seconds": time.monotonic() - started}


async def check_tell(system: actorch.ActorSystem) -> dict[str, Any]:
    group = await spawn_group(system, "tell")
    for index in range(20):
        group.tell(GroupWorker.record, index)
    shares = group.partitioned(batch_partitioner)
    shares.tell(GroupWorker.record, torch.arange(2))  # two rows for three members: the last gets nothing
    recorded = await group.call(GroupWorker.recorded)
    return {
        "plain": [received[:20] for received in recorded],
        "shares": [[tensor.tolist() for tensor in received[20:]] for received in recorded],
    }


async def check_partition_reduce(system: actorch.ActorSystem) -> dict[str, Any]:
    group = (await spawn_group(system, "split")).partitioned(batch_partitioner)
    torch.manual_seed(0)
    batch, model = torch.randn(12, 4), torch.nn.Linear(4, 2)
    loss = await group.reduce(mean_reducer, GroupWorker.loss, batch, model)
    with torch.no_grad():
        expected = model(batch).square().mean()
    data = {"x": torch.arange(20.0).reshape(10, 2)}
    stats = await group.call(GroupWorker.stats, data)
    total = sum_reducer([{"rows": share["rows"], "sum": share["sum"]} for share in stats])
    return {
        "loss": float(loss),
        "expected": float(expected),
        "close": bool(torch.allclose(loss, expected)),
        "rows": [share["rows"] for share in stats],
        "pids": [share["pid"] for share in stats],
        "total": {"rows": total["rows"], "sum": float(total["sum"])},
    }


async def check_errors(system: actorch.ActorSystem) -> dict[str, Any]:
    group = await spawn_group(system, "err")
    await group[2].stop()
    try:
        await group.call(GroupWorker.fail_if, 1)
    except actorch.GroupError as error:
        return {
            "message": str(error),
            "failed_members": error.failed,
            "first": error.results[0],
            "errors": [describe(exc) for exc in error.exceptions],
            "notes": [getattr(exc, "__notes__", []) for exc in error.exceptions],
        }
    return {"raised": False}


async def check_deadline(system: actorch.ActorSystem) -> dict[str, Any]:
    group = await spawn_group(system, "slow", SlowWorker)
    started = time.monotonic()
    outcome: dict[str, Any]
    try:
        async with asyncio.timeout(0.5):
            await group.call(GroupWorker.sleep, 30)
    except TimeoutError as exc:
        outcome = {"error": describe(exc)}
    else:
        outcome = {"returned": True}
    seconds = time.monotonic() - started
    histories: list[list[str]] = []
    async with asyncio.timeout(5):
        while True:
            histories = await group.call(GroupWorker.history)
            if all("cancelled" in history for history in histories):
                break
            await asyncio.sleep(0.02)
    return {"outcome": outcome, "seconds": seconds, "histories": histories}


CHECKS: list[tuple[str, Check]] = [
    ("fan_out", check_fan_out),
    ("concurrent", check_concurrent),
    ("tell", check_tell),
    ("partition_reduce", check_partition_reduce),
    ("errors", check_errors),
    ("deadline", check_deadline),
]


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    return await run_checks(system, CHECKS)


if __name__ == "__main__":
    result = actorch.run(main, world_size=3)
    print("RETURNED " + json.dumps(result), flush=True)
