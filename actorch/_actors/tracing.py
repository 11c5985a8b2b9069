"""``ActorSystem.trace``: record a timeline on every node of the system and write it as one file.

The node that traces asks every node's service to start recording, and when
the block ends, reads each node's clock (round trips, for nodes on other
machines), stops every node, merges their parts (``timeline``) and writes the
file: Chrome Trace Event JSON, which ui.perfetto.dev and chrome://tracing
open. Nodes that join while it runs are not traced; a node lost meanwhile, or
one that does not answer within ``ANSWER_TIMEOUT`` (its event loop blocked),
is named in the file's metadata, its part missing: the trace never holds the
program up for long.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import structlog

from actorch._actors.ref import ActorRef
from actorch._actors.system_endpoints import ServiceEndpoints
from actorch._base.errors import ActorchError, TraceRunningError
from actorch._engine.timeline import ClockProbe, NodePart, Timeline, align, merge
from actorch._engine.tracing import TraceSettings
from actorch._transport.base import NodeInfo

__all__ = ["ANSWER_TIMEOUT", "PROBES", "TracingHost", "record_timeline"]

log = structlog.get_logger("actorch")

PROBES = 5
"""Round trips that read the clock of a node on another machine; the shortest gives its offset."""
ANSWER_TIMEOUT = 10.0
"""Seconds a node has to start recording, to hand over what it recorded, or to read its clock."""


class TracingHost(Protocol):
    """What a trace needs of the tracing node's actor host: the nodes, refs to their services, its own timeline."""

    rank: int
    timeline: Timeline | None  # the timeline this node records for the system, while one runs

    @property
    def services(self) -> Mapping[int, ActorRef[Any]]:
        """Refs to every node's service, by rank."""

    @property
    def lost(self) -> Mapping[int, str]:
        """The nodes gone for good, with why."""

    @property
    def tracing(self) -> bool:
        """Whether this node records its part of a timeline now."""

    def peers(self) -> list[NodeInfo]:
        """Every node of the world, by rank."""


@asynccontextmanager
async def record_timeline(
    host: TracingHost, path: str | os.PathLike[str], settings: TraceSettings
) -> AsyncIterator[Timeline]:
    """Record a timeline of every node while the block runs, then write it to ``path`` (see ``ActorSystem.trace``).

    Raises:
        TraceRunningError: A trace is already being recorded on this node.
        OSError: ``path``'s directory does not exist or cannot be written (checked before recording starts).
    """
    target = Path(path)
    if host.tracing:
        raise TraceRunningError(_running(host))
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot write a trace to {target}: {target.parent} is not a directory")
    timeline = host.timeline = Timeline(target, settings)
    # This node starts last and stops first, so that the trace's own calls stay out of it.
    nodes = sorted(_live(host), key=lambda info: info.rank == host.rank)
    started: list[NodeInfo] = []
    try:
        for info in nodes:
            answered, _ = await _ask(
                host, info, timeline, ServiceEndpoints.trace_start, settings.sample, settings.max_events
            )
            if answered:
                started.append(info)
        yield timeline
    finally:
        try:
            await _write(host, started[::-1], timeline)
        finally:
            host.timeline = None


def _running(host: TracingHost) -> str:
    """Why a second trace is refused: which one runs (the file it goes to, if this node started it)."""
    held = host.timeline
    which = f"to {str(held.path)!r}" if held is not None else "that another node started"
    return (
        f"node {host.rank} already records a timeline {which}: one at a time. A run started with "
        "run(trace=...) or actorch run --trace records the whole run, every system.trace block's calls included: "
        "trace a part of a run only where the run itself is not traced"
    )


async def _ask(host: TracingHost, info: NodeInfo, timeline: Timeline, endpoint: Any, *args: Any) -> tuple[bool, Any]:
    """Call ``endpoint`` of node ``info``'s service within ``ANSWER_TIMEOUT``: ``(True, answer)`` or ``(False, None)``.

    A node that is lost or does not answer (its event loop is blocked) is
    left out of the timeline, named in its ``missing``, with a warning.
    """
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT):
            return True, await host.services[info.rank].call(endpoint, *args)
    except (ActorchError, TimeoutError) as exc:
        why = str(exc) if isinstance(exc, ActorchError) else f"no answer within {ANSWER_TIMEOUT:g} s"
        log.warning("trace part missing", node=host.rank, peer=info.rank, why=why)
        timeline.missing.append(info.rank)
        return False, None


def _live(host: TracingHost) -> list[NodeInfo]:
    return [info for info in host.peers() if info.rank not in host.lost]


async def _write(host: TracingHost, nodes: list[NodeInfo], timeline: Timeline) -> None:
    """Stop every traced node, read the clocks of those on other machines, merge and write the file (atomically)."""
    me = next((info for info in nodes if info.rank == host.rank), None)
    parts: list[NodePart] = []
    for info in nodes:
        answered, found = await _ask(host, info, timeline, ServiceEndpoints.trace_stop)
        if not answered or found is None:
            continue
        same = _same_clock(me, info)
        probes: list[ClockProbe] = []
        for _ in range(0 if same else PROBES):
            sent = time.perf_counter_ns()
            answered, remote = await _ask(host, info, timeline, ServiceEndpoints.trace_clock)
            if not answered:
                break
            probes.append(ClockProbe(sent, remote, time.perf_counter_ns()))
        if not same and not probes:
            continue  # its part cannot be put on this node's clock
        parts.append(NodePart(info.rank, info.host, info.pid, found["events"], found["dropped"], same, probes))
    meta = {"traced_from": host.rank, "sample": timeline.settings.sample, "missing": timeline.missing}
    timeline.events = sum(len(part.events) for part in parts)
    timeline.dropped = sum(part.dropped for part in parts)
    # Off the loop: a long trace takes seconds to merge and write, while the node keeps serving.
    await asyncio.to_thread(_merge_and_write, parts, host.rank, meta, timeline.path)
    if timeline.dropped:
        log.warning(
            "trace kept only max_events per node", node=host.rank, dropped=timeline.dropped, path=str(timeline.path)
        )


def _same_clock(me: NodeInfo | None, other: NodeInfo) -> bool:
    """Whether ``other`` reads the same monotonic clock as this node: the same machine (boot) or the same process."""
    if me is None or me.rank == other.rank:
        return True
    if me.process is not None and other.process is not None:
        return me.process.partition("/")[0] == other.process.partition("/")[0]
    return me.host == other.host and me.pid == other.pid


def _merge_and_write(parts: list[NodePart], reference: int, meta: dict[str, Any], path: Path) -> None:
    """Align the parts' clocks to node ``reference``'s, merge them and write the document to ``path``."""
    align(parts, reference=reference)
    _write_json(path, merge(parts, meta=meta))


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` whole or not at all (a reader never sees half a file)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(document, file, separators=(",", ":"))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as open() would have made it, not mkstemp's owner-only
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
