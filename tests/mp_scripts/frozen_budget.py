"""Tells to a frozen node: the bytes queued toward it stay within the send budget (32 MiB here), on both paths.

Node 1 is stopped (SIGSTOP) while rank 0 tells it 1 MiB messages, first
without tensors (the fast lane), then with a tensor each (torch RPC). Each
round reports how many tells were taken before ``MailboxFullError``, how much
rank 0 grew, what a call with a deadline got meanwhile, and that everything
drains once node 1 runs again. Usage: ``python frozen_budget.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

# isort: off
import actorch
import torch
from actors import Counter, attempt, emit

# isort: on

MIB = 1 << 20
BUDGET = 32 * MIB


def rss() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def frozen_round(system: actorch.ActorSystem, counter: Any, payload: Any) -> dict[str, Any]:
    pid = system.nodes[1].pid
    before = rss()
    os.kill(pid, signal.SIGSTOP)
    accepted, refused = 0, None
    try:
        for _ in range(2000):
            try:
                counter.tell(Counter.echo, payload)
            except actorch.MailboxFullError as exc:
                refused = str(exc)
                break
            accepted += 1
            if accepted % 8 == 0:
                await asyncio.sleep(0.001)  # let bundles leave, as a real sender's loop would
        grown = rss() - before

        async def bounded_call() -> Any:
            async with asyncio.timeout(0.5):
                return await counter.call(Counter.add, 0)

        call = await attempt(bounded_call())
    finally:
        os.kill(pid, signal.SIGCONT)

    async def after_resume() -> Any:
        async with asyncio.timeout(30):
            return await counter.call(Counter.add, 0)

    return {
        "accepted": accepted,
        "refused": refused,
        "grown": grown,
        "call": call,
        "after_resume": await attempt(after_resume()),
    }


async def main(system: actorch.ActorSystem) -> None:
    counter = await system.spawn(Counter, args=(0,), name="frozen/c", on=1)
    for _ in range(50):  # until the lane is up
        await counter.call(Counter.add, 0)
        if system.statistics()["lane_bundles_sent"] > 0:
            break
        await asyncio.sleep(0.02)
    lane = await frozen_round(system, counter, b"x" * MIB)
    rpc = await frozen_round(system, counter, torch.ones(MIB // 4))
    emit("frozen_budget", lane=lane, rpc=rpc, lost=system.lost_nodes)


if __name__ == "__main__":
    actorch.run(main, world_size=2, liveness_timeout=60.0, send_budget=BUDGET)
