"""``ActorSystem.trace``: record a timeline on every node of the system and write it as one file.

The node that traces asks every node's service to start recording, and when
the block ends, reads each node's clock (round trips, for nodes on other
machines), stops every node, merges their parts (``timeline``) and writes the
file: Chrome Trace Event JSON, which ui.perfetto.dev and chrome://tracing
open. Nodes that join while it runs are not traced; a node lost meanwhile is
named in the file's metadata, its part missing.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from actorch._actors.node.service import NodeService
from actorch._base.errors import ActorchError
from actorch._engine.timeline import ClockProbe, NodePart, Timeline, align, merge
from actorch._engine.tracing import TraceSettings
from actorch._transport.base import NodeInfo

if TYPE_CHECKING:
    from actorch._actors.node.host import ActorHost
    from actorch._actors.ref import ActorRef

__all__ = ["PROBES", "record_timeline"]

log = structlog.get_logger("actorch")

PROBES = 5
"""Round trips that read the clock of a node on another machine; the shortest gives its offset."""


@asynccontextmanager
async def record_timeline(
    host: ActorHost, path: str | os.PathLike[str], settings: TraceSettings
) -> AsyncIterator[Timeline]:
    """Record a timeline of every node while the block runs, then write it to ``path`` (see ``ActorSystem.trace``).

    Raises:
        RuntimeError: A trace is already being recorded on this node.
        OSError: ``path``'s directory does not exist or cannot be written (checked before recording starts).
    """
    target = Path(path)
    if host.node.trace is not None:
        raise RuntimeError(f"node {host.rank} already records a trace: one trace at a time")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot write a trace to {target}: {target.parent} is not a directory")
    timeline = Timeline(target, settings)
    # This node starts last and stops first, so that the trace's own calls stay out of it.
    nodes = sorted(_live(host), key=lambda info: info.rank == host.rank)
    started: list[NodeInfo] = []
    try:
        for info in nodes:
            await host.services[info.rank].call(NodeService.trace_start, settings.sample, settings.max_events)
            started.append(info)
        yield timeline
    finally:
        await _write(host, started[::-1], timeline)


def _live(host: ActorHost) -> list[NodeInfo]:
    node = host.node
    return [info for info in node.transport.peers() if info.rank not in node.lost]


async def _write(host: ActorHost, nodes: list[NodeInfo], timeline: Timeline) -> None:
    """Stop every traced node, read the clocks of those on other machines, merge and write the file (atomically)."""
    me = next((info for info in nodes if info.rank == host.rank), None)
    parts: list[NodePart] = []
    for info in nodes:
        service = host.services[info.rank]
        try:
            found = await service.call(NodeService.trace_stop)
            same = _same_clock(me, info)
            probes = [] if same else [await _probe(service) for _ in range(PROBES)]
        except ActorchError as exc:
            log.warning("trace part missing", node=host.rank, peer=info.rank, why=str(exc))
            timeline.lost.append(info.rank)
            continue
        if found is None:
            continue
        parts.append(NodePart(info.rank, info.host, info.pid, found["events"], found["dropped"], same, probes))
    align(parts, reference=host.rank)
    meta = {"traced_from": host.rank, "sample": timeline.settings.sample, "lost": timeline.lost}
    document = merge(parts, meta=meta)
    timeline.events = sum(len(part.events) for part in parts)
    timeline.dropped = sum(part.dropped for part in parts)
    _write_json(timeline.path, document)
    if timeline.dropped:
        log.warning(
            "trace kept only max_events per node", node=host.rank, dropped=timeline.dropped, path=str(timeline.path)
        )


async def _probe(service: ActorRef[NodeService]) -> ClockProbe:
    sent = time.perf_counter_ns()
    remote = await service.call(NodeService.trace_clock)
    return ClockProbe(sent, remote, time.perf_counter_ns())


def _same_clock(me: NodeInfo | None, other: NodeInfo) -> bool:
    """Whether ``other`` reads the same monotonic clock as this node: the same machine (boot) or the same process."""
    if me is None or me.rank == other.rank:
        return True
    if me.process is not None and other.process is not None:
        return me.process.partition("/")[0] == other.process.partition("/")[0]
    return me.host == other.host and me.pid == other.pid


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
