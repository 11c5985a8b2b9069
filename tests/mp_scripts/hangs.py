"""A system stuck three ways, to diagnose from outside: ``python hangs.py TMPDIR``.

On three nodes: node 1's event loop is blocked by a handler in ``time.sleep``
that never yields; on node 2 a handler awaits an event nobody sets, with a
second call queued behind it; and two actors, on nodes 0 and 2, wait on each
other (``hang/a -> hang/b -> hang/a``). Rank 0 writes ``TMPDIR/ready`` (the
status address, as JSON) once all three are in place, and ends when
``TMPDIR/done`` appears (60 s at most), which also lets the sleeper go.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import actorch
from actorch._launch.services.runtime import running_systems

TMP = Path(sys.argv[1])
DONE = TMP / "done"


class Sleeper(actorch.Actor):
    async def nap(self) -> None:
        deadline = time.monotonic() + 60
        while not DONE.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # noqa: ASYNC251 - STUCK: sleeping, the point of it


class Waiter(actorch.Actor):
    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def wait(self) -> None:
        await self.never.wait()  # STUCK: awaiting


class Peer(actorch.Actor):
    def __init__(self) -> None:
        self.other: Any = None

    async def meet(self, other: Any) -> None:
        self.other = other

    async def hold(self) -> None:
        await asyncio.sleep(0.5)  # the other one starts its ask meanwhile, and its call waits behind this
        await self.other.call(Peer.answer)

    async def ask(self) -> None:
        await self.other.call(Peer.answer)

    async def answer(self) -> str:
        return "never"


async def main(system: actorch.ActorSystem) -> str:
    sleeper = await system.spawn(Sleeper, name="hang/sleeper", on=1)
    waiter = await system.spawn(Waiter, name="hang/waiter", on=2)
    a = await system.spawn(Peer, name="hang/a", on=2)
    b = await system.spawn(Peer, name="hang/b", on=0)
    await a.call(Peer.meet, b)
    await b.call(Peer.meet, a)
    waiter.tell(Waiter.wait)
    waiter.tell(Waiter.wait)  # queued behind the first, for ever
    b.tell(Peer.hold)
    a.tell(Peer.ask)
    sleeper.tell(Sleeper.nap)
    (found,) = [each for each in running_systems() if each.pid == os.getpid()]
    (TMP / "ready").write_text(json.dumps({"address": found.status}))
    deadline = time.monotonic() + 60
    while not DONE.exists() and time.monotonic() < deadline:  # noqa: ASYNC110 - a file, not an event, says when
        await asyncio.sleep(0.05)
    return "diagnosed"


if __name__ == "__main__":
    print("RETURNED", json.dumps(actorch.run(main, world_size=3, stop_grace=1.0)), flush=True)
