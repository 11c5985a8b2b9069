"""Streams between real processes over torch RPC: order and once-only delivery, tensors, early close, node loss.

Usage: ``python streams.py`` (three processes). Each check emits one result
line; the last ones kill rank 2 (a consumer's node) and then rank 1 (a
producer's node) with SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

from actors import Drainer, Producer, run_checks

import actorch


async def status_once_closed(producer: actorch.ActorRef[Producer], closed: int) -> dict[str, Any]:
    while (status := await producer.call(Producer.status))["closed"] < closed:  # noqa: ASYNC110 - another node
        await asyncio.sleep(0.01)
    return status


async def in_order(system: actorch.ActorSystem) -> dict[str, Any]:
    producer = await system.lookup("producer")
    items = [item async for item in producer.stream(Producer.count, 2000).with_window(8)]
    return {"ordered": items == list(range(2000)), "count": len(items)}


async def tensors(system: actorch.ActorSystem) -> dict[str, Any]:
    producer = await system.lookup("producer")
    items = [item async for item in producer.stream(Producer.tensors, 20, size=1 << 18)]
    return {"values": [int(item[0]) for item in items], "sizes": sorted({item.numel() for item in items})}


async def early_break(system: actorch.ActorSystem) -> dict[str, Any]:
    producer = await system.lookup("producer")
    closed = (await producer.call(Producer.status))["closed"]
    async for item in producer.stream(Producer.count):
        if item == 10:
            break
    status = await status_once_closed(producer, closed + 1)
    return {"made_after_break": status["made"]}


async def consumer_lost(system: actorch.ActorSystem) -> dict[str, Any]:
    """A consumer's node dies mid-stream: the producer's generator is closed."""
    producer = await system.lookup("producer")
    drainer = await system.spawn(Drainer, on=2)
    before = await producer.call(Producer.status)
    drainer.tell(Drainer.drain, producer)
    while (await producer.call(Producer.status))["made"] == before["made"]:  # noqa: ASYNC110 - another node
        await asyncio.sleep(0.01)
    os.kill(system.nodes[2].pid, signal.SIGKILL)
    started = time.monotonic()
    await status_once_closed(producer, before["closed"] + 1)
    return {"closed_after": time.monotonic() - started}


async def producer_lost(system: actorch.ActorSystem) -> dict[str, Any]:
    """The producer's node dies mid-stream: the consumer's loop raises NodeLostError."""
    producer = await system.lookup("producer")
    received = 0
    started = 0.0
    try:
        async for _ in producer.stream(Producer.count, delay=0.01):
            received += 1
            if received == 5:
                os.kill(system.nodes[1].pid, signal.SIGKILL)
                started = time.monotonic()
    except actorch.NodeLostError as exc:
        return {"raised": "NodeLostError", "after": time.monotonic() - started, "received": received, "why": str(exc)}
    return {"raised": None, "received": received}


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    await system.spawn(Producer, name="producer", on=1)
    checks = [
        ("in_order", in_order),
        ("tensors", tensors),
        ("early_break", early_break),
        ("consumer_lost", consumer_lost),  # kills rank 2
        ("producer_lost", producer_lost),  # kills rank 1
    ]
    return await run_checks(system, checks)


if __name__ == "__main__":
    print("RETURNED " + json.dumps(actorch.run(main, world_size=3, stop_grace=1.0)), flush=True)
