"""The node: one per process, composing the message engine of its actors.

A :class:`Node` keeps its actors' cells and its view of its peers. It composes
a :class:`~actorch._engine.caller.Caller` (the calls this node sends and their
replies), a :class:`~actorch._engine.callee.Callee` (the calls it receives and
their answers), a :class:`~actorch._engine.flow.FlowControl` (how many
messages it may have waiting at one actor) and its
:class:`~actorch._engine.instruments.Instruments` (what observes its
messages: the metrics always, spans when on, a timeline while a trace runs),
routes what the transport brings to them, hears of peers that join, leave or
are lost, and closes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog
import torch

from actorch._base.channels.cuda_ipc import CudaIpcChannel
from actorch._base.channels.leases import use_pool_limit
from actorch._base.channels.plane import DataPlane
from actorch._base.channels.shm import SharedMemoryChannel
from actorch._base.codec import Codec
from actorch._base.config import SystemConfig
from actorch._base.errors import SystemClosedError
from actorch._base.names import actor_label
from actorch._base.record import RecordedLog, RunRecord
from actorch._engine.callee import Callee
from actorch._engine.caller import Caller
from actorch._engine.cell import Cell, FailureListener
from actorch._engine.endpoints import Endpoint
from actorch._engine.flow import FlowControl
from actorch._engine.instruments import Instruments
from actorch._engine.looplag import LoopLag
from actorch._engine.metrics import Metrics
from actorch._engine.side import SideParts
from actorch._engine.stacks import loop_stacks, running_handler, thread_stacks
from actorch._engine.streaming import Streams
from actorch._engine.system_ids import SYSTEM_IDS
from actorch._engine.tracing import NodeTrace, TraceSettings, Tracing
from actorch._engine.wire import CALL, CANCEL, CAST, CLOSE, CREDIT, END, ITEM, MORE, REPLY, STREAM, TELL
from actorch._transport.base import Bundle, NodeInfo, Port, Transport
from actorch._transport.capabilities import fast_lane_of

if TYPE_CHECKING:
    from actorch._engine.otel import NodeTelemetry

__all__ = ["Node", "describe_ranks"]

_KEY_BITS = 48


log = structlog.get_logger("actorch")


def describe_ranks(ranks: list[int]) -> str:
    """Ranks for a message: ``0..3`` when they run without a gap, else ``0, 1, 4``."""
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks))


class Node:
    """Hosts this process's actors and carries their calls to and from other nodes."""

    def __init__(self, transport: Transport, config: SystemConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.rank = transport.rank
        # OpenTelemetry spans, when the system makes them: first, so that a missing extra fails before anything opens
        otel = _telemetry(self.rank) if config.otel else None
        self.transport = transport
        self.loop = loop
        self.lost: dict[int, str] = {}  # peers gone for good (lost, or left after saying so), with why
        self.left: set[int] = set()  # peers that said they leave: once gone, their calls end in ActorStoppedError
        self.closed = False
        self.departing = False  # set once shutdown starts: peers leaving is expected
        bound = log.bind(node=self.rank)
        self.record = _open_record(config.run_record, self.rank)
        if self.record is not None and self.record.failed is not None:
            bound.warning("run record not kept", why=self.record.failed)
            self.record = None
        self.log: Any = bound if self.record is None else RecordedLog(bound, self.record)
        # What observes this node's messages: the metrics always (actorch status reads them), spans when on.
        self.instruments = Instruments(self.rank, self.log, transport.path)
        self.instruments.add(Metrics())
        if otel is not None:
            self.instruments.add(otel)
        self._tracing: Tracing | None = None  # while a timeline is recorded (``start_trace``)
        self.messages_refused = 0
        self.bytes_received = 0  # message envelopes and bodies taken from peers (not their tensors)
        self._cells: dict[int, Cell] = {}
        self._actor_ids = itertools.count(SYSTEM_IDS + 1)
        self._keys = itertools.count(1)
        self._key_base = self.rank << _KEY_BITS
        self._lost_listeners: list[Callable[[int, str], None]] = []
        self._joined_listeners: list[Callable[[NodeInfo], None]] = []
        self._failure_listener: FailureListener | None = None
        self._refused_from: set[int] = set()
        self.plane = _data_plane(config, bound)
        codec = Codec(strict=config.strict, plane=self.plane)
        self._decode_plain = codec.decode_plain
        self._pack = codec.encode_plain
        self.flow = FlowControl(loop, self.rank, config.mailbox_size, self._send_credits, exempt=SYSTEM_IDS)
        parts = SideParts(
            transport,
            codec,
            self.flow,
            self._cells,
            self.lost,
            self.left,
            loop,
            self.log,
            self.new_key,
            config.max_message_size,
            config.send_budget,
            self.instruments,
        )
        self.caller = Caller(parts)
        self.callee = Callee(parts, decode_context=self.caller)
        self.streams = Streams(parts, decode_context=self.caller)
        self.caller.streams = self.streams
        transport.attach(loop, self._receive, self._on_peer_lost)
        transport.on_joined = self._on_peer_joined
        transport.off_loop = self.answer_off_loop
        self.loop_lag = LoopLag(loop)
        self.loop_lag.start()

    def __repr__(self) -> str:
        return f"<Node rank={self.rank}/{self.world_size} actors={len(self._cells)}>"

    @property
    def world_size(self) -> int:
        """How many nodes the world has now (it changes as nodes join and leave an elastic world)."""
        return self.transport.world_size

    # ------------------------------------------------------------------ instruments

    @property
    def trace(self) -> NodeTrace | None:
        """What this node records of the timeline being recorded, if one is (``start_trace``)."""
        return None if self._tracing is None else self._tracing.trace

    def start_trace(self, settings: TraceSettings) -> None:
        """Record this node's calls, tells, handler runs and mailbox waits from now on (anew if it already did)."""
        self.stop_trace()
        self._tracing = Tracing(NodeTrace(self.rank, settings))
        self.instruments.add(self._tracing)

    def stop_trace(self) -> dict[str, Any] | None:
        """Stop recording: what was recorded (see ``NodeTrace.finish``), or None if no trace ran."""
        tracing, self._tracing = self._tracing, None
        if tracing is None:
            return None
        if tracing in self.instruments:  # else it failed, and was removed: what it kept is still the timeline's
            self.instruments.remove(tracing)
        return tracing.trace.finish()

    # ------------------------------------------------------------------ actors

    def add_actor(
        self,
        instance: object,
        endpoints: Mapping[str, Endpoint],
        *,
        name: str | None,
        max_concurrency: int,
        actor_id: int | None = None,
        device: torch.device | None = None,
    ) -> Cell:
        """Host ``instance`` and return its cell; its id is ``actor_id`` (a system actor's) or the next free one.

        ``device`` is the actor's accelerator device (None: the CPU).
        """
        if self.closed:
            raise SystemClosedError(f"node {self.rank} is shut down")
        if actor_id is None:
            actor_id = next(self._actor_ids)
        elif not 0 < actor_id <= SYSTEM_IDS or actor_id in self._cells:
            raise ValueError(f"actor id {actor_id} is not a free system id")
        cell = Cell(
            actor_id,
            instance,
            endpoints,
            label=actor_label(name, type(instance).__name__, actor_id, self.rank),
            name=name,
            max_concurrency=max_concurrency,
            loop=self.loop,
            log=self.log,
            new_key=self.new_key,
            on_fatal=self._actor_failed,
            device=None if device is None or device.type == "cpu" else device,
            node=self.rank,
            instruments=self.instruments,
        )
        self._cells[actor_id] = cell
        return cell

    def cell(self, actor_id: int) -> Cell | None:
        """The cell of a local actor, or None if it is not (or no longer) here."""
        return self._cells.get(actor_id)

    def cells(self) -> list[Cell]:
        """Every actor hosted here."""
        return list(self._cells.values())

    def remove_actor(self, cell: Cell) -> None:
        """Stop hosting ``cell``: later calls to it fail with ``ActorStoppedError``."""
        cell.refuse_all()
        self._cells.pop(cell.actor_id, None)

    def on_actor_failed(self, listener: FailureListener) -> None:
        """Call ``listener(cell, error, cancelled)`` when a handler raises an error its class declares fatal."""
        self._failure_listener = listener

    def _actor_failed(self, cell: Cell, error: BaseException, cancelled: list[asyncio.Task[Any]]) -> None:
        if self._failure_listener is not None:
            self._failure_listener(cell, error, cancelled)

    def new_key(self) -> int:
        """A key for a message, unique in the whole system."""
        return self._key_base | next(self._keys)

    def answer_off_loop(self, question: str) -> dict[str, Any]:
        """What a thread can say of this node without its loop: its loop's state, and with ``stacks`` where it is.

        ``running`` is the handler on the loop's thread now, if any
        (``running_handler``): what blocks a loop that does not answer.

        Answers ``Transport.ask_off_loop`` on a transport thread (``actorch
        stacks``); the loop may be blocked meanwhile. ``stacks`` adds each
        actor's running handlers as await chains, the loop's other tasks and
        every thread's stack (``stacks``).
        """
        answer: dict[str, Any] = {
            "rank": self.rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "loop": self.loop_lag.snapshot(),
            "running": running_handler(self.cells(), self.loop),
        }
        if question == "stacks":
            actors, tasks = loop_stacks(self.cells(), self.loop, skip_ids=SYSTEM_IDS)
            answer.update(actors=actors, tasks=tasks, threads=thread_stacks(getattr(self.loop, "_thread_id", None)))
        return answer

    # ------------------------------------------------------------------ messages in

    def _receive(self, src: int, bundle: Bundle, port: Port | None) -> None:
        """Take a bundle that came from ``src``: refuse it from a lost or unknown node, else route each message."""
        messages, tensors = bundle
        if src in self.lost or not self.transport.knows(src):
            self._refuse(src, len(messages))
            if port is not None:
                port.release()
            return
        callee, caller = self.callee, self.caller
        self.bytes_received += sum(map(len, messages))
        for index, raw in enumerate(messages):
            try:
                message = self._decode_plain(raw)
                kind = message[0]
                if kind == REPLY:
                    caller.on_reply(message, tensors.get(index, []))
                elif kind in (CALL, TELL):
                    callee.on_call(src, message, tensors.get(index, []), port)
                elif kind == CREDIT:
                    self.flow.credited(src, message[1])
                else:
                    self._route_other(src, kind, message, tensors.get(index, []), port)
            except Exception:
                self.log.exception("malformed message dropped", src=src)
        if port is not None:
            port.release()

    def _route_other(self, src: int, kind: int, message: list[Any], tensors: list[Any], port: Port | None) -> None:
        """Route a message that is not a call, tell, reply or credit: a cancel, a stream's, a multicast."""
        streams = self.streams
        if kind == ITEM:
            streams.on_item(src, message, tensors)
        elif kind == MORE:
            streams.on_more(src, message[1], message[2])
        elif kind == CANCEL:
            self.callee.on_cancel(src, message[1])
        elif kind == STREAM:
            streams.on_open(src, message, tensors, port)
        elif kind == END:
            streams.on_end(src, message)
        elif kind == CLOSE:
            streams.on_close(src, message[1])
        elif kind == CAST:
            self.callee.on_cast(src, message, tensors, port)

    def _refuse(self, src: int, count: int) -> None:
        """Drop messages from a node that is lost (stale), unknown or ourselves; log once per node."""
        self.messages_refused += count
        if src not in self._refused_from:
            self._refused_from.add(src)
            why = self.lost.get(src) if src in self.lost else "not a node of this system"
            self.log.warning("messages refused from a lost or unknown node", src=src, count=count, why=why)

    def _send_credits(self, src: int, flat: list[int]) -> None:
        """Send ``src`` the credits of the tells of its that this node is done with."""
        if src not in self.lost and not self.closed:
            self.transport.send(src, self._pack([CREDIT, flat]))

    # ------------------------------------------------------------------ peers

    def peers(self) -> list[NodeInfo]:
        """Every node of the world, by rank (those that left are forgotten; lost ones stay)."""
        return self.transport.peers()

    def ranks(self) -> list[int]:
        """The ranks of every node of the world, by rank (lost ones too, not those that left)."""
        return [info.rank for info in self.transport.peers()]

    def on_peer_joined(self, listener: Callable[[NodeInfo], None]) -> None:
        """Call ``listener(info)`` when a node joins the world."""
        self._joined_listeners.append(listener)

    def _on_peer_joined(self, info: NodeInfo) -> None:
        if self.closed:
            return
        self.log.info("node joined", peer=info.rank, host=info.host, pid=info.pid, label=info.label)
        for listener in list(self._joined_listeners):
            listener(info)

    def peer_left(self, rank: int) -> None:
        """Node ``rank`` said it has left: once it is gone, what waits for it fails with ``ActorStoppedError``."""
        self.left.add(rank)

    def on_peer_lost(self, listener: Callable[[int, str], None]) -> None:
        """Call ``listener(rank, why)`` when a peer node is lost."""
        self._lost_listeners.append(listener)

    def _on_peer_lost(self, rank: int, why: str) -> None:
        if rank in self.lost:
            return
        try:
            reach = self.transport.peer(rank).reach
        except KeyError:
            reach = {}
        self.plane.forget(rank, reach)  # what it held of this node's comes back; its shared memory goes
        left = rank in self.left
        if left:
            why = "left the system"
            self.transport.forget(rank)
        self.lost[rank] = why
        if self.closed or self.departing or left:
            self.log.debug("node left", peer=rank, why=why)
        elif self._tells_losses():
            self.log.warning("node lost", peer=rank, why=why)
        else:
            self.log.debug("node lost", peer=rank, why=why)
        self.flow.fail_rank(rank, lambda: self.caller.unreachable(rank, "cannot wait for room in a mailbox there"))
        self.caller.fail_rank(rank, why)
        self.streams.fail_rank(rank, why)
        self.callee.cancel_from(rank)  # their caller is gone: nobody waits for these handlers
        for listener in list(self._lost_listeners):
            listener(rank, why)

    def _tells_losses(self) -> bool:
        """Whether this node is the lowest live rank it knows, the one node that logs a loss as a warning.

        Every node that counts a peer lost logs it; one warning per loss is
        enough for the whole system (rank 0, unless it is the one lost), the
        others log it at debug level.
        """
        live = [rank for rank in self.ranks() if rank not in self.lost and rank not in self.left]
        return all(rank >= self.rank for rank in live)

    def cut_off(self) -> None:
        """Stop sending, as if this node's process had died (for in-process test worlds)."""
        self.closed = True
        self.loop_lag.stop()
        self.caller.closed = True
        self.callee.close()
        self.streams.close()

    async def close(self) -> None:
        """Fail every pending call, cancel running handlers and leave the transport."""
        if self.closed:
            return
        self.closed = True
        self.loop_lag.stop()
        self.flow.close(lambda: SystemClosedError(f"node {self.rank} shut down while waiting for room in a mailbox"))
        self.caller.close()
        self.callee.close()
        self.streams.close()
        tasks = [task for cell in self._cells.values() for task in cell.tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await self.transport.close()
        self.plane.close()
        if self.record is not None:
            self.record.write("node closed")
            self.record.close()

    def statistics(self) -> dict[str, Any]:
        """Calls and tells sent and received, messages refused, calls pending or waiting for room, actors, bytes.

        Bytes are those of message envelopes and bodies, sent and received;
        tensor bytes sent apart from them, on any channel (the transport's
        path, shared memory, CUDA IPC, staged), are counted apart
        (``tensor_bytes_sent``; a small tensor inside its message is counted in
        the message's bytes).
        ``lane_bundles_sent`` counts the bundles that went on the fast lane.
        ``paths``: by path a bundle takes (``lane``, ``torch_rpc``,
        ``in_process``), its ``bytes_sent`` (replies on a bundle's response
        too) and ``bytes_received``. ``channels``: by tensor channel, the
        tensors it carried to other processes and their bytes, with its own
        counts (the shared-memory pool's segments, lends, and the tensors that
        went by value for want of room).
        """
        transport = self.transport
        sent, received = transport.bytes_sent_by_path, transport.bytes_received_by_path
        return {
            "paths": {
                path: {"bytes_sent": sent.get(path, 0), "bytes_received": received.get(path, 0)}
                for path in sorted({*sent, *received})
            },
            "bytes_sent": sum(transport.bytes_sent.values()),
            "tensor_bytes_sent": sum(self.plane.sent_to.values()),
            "lane_bundles_sent": lane.lane_bundles_sent if (lane := fast_lane_of(transport)) is not None else 0,
            "bytes_received": self.bytes_received,
            "calls_sent": self.caller.calls_sent,
            "tells_sent": self.caller.tells_sent,
            "calls_received": self.callee.calls_received,
            "tells_received": self.callee.tells_received,
            "messages_refused": self.messages_refused,
            "pending_calls": len(self.caller.pending),
            "waiting_for_room": self.flow.waiting(),
            "actors": len(self._cells),
            "channels": self.plane.statistics(),
        }


def _data_plane(config: SystemConfig, log: Any) -> DataPlane:
    """The node's tensor channels, as the system allows them; the shared-memory one on this process's pool."""

    def warn(message: str) -> None:
        log.warning("shared memory refused", why=message)

    shm = SharedMemoryChannel(use_pool_limit(config.shm_pool), per_peer=config.send_budget, warn=warn)
    gpus = CudaIpcChannel() if torch.cuda.is_available() else None
    return DataPlane.standard(config.channels, shm=shm, cuda_ipc=gpus, strict=config.devices == "strict")


def _telemetry(rank: int) -> NodeTelemetry:
    """Node ``rank``'s OpenTelemetry spans; ``ImportError`` naming ``actorch[otel]`` if that is not installed."""
    from actorch._engine.otel import NodeTelemetry  # noqa: PLC0415 - the optional extra, imported only when on

    return NodeTelemetry(rank)


def _open_record(run: str | None, rank: int) -> RunRecord | None:
    """Node ``rank``'s record of run ``run`` (None: none kept); one that could not be opened says why in ``failed``."""
    if run is None:
        return None
    record = RunRecord(run, rank)
    try:
        return record.open()
    except OSError as exc:
        record.failed = f"run record {record.path} not opened: {exc}"
        return record
