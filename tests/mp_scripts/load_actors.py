"""A counting actor and its callers, for the load test (importable on every rank as ``load_actors``)."""

from __future__ import annotations

import asyncio
import os
import resource
from pathlib import Path
from typing import Any

import actorch


def rss_mb() -> float:
    """This process's resident memory, in MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 1e6


class Tally(actorch.Actor):
    """Counts every message of every caller by its sequence number, to find losses and duplicates."""

    def __init__(self, callers: int, per_caller: int) -> None:
        self.seen = [bytearray(per_caller) for _ in range(callers)]
        self.duplicates = 0
        self.rss_start = rss_mb()

    def _mark(self, caller: int, seq: int) -> None:
        if self.seen[caller][seq]:
            self.duplicates += 1
        self.seen[caller][seq] = 1

    async def call(self, caller: int, seq: int) -> int:
        self._mark(caller, seq)
        return seq

    async def tell(self, caller: int, seq: int) -> None:
        self._mark(caller, seq)

    async def mark_memory(self) -> float:
        self.rss_start = rss_mb()
        return self.rss_start

    async def account(self) -> dict[str, Any]:
        cell = self.system.host.node.cell(self.ref._actor_id)  # the mailbox's own counters
        assert cell is not None
        return {
            "missing": [len(seen) - sum(seen) for seen in self.seen],
            "duplicates": self.duplicates,
            "rss_start_mb": self.rss_start,
            "rss_end_mb": rss_mb(),
            "queued_peak": cell.statistics()["queued_peak"],
            "handled": cell.statistics()["handled"],
            "pid": os.getpid(),
        }


class LoadCaller(actorch.Actor):
    """Sends its share: calls (up to ``window`` in flight) and tells, interleaved, each numbered once."""

    async def run(self, tally: actorch.ActorRef[Tally], caller: int, count: int, window: int) -> dict[str, Any]:
        slots = asyncio.Semaphore(window)
        answers = bytearray(count)
        wrong = 0
        full = 0
        calls: set[asyncio.Task[None]] = set()

        async def call(seq: int) -> None:
            nonlocal wrong
            try:
                if await tally.call(Tally.call, caller, seq) != seq:
                    wrong += 1
                answers[seq] += 1
            finally:
                slots.release()

        for seq in range(count):
            if seq % 2 == 0:
                await slots.acquire()
                task = asyncio.ensure_future(call(seq))
                calls.add(task)
                task.add_done_callback(calls.discard)
            else:
                while True:
                    try:
                        tally.tell(Tally.tell, caller, seq)
                        break
                    except actorch.MailboxFullError:
                        full += 1  # nothing was sent: wait for room, then send it again
                        await asyncio.sleep(0.001)
            if seq % 64 == 0:
                await asyncio.sleep(0)  # let replies in
        await asyncio.gather(*calls)
        expected_calls = (count + 1) // 2
        return {
            "answered_once": sum(1 for seq in range(0, count, 2) if answers[seq] == 1),
            "expected_calls": expected_calls,
            "wrong": wrong,
            "mailbox_full": full,
        }
