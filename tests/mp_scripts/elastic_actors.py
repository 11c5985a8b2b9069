"""Actors of the elastic-system scripts, importable on every node (joiners run from this folder too)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from torch import nn

import actorch


class Worker(actorch.Actor):
    """Sleeps when asked, counts the tells it handled, and leaves a file when it stops."""

    def __init__(self, marks: str = "") -> None:
        self.marks = Path(marks) if marks else None
        self.told = 0

    async def where(self) -> list[Any]:
        return [self.system.rank, os.getpid()]

    async def nap(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    async def note(self, text: str) -> None:
        self.told += 1
        if self.marks is not None:
            with (self.marks / "told").open("a") as file:
                file.write(text + "\n")

    async def lookup(self, name: str) -> list[Any]:
        ref = await self.system.lookup(name)
        return await ref.call("where")

    async def leave(self) -> None:
        await self.system.leave()

    async def on_stop(self) -> None:
        if self.marks is not None:
            label = (self.ref.name or "unnamed").replace("/", "_")
            (self.marks / f"stopped-{label}").write_text(str(self.told))


class Tally(actorch.Actor):
    """Records every message id it gets, by sender, to find lost and duplicated ones."""

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}

    async def hit(self, sender: str, number: int) -> int:
        self.seen.setdefault(sender, []).append(number)
        return number

    async def report(self) -> dict[str, list[int]]:
        return self.seen


class Caller(actorch.Actor):
    """Sends calls numbered ``start..stop-1`` to a tally in paced rounds; says how many came back answered."""

    async def send(
        self, tally: actorch.ActorRef[Tally], sender: str, start: int, stop: int, per_round: int, pause: float
    ) -> int:
        answered = 0
        for first in range(start, stop, per_round):
            numbers = range(first, min(first + per_round, stop))
            results = await asyncio.gather(*(tally.call(Tally.hit, sender, number) for number in numbers))
            answered += sum(1 for number, result in zip(numbers, results, strict=True) if number == result)
            await asyncio.sleep(pause)
        return answered


def small_policy() -> Any:
    """The corridor's policy, small enough to learn in a test."""
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=-1))
