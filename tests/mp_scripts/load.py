"""Load without loss: 8 callers on 4 ranks send numbered calls and tells to one counting actor.

Usage: ``python load.py MESSAGES MAILBOX WINDOW``: MESSAGES in all (half calls,
half tells, interleaved), a ``mailbox_size`` of MAILBOX, and at most WINDOW calls
in flight per caller. The counting actor lives on rank 1; two callers live on
each of ranks 0, 2, 3 and 4 (the two on rank 0 share its node with ``main``).
"""

from __future__ import annotations

import asyncio
import sys
import time

from actors import emit
from load_actors import LoadCaller, Tally

import actorch

MESSAGES = int(sys.argv[1])
MAILBOX = int(sys.argv[2])
WINDOW = int(sys.argv[3])
CALLERS = 8
CALLER_RANKS = [0, 0, 2, 2, 3, 3, 4, 4]


async def main(system: actorch.ActorSystem) -> None:
    per_caller = MESSAGES // CALLERS
    tally = await system.spawn(Tally, args=(CALLERS, per_caller), on=1)
    callers = [await system.spawn(LoadCaller, on=rank) for rank in CALLER_RANKS]
    await tally.call(Tally.mark_memory)
    started = time.monotonic()
    reports = await asyncio.gather(
        *(caller.call(LoadCaller.run, tally, index, per_caller, WINDOW) for index, caller in enumerate(callers))
    )
    seconds = time.monotonic() - started
    emit(
        "load",
        seconds=seconds,
        messages=per_caller * CALLERS,
        per_second=per_caller * CALLERS / seconds,
        callers=reports,
        tally=await tally.call(Tally.account),
        mailbox=MAILBOX,
        senders=len(set(CALLER_RANKS)),
    )


if __name__ == "__main__":
    actorch.run(main, world_size=5, mailbox_size=MAILBOX)
