"""``main`` sleeps for a long time, for Ctrl-C tests; it writes ``TMPDIR/ready`` once the world is up.

Usage: ``python sleeper.py TMPDIR``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from actors import Stopper

import actorch

TMP = Path(sys.argv[1])


async def main(system: actorch.ActorSystem) -> None:
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank1"),), on=1)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank0"),), on=0)
    (TMP / "ready").write_text("ready\n")
    await asyncio.sleep(600)


if __name__ == "__main__":
    # As a terminal would: Ctrl-C raises KeyboardInterrupt even if our parent ignored SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    actorch.run(main, world_size=2)
