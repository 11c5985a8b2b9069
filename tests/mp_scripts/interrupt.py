"""Ctrl-C on rank 0 of a two-process world, while ``main`` awaits or is stuck inside torch.

Usage: ``python interrupt.py MODE STOP_GRACE TMPDIR``. ``main`` spawns a
``Stopper`` on each rank, calls the worker's, writes ``TMPDIR/ready`` and then:

- ``awaiting``: awaits ``asyncio.sleep(600)``, so Ctrl-C reaches it;
- ``stuck``: waits on a ``torch.futures.Future`` that nobody completes, a C++
  wait that holds the event loop's thread and that Python cannot interrupt;
- ``worker_stuck``: awaits a call to ``Stuck.block`` of the actor
  ``sleeper`` on rank 1, a handler in ``time.sleep(60)`` that blocks rank 1's
  event loop.

``run`` raising ``KeyboardInterrupt`` is reported as ``RESULT interrupted``
and raised on, as a script without a handler would.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import torch
from actors import Stopper, emit
from faulty import Stuck

import actorch

MODE = sys.argv[1]
STOP_GRACE = float(sys.argv[2])
TMP = Path(sys.argv[3])


async def main(system: actorch.ActorSystem) -> None:
    worker = await system.spawn(Stopper, args=(str(TMP / "on_stop_rank1"),), on=1)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank0"),), on=0)
    await worker.call(Stopper.where)
    if MODE == "worker_stuck":
        sleeper = await system.spawn(Stuck, name="sleeper", on=1)
        blocking = sleeper.call(Stuck.block, 60.0)  # sent now: pending before the test's Ctrl-C can come
        (TMP / "ready").write_text("ready\n")
        await blocking
        return
    (TMP / "ready").write_text("ready\n")
    if MODE == "awaiting":
        await asyncio.sleep(600)
    else:
        torch.futures.Future().wait()  # never completes: the loop's thread stays inside torch


if __name__ == "__main__":
    # As a terminal would: Ctrl-C raises KeyboardInterrupt even if our parent ignored SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        actorch.run(main, world_size=2, stop_grace=STOP_GRACE)
    except KeyboardInterrupt:
        emit("interrupted", type="KeyboardInterrupt")
        raise
