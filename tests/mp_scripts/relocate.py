"""Relocation between real processes: kill -9 the node of a named ReplayBuffer that saves every 10 additions.

Usage: ``python relocate.py TMPDIR``. Three nodes. Node 2 hosts the buffer
(``Restart(relocate=True)``, ``snapshot_every=10``), a relocatable ``Tally``
with a call hanging in it, a plain ``Counter``, and a relocatable ``Tally``
placed apart from node 1's ``Holder`` (which keeps a ref to the buffer) and
from an actor on node 0, so that no node may take it once node 2 is lost.
``main`` adds 57 transitions, samples the buffer by name in a loop, SIGKILLs
node 2, and records what follows: the hanging call, calls through the old
refs, lookups, what the buffer holds, the plain actor, the one kept apart.
Then it freezes node 1 (SIGSTOP) past the liveness timeout, where the buffer
now lives: no node is left to host it (rank 0 never does).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from actors import Counter, Holder, Tally, attempt, emit, is_dead, wait_lost

import actorch

TMP = Path(sys.argv[1])
RELOCATE = actorch.Restart(relocate=True)
ADDED = 57
EVERY = 10
STOPPED: list[int] = []


async def within(seconds: float, awaitable: Any) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


class Sampler:
    """Samples the buffer by name, again and again, and notes when sampling works again after a kill."""

    def __init__(self, system: actorch.ActorSystem) -> None:
        self.system = system
        self.killed_at: float | None = None
        self.first_after_kill: float | None = None
        self.errors: list[str] = []
        self.samples = 0
        self.going = asyncio.Event()  # set once a few samples were drawn
        self.resumed = asyncio.Event()  # set once a sample was drawn after the kill

    async def run(self) -> None:
        while True:
            try:
                buffer = await self.system.lookup("replay")
                await buffer.call(actorch.ReplayBuffer.sample, 4)
            except Exception as exc:
                self.errors.append(type(exc).__name__)
                await asyncio.sleep(0.001)
                continue
            self.samples += 1
            if self.samples == 5:
                self.going.set()
            if self.killed_at is not None and self.first_after_kill is None:
                self.first_after_kill = time.monotonic() - self.killed_at
                self.resumed.set()
            await asyncio.sleep(0.001)


async def main(system: actorch.ActorSystem) -> str:
    buffer = await system.spawn(
        actorch.ReplayBuffer, args=(1000,), kwargs={"snapshot_every": EVERY}, name="replay", on=2, restart=RELOCATE
    )
    tally = await system.spawn(Tally, args=(EVERY,), name="tally", on=2, restart=RELOCATE)
    plain = await system.spawn(Counter, args=(1,), name="plain", on=2, restart=actorch.Restart())
    holder = await system.spawn(Holder, on=1)
    await holder.call(Holder.hold, buffer)
    # Kept apart from node 1's holder and an actor on node 0: node 2 alone fits, and nothing once it is lost.
    beside_main = await system.spawn(Counter, args=(0,))
    apart = await system.spawn(
        Tally, args=(EVERY,), name="apart", on=actorch.Where(apart_from=[holder, beside_main]), restart=RELOCATE
    )
    for index in range(ADDED):
        await buffer.call(actorch.ReplayBuffer.add, {"i": torch.tensor(index)})
    before = await buffer.call(actorch.ReplayBuffer.statistics)
    pid2, pid1 = system.nodes[2].pid, system.nodes[1].pid

    sampler = Sampler(system)
    sampling = asyncio.ensure_future(sampler.run())
    await within(15, sampler.going.wait())
    hanging = asyncio.ensure_future(tally.call(Tally.hang, 60))
    await asyncio.sleep(0.2)
    sampler.killed_at = killed_at = time.monotonic()
    os.kill(pid2, signal.SIGKILL)
    in_flight = await attempt(within(15, hanging))
    await within(15, sampler.resumed.wait())
    lost_seen = await attempt(within(15, wait_lost(system, 2)))

    old_ref = await attempt(buffer.call(actorch.ReplayBuffer.statistics))
    found = await system.lookup("replay")
    content = await found.call(actorch.ReplayBuffer.sample, 4000)
    emit(
        "moved",
        before=before,
        in_flight=in_flight,
        first_after_kill=sampler.first_after_kill,
        kill_to_now=time.monotonic() - killed_at,
        lost_seen=lost_seen,
        old_ref=old_ref,
        old_ref_rank=buffer.rank,
        found=[found.rank, found == buffer],
        held=await attempt(holder.call(Holder.call_held, "size")),
        sampled=sorted(set(content.data["i"].tolist())),
        tally_after=await attempt(tally.call(Tally.get)),
        tally_where=await attempt(tally.call(Tally.where)),
        apart_where=apart.rank,
        apart_after=await attempt(within(15, apart.call(Tally.get))),
        plain_call=await attempt(plain.call(Counter.get)),
        plain_lookup=await attempt(within(1.0, system.lookup("plain"))),
        sample_errors=sorted(set(sampler.errors)),
    )

    # Node 1 hosts the buffer now; freeze it: the heartbeats count it lost, and no node is left.
    os.kill(pid1, signal.SIGSTOP)
    STOPPED.append(pid1)
    frozen_at = time.monotonic()
    await within(30, wait_lost(system, 1))
    lost_after = time.monotonic() - frozen_at
    sampling.cancel()
    emit(
        "stranded",
        lost_after=lost_after,
        call=await attempt(buffer.call(actorch.ReplayBuffer.size)),
        lookup=await attempt(within(1.0, system.lookup("replay"))),
        exit=await attempt(buffer.wait_stopped()),
        listed=[ref.name for ref in await system.lookup_all("**")],
        refused=await attempt(system.spawn(Tally, restart=RELOCATE)),
    )
    return "main finished"


if __name__ == "__main__":
    result = actorch.run(main, world_size=3, stop_grace=1.0)
    emit("ended", result=result, stopped_dead=[is_dead(pid) for pid in STOPPED])
