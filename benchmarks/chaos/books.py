"""The invariants' books: their tallies, and the judgements of faults, losses and memory.

``Book`` is kept by ``main`` and by every worker's ``Caller`` (it crosses as
plain data in their reports). ``Roster`` is ``main``'s knowledge of the
nodes: the faults it made, the leaves it began, the losses rank 0 counted;
it says whether a count of a node as lost was excused.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import actorch
from chaos.records import Loss

T = TypeVar("T")

LATE = 1.0
"""Seconds past its deadline a call may end: the event loop's lag on a loaded machine, not the runtime's slack."""
NAME_GRACE = 1.0
"""Seconds after rank 0 counts a node lost within which ``lookup_all`` may still list its actors."""
FLAT_MIB = 32.0
"""Growth of a survivor's resident memory after warm-up (medians of the first and last fifth) that breaks *memory*."""
MAX_LATE = 100
"""Late calls a book keeps for judgement; past them, each is a break at once."""
EXCUSE_SLACK = 1.0
"""Seconds a short fault excuses a loss past ``liveness_timeout`` after it ended."""
INVARIANTS = {
    "deadline": f"every call ends within its deadline (+{LATE:g} s)",
    "typed": "every call ends with its value or a typed error",
    "tells": "no tell to a live actor is lost",
    "losses": "no node the soak did not fault is counted lost",
    "names": "names resolve to live actors",
    "memory": f"each survivor's memory stays flat (<= {FLAT_MIB:g} MiB)",
    "relocation": "a relocated actor loses exactly what came after its last snapshot",
}
"""Each invariant's key, and its words in the table."""


@dataclass
class Late:
    """A call that ended ``late`` seconds past its ``deadline`` (more than ``LATE``); ``start``, ``end``: wall time."""

    what: str
    start: float
    end: float
    deadline: float
    late: float


@dataclass
class Tally:
    """One invariant's books: checks made, checks broken, the first few breaks in words."""

    checked: int = 0
    broken: int = 0
    examples: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str | Callable[[], str]) -> bool:
        """Count a check; keep the first breaks' words."""
        self.checked += 1
        if not ok:
            self.broken += 1
            if len(self.examples) < 5:
                self.examples.append(what() if callable(what) else what)
        return ok

    def merged(self, other: Tally) -> Tally:
        """Both books as one."""
        return Tally(self.checked + other.checked, self.broken + other.broken, (self.examples + other.examples)[:5])


@dataclass
class Book:
    """The invariants' tallies and the figures that go with them, kept by ``main`` and by each worker's ``Caller``."""

    tallies: dict[str, Tally] = field(default_factory=lambda: {name: Tally() for name in INVARIANTS})
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    worst_late: float = float("-inf")
    late: list[Late] = field(default_factory=list)
    """Calls that ended past their deadline and ``LATE``, not judged yet: their node may have been stopped."""

    def to_json(self) -> dict[str, Any]:
        """The book as plain data (it crosses nodes in a ``Caller``'s report)."""
        return {
            "tallies": {name: dataclasses.asdict(tally) for name, tally in self.tallies.items()},
            "counts": dict(self.counts),
            "errors": dict(self.errors),
            "worst_late": self.worst_late,
            "late": [dataclasses.asdict(late) for late in self.late],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Book:
        """The book ``to_json`` made."""
        tallies = {name: Tally(**tally) for name, tally in data["tallies"].items()}
        counts, errors = collections.Counter(data["counts"]), collections.Counter(data["errors"])
        late = [Late(**each) for each in data.get("late", [])]
        return cls(tallies, counts, errors, data["worst_late"], late)

    def add(self, other: Book, origin: int, roster: Roster) -> None:
        """Fold the book node ``origin`` kept into this one, judging its late calls: a node stopped is excused."""
        for name, tally in other.tallies.items():
            said = [f"node {origin}: {example}" for example in tally.examples]
            self.tallies[name] = self.tallies[name].merged(Tally(tally.checked, tally.broken, said))
        self.counts.update(other.counts)
        self.errors.update(other.errors)
        self.worst_late = max(self.worst_late, other.worst_late)
        for late in other.late:
            if roster.stopped_during(origin, late.start, late.end):
                self.counts["late calls of callers the soak stopped"] += 1
                continue
            self.worst_late = max(self.worst_late, late.late)
            self.tallies["deadline"].check(
                False, f"node {origin}: {late.what} ended {late.late:.2f} s past its {late.deadline:.2f} s"
            )

    def typed(self, exc: BaseException, what: str) -> bool:
        """Judge an error: typed (an ``ActorchError`` or ``TimeoutError``) holds *typed*, anything else breaks it."""
        self.errors[type(exc).__name__] += 1
        ok = isinstance(exc, (actorch.ActorchError, TimeoutError))
        return self.tallies["typed"].check(ok, lambda: f"{what}: untyped {type(exc).__name__}: {str(exc)[:160]}")

    def ended(self, started: float, deadline: float, what: str) -> None:
        """Judge when an awaited thing ended against its deadline (loop time ``started``).

        One that ended more than ``LATE`` past it is kept in ``late`` and
        judged with the faults known (``add``): the soak may have stopped the
        process that waited, whose timers could not fire meanwhile.
        """
        now = asyncio.get_running_loop().time()
        late = now - started - deadline
        if late <= LATE:
            self.worst_late = max(self.worst_late, late)
            self.tallies["deadline"].check(True, "")
        elif len(self.late) < MAX_LATE:
            wall = time.time()
            self.late.append(Late(what, wall - (now - started), wall, deadline, late))
        else:
            self.tallies["deadline"].check(False, f"{what}: ended {late:.2f} s past its {deadline:.2f} s")

    async def call(
        self, what: str, deadline: float, make: Callable[[], Awaitable[T]], right: Callable[[T], bool]
    ) -> T | BaseException:
        """Await ``make()`` under ``deadline``; judge *deadline* and *typed*; its value, or the error it raised."""
        started = asyncio.get_running_loop().time()
        self.counts[what] += 1
        outcome: T | BaseException
        try:
            async with asyncio.timeout(deadline):
                outcome = await make()
        except Exception as exc:
            self.typed(exc, what)
            outcome = exc
        else:
            self.tallies["typed"].check(right(outcome), lambda: f"{what}: a wrong value {outcome!r:.120}")
        self.ended(started, deadline, what)
        return outcome


@dataclass
class Fault:
    """A fault the soak made, from ``start`` to ``end`` (``time.time()``; None: the node is not expected back)."""

    rank: int
    kind: str
    start: float
    end: float | None
    label: str = ""
    """Its row in the faults table (``stop short``, ``kill``...)."""


@dataclass
class Roster:
    """What ``main`` knows of the nodes: faults made, leaves begun, losses counted by rank 0, roles ready."""

    liveness: float
    faults: list[Fault] = field(default_factory=list)
    left: dict[int, float] = field(default_factory=dict)
    lost_by_0: dict[int, float] = field(default_factory=dict)
    ready: dict[int, dict[str, actorch.ActorRef[Any]]] = field(default_factory=dict)
    collectors: dict[int, actorch.ActorRef[Any]] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)

    def excuses(self, rank: int, at: float, kinds: Iterable[str] = ("kill", "stop", "partition", "cut")) -> bool:
        """Whether a fault of ``rank`` (of ``kinds``) covers ``at``: it began by then, and has not long ended."""
        grace = self.liveness + EXCUSE_SLACK
        return any(
            fault.rank == rank
            and fault.kind in kinds
            and fault.start - EXCUSE_SLACK <= at
            and (fault.end is None or at <= fault.end + grace)
            for fault in self.faults
        )

    def lost_to(self, fault: Fault) -> bool:
        """Whether rank 0 counted the faulted node lost while the fault lasted, or within the liveness timeout after."""
        lost_at = self.lost_by_0.get(fault.rank)
        until = float("inf") if fault.end is None else fault.end + self.liveness + EXCUSE_SLACK
        return lost_at is not None and fault.start - EXCUSE_SLACK <= lost_at <= until

    def stopped_during(self, rank: int, start: float, end: float) -> bool:
        """Whether the soak stopped node ``rank`` at some moment between ``start`` and ``end`` (its timers froze)."""
        return any(
            fault.rank == rank
            and fault.kind == "stop"
            and fault.start <= end + EXCUSE_SLACK
            and (fault.end is None or fault.end >= start - EXCUSE_SLACK)
            for fault in self.faults
        )

    def gone(self, rank: int, at: float) -> bool:
        """Whether ``rank`` was faulted, lost to rank 0 or leaving at ``at`` (its actors may be gone then)."""
        return (
            self.excuses(rank, at)
            or self.lost_by_0.get(rank, float("inf")) <= at + EXCUSE_SLACK
            or self.left.get(rank, float("inf")) <= at + EXCUSE_SLACK
        )

    def judge_loss(self, book: Book, loss: Loss) -> None:
        """*losses*: a count of ``loss.peer`` as lost holds only if the soak faulted it, or the counter was out.

        A node that learns of a loss after rank 0 counted it (one that joined
        later, or hears it from rank 0) is judged at rank 0's moment: the loss
        happened then. A count made by a node cut off, or already counted lost
        by rank 0, is no evidence: that node is out of the system.
        """
        if loss.by != 0 and (
            self.excuses(loss.by, loss.at, ("partition", "cut")) or self.lost_by_0.get(loss.by, float("inf")) < loss.at
        ):
            book.counts["losses counted by nodes out of the system"] += 1
            return
        at = min(loss.at, self.lost_by_0.get(loss.peer, loss.at))
        faulted = self.excuses(loss.peer, at)
        leaving = " (it was leaving)" if loss.peer in self.left else ""
        book.tallies["losses"].check(
            faulted,
            lambda: (
                f"node {loss.by} counted node {loss.peer} lost ({loss.why[:100]}), which the soak did not fault"
                + leaving
            ),
        )


def memory_verdict(samples: dict[int, list[tuple[float, int]]], survivors: set[int], seconds: float) -> dict[str, Any]:
    """Each survivor's growth after its warm-up (MiB), and those watched too briefly to judge."""
    growth: dict[int, float] = {}
    young: list[int] = []
    for rank in sorted(survivors):
        series = samples.get(rank, [])
        if len(series) < 10:
            young.append(rank)
            continue
        born, last = series[0][0], series[-1][0]
        warm = born + max(10.0, 0.25 * (last - born))
        after = [rss for at, rss in series if at >= warm]
        if len(after) < 10:
            young.append(rank)
            continue
        fifth = max(2, len(after) // 5)
        growth[rank] = (statistics.median(after[-fifth:]) - statistics.median(after[:fifth])) / 2**20
    return {"growth": growth, "young": young, "seconds": seconds}
