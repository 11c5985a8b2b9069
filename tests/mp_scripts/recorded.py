"""A run whose record ``actorch history`` reads: ``recorded.py MODE`` in a world of 2.

Modes:
    ok: rank 0 spawns ``Doubler`` on node 1, calls it, tells it a value it
        refuses, stops it, and returns.
    killed: the same up to the refused tell, then rank 0 kills itself with
        SIGKILL: the record must be readable up to the kill.
    off: as ``ok`` with ``record=False``: nothing may be written.
    ok-off: ``ok``, then ``off`` in the same process (a second world, its
        workers fresh), so that the test pays for one interpreter less.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import actorch


class Doubler(actorch.Actor):
    async def double(self, value: int) -> int:
        if value < 0:
            raise ValueError(f"{value} is negative")
        return 2 * value


async def main(system: actorch.ActorSystem) -> int:
    doubler = await system.spawn(Doubler, name="doubler", on=1)
    doubled = await doubler.call(Doubler.double, 21)
    doubler.tell(Doubler.double, -1)
    await doubler.call(Doubler.double, 1)  # the refused tell has run by now
    if sys.argv[1] == "killed":
        await asyncio.sleep(0.2)  # the worker's lines are written; then rank 0 dies at once
        os.kill(os.getpid(), signal.SIGKILL)
    await doubler.stop()
    print(f"RESULT {doubled}", flush=True)
    return doubled


if __name__ == "__main__":
    for record in {"ok-off": [True, False], "off": [False]}.get(sys.argv[1], [True]):
        actorch.run(main, world_size=2, record=record, liveness_timeout=1.0)
