"""One rank of a two-host world that the test cuts in two with a silent network partition.

Usage: ``RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python partition.py cut|heal TMPDIR``,
started by the test inside each host's network namespace, the way torchrun
starts a script on each machine. Rank 0 spawns ``Remote`` on rank 1 and keeps
a call to it pending, then writes ``TMPDIR/pending`` and waits: the test cuts
the link and writes the monotonic time it began into ``TMPDIR/partitioned``.
Rank 0 reports how the pending call ended and when (``partition``), what new
calls and lookups do, and how long ``run`` took after ``main``. Rank 1 reports,
from the actor, when it saw rank 0 lost and when its pending handler was
cancelled, and from the script when ``run`` ended there. Times are
``time.monotonic()``, which every process of the machine shares.

In ``heal`` mode rank 0 also tells rank 1 to work for long (nobody waits for a
tell, so rank 1 gives it its ``stop_grace`` when it stops), and once the
pending call failed, writes ``TMPDIR/lost``
and waits for ``TMPDIR/healed`` (the test has let packets through again), and
gives what the link still held a second to arrive before trying rank 1 again.
Rank 1 writes ``TMPDIR/rank1_lost`` when it sees rank 0 lost, in either mode.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from actors import attempt, attempt_now, emit

import actorch

MODE = sys.argv[1]
TMP = Path(sys.argv[2])
RANK = int(os.environ["RANK"])
MAIN_RETURNED: list[float] = []
SETTLE_TIMEOUT = 20.0
WAIT_FOR_TEST = 60.0
AFTER_HEAL = 1.0


class Remote(actorch.Actor):
    """The actor on rank 1: a handler that hangs, and a watch on rank 0's liveness."""

    max_concurrency = 4

    def __init__(self) -> None:
        self._loss_noted = False

    async def on_start(self) -> None:
        self._watch = asyncio.ensure_future(self._watch_controller())

    def _note_loss(self) -> None:
        """Report once that rank 0 is lost: the watch, the cancellation or the stop, whichever sees it first."""
        if not self._loss_noted and 0 in self.system.lost_nodes:
            self._loss_noted = True
            emit("rank1_lost_controller", at=time.monotonic(), why=self.system.lost_nodes[0])
            (TMP / "rank1_lost").write_text(str(time.monotonic()))

    async def _watch_controller(self) -> None:
        async for event in self.system.events():
            if isinstance(event, actorch.NodeLost) and event.rank == 0:
                break
        self._note_loss()

    async def hang(self, seconds: float) -> str:
        emit("rank1_hang_started", at=time.monotonic())
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self._note_loss()
            emit("rank1_hang_cancelled", at=time.monotonic())
            raise
        return "survived"

    async def busy(self, seconds: float) -> None:
        """Work nobody waits for (a tell): a stopping node gives it ``stop_grace`` to finish."""
        await asyncio.sleep(seconds)

    async def where(self) -> list[Any]:
        return [self.system.rank, os.getpid()]

    async def on_stop(self) -> None:
        self._note_loss()
        emit("rank1_on_stop", at=time.monotonic())


class Local(actorch.Actor):
    """An actor on rank 0, which must stay listed after rank 1 is lost."""

    async def where(self) -> list[Any]:
        return [self.system.rank, os.getpid()]


async def _wait_for(name: str) -> float:
    """Wait until the test writes ``TMPDIR/name`` and return the time written in it."""
    marker = TMP / name
    async with asyncio.timeout(WAIT_FOR_TEST):
        while not marker.exists():  # noqa: ASYNC110 - another process writes the file
            await asyncio.sleep(0.01)
    return float(marker.read_text())


async def main(system: actorch.ActorSystem) -> str:
    remote = await system.spawn(Remote, name="partition/remote", on=1)
    await system.spawn(Local, name="partition/local", on=0)
    remote_where = await remote.call(Remote.where)
    listed_before = sorted(ref.name for ref in await system.lookup_all("**"))
    settled_at: list[float] = []
    pending = asyncio.ensure_future(remote.call(Remote.hang, 600))
    if MODE == "heal":
        remote.tell(Remote.busy, 600)  # keeps rank 1 stopping for its stop_grace, past the heal
    pending.add_done_callback(lambda _: settled_at.append(time.monotonic()))
    await asyncio.sleep(0.5)  # the call reaches rank 1 and its handler runs
    emit("ready", pending_done=pending.done(), remote=remote_where, listed=listed_before, nodes=len(system.nodes))
    (TMP / "pending").write_text(str(os.getpid()))
    partitioned_at = await _wait_for("partitioned")

    async def settle() -> Any:
        async with asyncio.timeout(SETTLE_TIMEOUT):
            return await pending

    outcome = await attempt(settle())
    outcome["since_partition"] = settled_at[0] - partitioned_at if settled_at else None
    healed_at = None
    if MODE == "heal":
        (TMP / "lost").write_text(str(time.monotonic()))
        healed_at = await _wait_for("healed")
        await asyncio.sleep(AFTER_HEAL)
    new_call = await attempt(remote.call(Remote.where))
    new_tell = attempt_now(lambda: remote.tell(Remote.where))
    emit(
        "partition",
        mode=MODE,
        partitioned_at=partitioned_at,
        healed_at=healed_at,
        settled_at=settled_at[0] if settled_at else None,
        pending=outcome,
        new_call=new_call,
        new_tell=new_tell,
        listed=sorted(ref.name for ref in await system.lookup_all("**")),
        lost_nodes={str(rank): why for rank, why in system.lost_nodes.items()},
    )
    MAIN_RETURNED.append(time.monotonic())
    return "main finished"


if __name__ == "__main__":
    try:
        result = actorch.run(main, channels=["staged"])  # namespaces of one machine share its /dev/shm
    finally:
        if RANK != 0:
            emit("rank1_run_ended", at=time.monotonic())
    emit("shutdown", seconds=time.monotonic() - MAIN_RETURNED[0], at=time.monotonic(), result=result)
    print("RETURNED " + json.dumps(result), flush=True)
