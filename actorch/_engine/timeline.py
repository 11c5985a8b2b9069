"""One timeline from every node's trace: clocks aligned, a track per actor, arrows from callers to callees.

The nodes' parts (``NodeTrace.finish``) are merged into the Chrome Trace Event
format, which ui.perfetto.dev and chrome://tracing open: a process per node,
a track per actor (``main`` for code outside actors), and a flow arrow from
each call or tell to the handler that ran it. Spans that overlap on one actor
(concurrent handlers, calls in flight together) get rows of their own, since a
track shows only nested spans. Mailbox waits, which overlap as a rule, are
async spans: the viewer stacks them under ``mailbox of <actor>``.

Each node's clock is ``perf_counter_ns``. Nodes on one machine share that
clock (Linux's monotonic clock is the machine's), so their offset is 0. For
another machine the offset to rank 0's clock comes from round trips
(:func:`offset_from_probes`), then is narrowed by causality: a callee's handler
starts after its caller sent, on the merged timeline too (:func:`align`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actorch._engine.tracing import (
    CALL_SPAN,
    HANDLER_SPAN,
    ITEM_MARK,
    STREAM_SPAN,
    TELL_MARK,
    WAIT_SPAN,
    TraceSettings,
)

__all__ = ["ClockProbe", "NodePart", "Timeline", "align", "flows", "merge", "offset_from_probes"]

_SENDS = frozenset({CALL_SPAN, TELL_MARK, STREAM_SPAN})
_MIN_SPAN_US = 1.0  # a tell or an item is drawn this long, so that its arrow has a span to start from


@dataclass(frozen=True)
class ClockProbe:
    """One round trip to read another node's clock: rank 0 sent at ``sent``, read ``remote``, heard at ``heard``."""

    sent: int
    remote: int
    heard: int


@dataclass
class NodePart:
    """What one node recorded, and where it ran (its clock's offset to the reference's is set by ``align``)."""

    rank: int
    host: str
    pid: int
    events: list[list[Any]]
    dropped: int = 0
    same_clock: bool = True  # whether it shares the reference node's clock (the same machine)
    probes: list[ClockProbe] = field(default_factory=list)
    offset: int = 0  # ns to add to its times to put them on the reference node's clock


@dataclass
class Timeline:
    """A trace being recorded by ``ActorSystem.trace``, and once its block ends, what was written.

    Attributes:
        path: Where the timeline is written.
        settings: What it keeps (sample, max_events).
        events: Spans written (calls, tells, handler runs, mailbox waits), once written.
        dropped: Events nodes counted but did not keep (past ``max_events``), once written.
        missing: Nodes whose part is missing: lost, or not answering in time.
    """

    path: Path
    settings: TraceSettings
    events: int = 0
    dropped: int = 0
    missing: list[int] = field(default_factory=list)


def offset_from_probes(probes: Sequence[ClockProbe]) -> tuple[int, int, int]:
    """The offset a node's clock has to rank 0's, from round trips: ``(estimate, lowest, highest)`` in ns.

    The remote reading lies between the send and the answer, so the offset
    lies in ``[sent - remote, heard - remote]``; the shortest round trip gives
    the narrowest such interval, and its middle is the estimate.

    Raises:
        ValueError: No probe was given.
    """
    if not probes:
        raise ValueError("a clock offset needs at least one round trip")
    best = min(probes, key=lambda probe: probe.heard - probe.sent)
    lowest, highest = best.sent - best.remote, best.heard - best.remote
    return (lowest + highest) // 2, lowest, highest


def align(parts: Sequence[NodePart], reference: int = 0) -> None:
    """Set each part's ``offset`` to the ``reference`` node's clock: 0 on its machine, else estimated.

    A node on another machine has its probes' estimate, narrowed by causality:
    every arrow between the reference node and it bounds its offset (what one
    sent reached the other's handler after it was sent). The estimate is moved
    into those bounds where it falls outside.
    """
    sends: dict[int, tuple[int, int]] = {}  # flow id -> (rank, time sent)
    for part in parts:
        for kind, _, _, start, _, flow, _ in part.events:
            if flow and kind in _SENDS:
                sends[flow] = (part.rank, start)
    for part in parts:
        if part.same_clock or not part.probes:
            part.offset = 0
            continue
        estimate, _, _ = offset_from_probes(part.probes)
        lowest, highest = -(1 << 62), 1 << 62
        for kind, _, _, start, _, flow, _ in part.events:
            sent = sends.get(flow) if kind == HANDLER_SPAN else None
            if sent is not None and sent[0] == reference:
                lowest = max(lowest, sent[1] - start)  # start + offset >= sent
        for other in parts:
            if other.rank != reference:
                continue
            for kind, _, _, start, _, flow, _ in other.events:
                sent = sends.get(flow) if kind == HANDLER_SPAN else None
                if sent is not None and sent[0] == part.rank:
                    highest = min(highest, start - sent[1])  # sent + offset <= start
        part.offset = min(max(estimate, lowest), highest) if lowest <= highest else estimate


class _Rows:
    """Rows of one track: each span goes in the first row where it follows or nests in what is there."""

    def __init__(self) -> None:
        self._open: list[list[int]] = []  # per row: the ends of the spans it holds open, innermost last

    def place(self, start: int, end: int) -> int:
        for row, ends in enumerate(self._open):
            while ends and ends[-1] <= start:
                ends.pop()
            if not ends or ends[-1] >= end:
                ends.append(end)
                return row
        self._open.append([end])
        return len(self._open) - 1


def merge(parts: Sequence[NodePart], *, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Chrome Trace Event document of ``parts`` (aligned first with ``align``): ``{"traceEvents": [...]}``."""
    timed = [(part, event, event[3] + part.offset) for part in parts for event in part.events]
    base = min((at for _, _, at in timed), default=0)
    out: list[dict[str, Any]] = []
    tids: dict[tuple[int, str, int], int] = {}
    rows: dict[tuple[int, str], _Rows] = defaultdict(_Rows)
    for part in parts:
        pid = part.rank + 1
        where = f"{part.host} pid {part.pid}"
        out.append(_meta("process_name", pid, 0, name=f"node {part.rank} ({where})"))
        out.append(_meta("process_sort_index", pid, 0, sort_index=part.rank))
    waits = 0
    for part, event, at in sorted(timed, key=lambda item: (item[2], -item[1][4])):
        kind, track, name, start, end, flow, args = event
        pid = part.rank + 1
        ts = (at - base) / 1000
        if kind == WAIT_SPAN:
            waits += 1
            wait = {"name": f"mailbox of {track}", "cat": WAIT_SPAN, "id": waits, "pid": pid, "tid": 0}
            out.append({**wait, "ph": "b", "ts": ts, "args": {"endpoint": name}})
            out.append({**wait, "ph": "e", "ts": ts + (end - start) / 1000})
            continue
        lane = track
        row = rows[(pid, lane)].place(start, max(end, start + 1))
        tid = tids.get((pid, lane, row))
        if tid is None:
            tid = tids[(pid, lane, row)] = len(tids) + 1
            out.append(_meta("thread_name", pid, tid, name=lane if row == 0 else f"{lane} ({row + 1})"))
            out.append(_meta("thread_sort_index", pid, tid, sort_index=_sort_index(lane, row)))
        dur = max((end - start) / 1000, _MIN_SPAN_US if kind in (TELL_MARK, ITEM_MARK) else 0.0)
        out.append({"ph": "X", "name": name, "cat": kind, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args})
        if flow and kind in _SENDS:
            out.append({"ph": "s", "name": kind, "cat": "flow", "id": flow, "ts": ts, "pid": pid, "tid": tid})
        elif flow and kind == HANDLER_SPAN:
            out.append(
                {"ph": "f", "bp": "e", "name": "call", "cat": "flow", "id": flow, "ts": ts, "pid": pid, "tid": tid}
            )
    other = {
        "nodes": {str(part.rank): {"host": part.host, "pid": part.pid, "offset_ns": part.offset} for part in parts},
        "dropped": {str(part.rank): part.dropped for part in parts if part.dropped},
        **(meta or {}),
    }
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}


def _meta(what: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args}


def _sort_index(lane: str, row: int) -> int:
    """``main`` first, then each actor's rows in the order they first appear."""
    return (0 if lane == "main" else 1000) + row


def flows(document: dict[str, Any]) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    """Each arrow of a merged document as ``(start, finish)`` events (for checks and tools)."""
    starts = {event["id"]: event for event in document["traceEvents"] if event.get("ph") == "s"}
    for event in document["traceEvents"]:
        if event.get("ph") == "f" and event["id"] in starts:
            yield starts[event["id"]], event
