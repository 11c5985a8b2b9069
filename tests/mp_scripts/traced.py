"""Actors whose calls a timeline test traces: a chain of hops, tells, and a mailbox that makes calls wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import actorch


class Hop(actorch.Actor):
    """One link of a chain: ``relay`` calls the next hop, if any, and adds one."""

    def __init__(self, after: actorch.ActorRef[Any] | None = None) -> None:
        self.after = after
        self.noted: list[int] = []

    async def relay(self, value: int) -> int:
        if self.after is None:
            await asyncio.sleep(0.002)
            return value + 1
        return await self.after.call(Hop.relay, value) + 1

    async def note(self, value: int) -> None:
        self.noted.append(value)

    async def noted_count(self) -> int:
        return len(self.noted)

    async def fail(self) -> None:
        raise ValueError("traced failure")

    async def count(self, n: int) -> AsyncIterator[int]:
        for index in range(n):
            yield index


class Busy(actorch.Actor):
    """Handles one message at a time, slowly: concurrent calls wait in its mailbox."""

    async def hold(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds
