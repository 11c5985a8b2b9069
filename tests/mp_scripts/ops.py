"""A system to watch from outside: ``actorch run -n 2 ops.py TMPDIR``, or ``python ops.py TMPDIR 2``.

Rank 0 spawns a few actors, calls them (each counter's ``explode`` raises once,
each ``echo`` carries a tensor too large to ride inside its message), writes
``TMPDIR/ready`` and keeps the system up until ``TMPDIR/done`` appears (60 s
at most), calling all along so that rates are not zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

import torch
from actors import Counter, emit

import actorch

TMP = Path(sys.argv[1])
WORLD_SIZE = int(sys.argv[2]) if len(sys.argv) > 2 else None  # None: the launcher's


async def main(system: actorch.ActorSystem) -> str:
    counters = [await system.spawn(Counter, name=f"ops/counter{rank}", on=rank) for rank in range(system.world_size)]
    for counter in counters:
        for _ in range(20):
            await counter.call(Counter.add)
        with contextlib.suppress(Exception):  # the error is what the status must count
            await counter.call(Counter.explode, "on purpose")
        await counter.call(Counter.echo, torch.zeros(16384, requires_grad=True))  # torch RPC carries it, not the lane
    emit("started", world_size=system.world_size, nodes=[info.rank for info in system.nodes])
    (TMP / "ready").write_text("ready")
    deadline = time.monotonic() + 60
    while not (TMP / "done").exists() and time.monotonic() < deadline:
        await asyncio.gather(*(counter.call(Counter.add) for counter in counters))
        await asyncio.sleep(0.02)
    return "watched"


if __name__ == "__main__":
    print("RETURNED", repr(actorch.run(main, world_size=WORLD_SIZE)), flush=True)
