"""The actors of the soak: those every node hosts, the ledgers, and the collectors' corridor.

Every node but rank 0 hosts a ``Sentinel``, an ``Echo``, a ``Sink`` and a
``Caller`` (``ROLES``), and a stock ``Collector`` playing ``Walk``; rank 0
hosts the ``Witness``; ``Ledger`` actors are named and relocatable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import nn

import actorch
from actorch.rl import Batch
from chaos.books import Book
from chaos.records import Entry, Loss, Seen


class Teller:
    """Numbered tells from one sender to sinks, and the checks that none was lost on the way.

    The check is a call from the same sender, so every tell sent before it
    has started on the sink before the check runs (one caller, one actor:
    messages start in the order sent).
    """

    def __init__(self, sender: str, book: Book) -> None:
        self.sender = sender
        self.book = book
        self.sent: dict[Any, int] = {}  # sink ref -> the last number sent

    def tell(self, sink: actorch.ActorRef[Sink]) -> None:
        """Send ``sink`` the next number; one refused at once was not sent, and is sent again next time."""
        number = self.sent.get(sink, 0) + 1
        try:
            sink.tell(Sink.record, self.sender, number)
        except Exception as exc:
            self.book.typed(exc, "tell")
            return
        self.sent[sink] = number
        self.book.counts["tell"] += 1

    async def check(self, sink: actorch.ActorRef[Sink], deadline: float) -> None:
        """Ask ``sink`` what it got from this sender; if it answers, it must hold every tell sent before."""
        told = self.sent.get(sink, 0)
        seen = await self.book.call("tell check", deadline, lambda: sink.call(Sink.seen, self.sender), _is_seen)
        if isinstance(seen, Seen):
            where = f"{self.sender} -> {sink.name}"
            self.book.tallies["tells"].check(
                seen.last == told and seen.gaps == 0 and seen.repeats == 0,
                lambda: (
                    f"{where}: {told} told, the sink saw up to {seen.last}, {seen.gaps} missing, "
                    f"{seen.repeats} repeated"
                ),
            )


def _is_seen(value: object) -> bool:
    return isinstance(value, Seen)


class Witness(actorch.Actor):
    """Rank 0's inbox of losses counted by the other nodes (their sentinels tell it)."""

    def __init__(self) -> None:
        self.losses: list[Loss] = []

    async def lost(self, loss: Loss) -> None:
        """Keep one node's count of another as lost."""
        self.losses.append(loss)

    async def drain(self) -> list[Loss]:
        """The losses told since the last drain."""
        taken, self.losses = self.losses, []
        return taken


class Busy(actorch.Actor):
    """An actor with work of its own beside its endpoints (``_work``), from its start to its stop."""

    task: asyncio.Task[None] | None = None

    async def on_start(self) -> None:
        self.task = asyncio.ensure_future(self._work())

    async def on_stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _work(self) -> None:
        raise NotImplementedError


class Sentinel(Busy):
    """Watches its node's membership events, tells rank 0 each node it counts lost, and reports its memory."""

    def __init__(self, witness: actorch.ActorRef[Witness]) -> None:
        self.witness = witness

    async def _work(self) -> None:
        async for event in self.system.events("soak/none"):  # node events only
            if isinstance(event, actorch.NodeLost):
                with contextlib.suppress(actorch.ActorchError):
                    self.witness.tell(Witness.lost, Loss(self.system.rank, event.rank, event.reason, time.time()))

    async def rss(self) -> int:
        """This process's resident memory, in bytes."""
        return resident_bytes()

    async def ping(self) -> int:
        """Its rank."""
        return self.system.rank


class Echo(actorch.Actor):
    """Answers calls after a while, streams numbers, sums broadcast tensors."""

    max_concurrency = 16

    async def work(self, token: int, seconds: float) -> int:
        """``token``, after ``seconds``."""
        await asyncio.sleep(seconds)
        return token

    async def count(self, items: int, pause: float) -> Any:
        """Yield 0 .. ``items`` - 1, ``pause`` seconds apart."""
        for item in range(items):
            yield item
            await asyncio.sleep(pause)

    async def take(self, tensor: torch.Tensor) -> float:
        """The tensor's sum."""
        return float(tensor.sum())

    async def ping(self) -> int:
        """Its rank."""
        return self.system.rank


class Sink(actorch.Actor):
    """Receives numbered tells from many senders and says, per sender, whether any went missing or came twice."""

    def __init__(self) -> None:
        self.senders: dict[str, Seen] = {}

    async def record(self, sender: str, number: int) -> None:
        """One tell: ``number`` from ``sender``."""
        seen = self.senders.setdefault(sender, Seen(0, 0, 0))
        if number <= seen.last:
            seen.repeats += 1
        else:
            seen.gaps += number - seen.last - 1
            seen.last = number

    async def seen(self, sender: str) -> Seen:
        """What came from ``sender`` so far."""
        return self.senders.get(sender, Seen(0, 0, 0))

    async def ping(self) -> int:
        """Its rank."""
        return self.system.rank


class Caller(Busy):
    """A worker's own load: calls with deadlines to other nodes' echoes, numbered tells to their sinks, checked."""

    def __init__(self) -> None:
        self.book = Book()

    async def _work(self) -> None:
        rng = random.Random(self.system.rank)
        teller = Teller(f"caller/{self.system.rank}", self.book)
        echoes: list[actorch.ActorRef[Echo]] = []
        sinks: list[actorch.ActorRef[Sink]] = []
        looked = checked = 0.0
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if now - looked > 2.0:
                looked = now
                with contextlib.suppress(actorch.ActorchError):
                    mine = self.system.rank
                    echoes = [ref for ref in await self.system.lookup_all("soak/echo/*") if ref.rank != mine]
                    sinks = [ref for ref in await self.system.lookup_all("soak/sink/*") if ref.rank != mine]
            if echoes:
                await echo_call(self.book, rng.choice(echoes), rng)
            for sink in sinks:
                teller.tell(sink)
            if sinks and now - checked > 2.0:
                checked = now
                for sink in sinks:
                    await teller.check(sink, 2.0)
            await asyncio.sleep(0.1)

    async def report(self) -> dict[str, Any]:
        """Its book so far."""
        return self.book.to_json()

    async def ping(self) -> int:
        """Its rank."""
        return self.system.rank


class Ledger(actorch.Actor):
    """A relocatable count with a tensor that agrees with it, saved every ``every`` additions."""

    def __init__(self, every: int, size: int) -> None:
        self.every = every
        self.count = 0
        self.tensor = torch.zeros(size, dtype=torch.int64)
        self.incarnation = uuid.uuid4().hex[:12]
        self.restored_from: int | None = None
        self.intact = True

    def restore(self, state: tuple[int, torch.Tensor]) -> None:
        self.count, self.tensor = state
        self.restored_from = self.count
        self.intact = int(self.tensor.sum()) == self.count

    async def add(self) -> Entry:
        """One more; a snapshot of the count and the tensor when the count reaches a multiple of ``every``."""
        self.count += 1
        self.tensor[self.count % len(self.tensor)] += 1
        if self.count % self.every == 0:
            await self.save_snapshot((self.count, self.tensor.clone()))
        return Entry(self.count, self.incarnation, self.restored_from, self.intact, self.system.rank)

    async def ping(self) -> int:
        """Its rank."""
        return self.system.rank


class Walk:
    """The collectors' environment: a corridor of 8 cells, Gymnasium's ``reset`` and ``step``.

    Action 1 steps right and earns 1, action 0 stays; an episode ends at the
    end or after 8 steps. The observation is ``[position / 8, 1]``.
    """

    length = 8

    def __init__(self) -> None:
        self.position = self.steps = 0

    def reset(self, seed: int | None = None) -> tuple[list[float], dict[str, Any]]:
        self.position = self.steps = 0
        return self.observe(), {}

    def step(self, action: Any) -> tuple[list[float], float, bool, bool, dict[str, Any]]:
        self.steps += 1
        self.position += int(action)
        terminated = self.position >= self.length
        return self.observe(), float(action), terminated, not terminated and self.steps >= self.length, {}

    def observe(self) -> list[float]:
        return [self.position / self.length, 1.0]


def walk_policy() -> nn.Module:
    """The collectors' policy: logits of the two actions."""
    return nn.Linear(2, 2)


FRAMES = 64
ENVS = 4


def intact(batch: Batch) -> bool:
    """Whether a batch is what the collector played: each step moved the walker by its action."""
    moved = batch.next_observations[..., 0] - batch.observations[..., 0]
    return bool(
        batch.frames == FRAMES
        and batch.observations.shape == (FRAMES // ENVS, ENVS, 2)
        and torch.allclose(moved, batch.actions.float() / Walk.length)
    )


def resident_bytes() -> int:
    """This process's resident set size, in bytes."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


async def echo_call(book: Book, echo: actorch.ActorRef[Echo], rng: random.Random) -> None:
    """A call with a deadline; one in ten asks for work past its deadline, and must time out in time."""
    deadline = rng.uniform(0.3, 2.0)
    seconds = deadline * 1.5 if rng.random() < 0.1 else rng.uniform(0.0, 0.02)
    token = rng.randrange(1 << 30)
    await book.call("call", deadline, lambda: echo.call(Echo.work, token, seconds), token.__eq__)


ROLES: dict[str, type[actorch.Actor]] = {"sentinel": Sentinel, "echo": Echo, "sink": Sink, "caller": Caller}
"""The actors every node but rank 0 hosts, named ``soak/<role>/<rank>``."""
