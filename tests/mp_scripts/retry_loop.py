"""A tight retry loop on rank 0 around a call that fails at once must not starve rank 0's event loop.

Usage: ``python retry_loop.py``; two processes, ``liveness_timeout`` 1 s. While
``main`` retries a call to a stopped actor of its own node for a few seconds,
with no pause, a watcher on rank 1 sends a heartbeat call to an actor of rank 0
every 50 ms, each bounded by the liveness timeout, and counts the ones that got
no answer in time. Reports the retries, the heartbeats answered and missed, and
the nodes rank 0 counts lost.
"""

from __future__ import annotations

import asyncio
import time

from actors import emit

import actorch

LIVENESS = 1.0
RETRY_SECONDS = 3.0


class Heart(actorch.Actor):
    async def beat(self) -> None:
        return None


class Watcher(actorch.Actor):
    """Rank 0 is alive to this actor while each heartbeat call is answered within the liveness timeout."""

    async def watch(self, heart: actorch.ActorRef[Heart], seconds: float) -> dict[str, int]:
        answered = missed = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                async with asyncio.timeout(LIVENESS):
                    await heart.call(Heart.beat)
                answered += 1
            except TimeoutError:
                missed += 1
            await asyncio.sleep(0.05)
        return {"answered": answered, "missed": missed}


async def main(system: actorch.ActorSystem) -> None:
    stopped = await system.spawn(Heart, on=0)
    await stopped.stop()
    heart = await system.spawn(Heart, on=0)
    watcher = await system.spawn(Watcher, on=1)
    watching = asyncio.ensure_future(watcher.call(Watcher.watch, heart, RETRY_SECONDS + 0.5))
    await asyncio.sleep(0.25)  # the watcher's first beats go through
    retries = 0
    end = time.monotonic() + RETRY_SECONDS
    while time.monotonic() < end:
        try:
            await stopped.call(Heart.beat)
        except actorch.ActorStoppedError:
            retries += 1
    emit("retry_loop", retries=retries, watch=await watching, lost=system.lost_nodes)


if __name__ == "__main__":
    actorch.run(main, world_size=2, liveness_timeout=LIVENESS)
