"""The transport interface: moving bundles of opaque messages between ranks.

A transport moves opaque messages (bytes plus the tensors they reference) between
ranks. Messages sent to one destination during one loop iteration leave as one
bundle, in order; the receiver gets them in that order. Each received bundle comes
with a ``Port``: replies put there within a short hold travel back on the
bundle's own response, which is much cheaper than a message of their own. Nothing
above this layer knows which kind of transport runs (``kinds`` lists them); only
the ``torch_rpc`` package touches torch RPC. What only some transports can do
(elastic membership, torch's RRefs and store, a fast lane) is not here but in
``capabilities``, one protocol each.

Every kind keeps the same promises, which ``tests/transport/test_conformance.py``
checks of each: the bundles of one link arrive in the order they were sent;
replies put on a received bundle's port come back; a peer's loss is reported
once, and a peer that left on purpose (``forget``) never; what a node sends
that the transport does not know (a stranger, a forgotten or lost node) is not
taken as a peer's; ``backlog`` counts what a peer has not taken until it does;
tensors arrive bitwise as they were sent.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from actorch._base.channels.route import TensorRoute
from actorch._base.errors import UnsupportedError
from actorch._base.resources import node_resources
from actorch._transport.autograd import NO_CONTEXT

__all__ = ["PORT_HOLD", "Bundle", "NodeInfo", "NodeTraits", "Port", "Transport"]

Bundle = tuple[list[bytes], dict[int, list[torch.Tensor]]]
"""Messages in send order, and the tensors of those that have any, by index."""

PORT_HOLD = 0.002
"""Seconds a bundle's response waits for replies before it leaves with those ready."""

LostFn = Callable[[int, str], None]


class Port:
    """Collects replies to one received bundle, to send them back on the bundle's response.

    The port stays open while replies are expected (``expect``/``put``) and at
    most ``PORT_HOLD`` seconds; then ``complete`` gets the replies gathered, and
    later replies go as messages of their own. A reply that finds the hold
    passed (the loop was busy and the timer could not run) closes the port and
    leaves with it at once, so replies are never held behind a long queue. A
    bundle sent inside a distributed autograd context (``autograd`` is its
    context id) holds one call, and its port waits for that reply without a
    time limit: only a reply on the bundle's own response keeps its autograd link.
    """

    __slots__ = ("_complete", "_loop", "_timer", "autograd", "closed", "replies", "waiting")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, complete: Callable[[Bundle], None], autograd: int = NO_CONTEXT
    ) -> None:
        self._loop = loop
        self._complete = complete
        self.autograd = autograd
        self.replies: Bundle = ([], {})
        self.waiting = 1  # held until the whole bundle has been dispatched
        self.closed = False
        self._timer = None if autograd != NO_CONTEXT else loop.call_later(PORT_HOLD, self.close)

    def __repr__(self) -> str:
        return f"<Port waiting={self.waiting} replies={len(self.replies[0])} closed={self.closed}>"

    def expect(self) -> None:
        """Count one more reply to wait for."""
        self.waiting += 1

    def hold(self, seconds: float) -> None:
        """Keep the port open up to ``seconds`` from now, for a reply known to take longer (a batched endpoint's).

        It still closes as soon as every expected reply is in.
        """
        timer = self._timer
        if self.closed or timer is None:
            return
        deadline = self._loop.time() + seconds
        if deadline > timer.when():
            timer.cancel()
            self._timer = self._loop.call_at(deadline, self.close)

    def release(self) -> None:
        """One awaited reply will not come through this port (or dispatch is done)."""
        self.waiting -= 1
        if self.waiting == 0:
            self.close()  # every expected reply is in: nothing to wait for

    def put(self, message: bytes, tensors: list[torch.Tensor] | None) -> bool:
        """Add a reply; False if the port has closed (send it on its own then)."""
        if self.closed:
            return False
        messages, by_index = self.replies
        if tensors:
            by_index[len(messages)] = tensors
        messages.append(message)
        timer = self._timer
        if timer is not None and self._loop.time() >= timer.when():
            self.close()  # the hold is over: this reply leaves now, with those gathered
        else:
            self.release()
        return True

    def close(self) -> None:
        """Send the replies gathered so far back on the bundle's response."""
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._complete(self.replies)


ReceiveFn = Callable[[int, Bundle, Port | None], None]


@dataclass(frozen=True)
class NodeInfo:
    """One node of the system, as ``system.nodes`` lists it and ``actorch status`` shows it.

    Attributes:
        rank: Its rank (0 runs ``main``).
        name: Its worker name (``node<rank>``).
        host: The host name of its machine.
        pid: Its process id.
        devices: Its accelerator devices (``("cuda:0", "cuda:1")``), empty without a GPU.
        label: The name it was given when it joined (``actorch.serve(name=...)``) or was
            added (``add_nodes(label=...)``), if any; placement can ask for it.
        resources: What it offers actors: ``cpus``, ``memory`` (bytes) and ``gpus`` as
            detected, with the counts its launcher declared over them (``{"env_slots": 4}``).
        owner: The actor whose own process this node is (``Where(process="own")``), if any.
        parent: The rank of the node that started its process (``add_nodes``), if one did;
            ``actorch status`` shows it as "started by node <parent>".
        pool: Whether it is a host agent (``actorch serve --pool``): a node that starts
            node processes on its host when ``add_nodes`` asks, shown as such by ``actorch status``.
        lane: The runtime's own: where the node's fast lane listens (``host:port``), if it
            has one. Nodes read it to connect to each other; left out of the repr.
        process: The runtime's own: the node's process as its machine's kernel knows it
            (boot id and start time), so that a node on the same machine can look at it
            directly; None where the kernel does not say. Left out of the repr.
        reach: The runtime's own: where the node's tensor channels reach (its host's
            shared memory, its GPUs), which a sender compares with its own to choose
            a channel (``channels.plane.own_reach``). Left out of the repr.
    """

    rank: int
    name: str
    host: str
    pid: int
    devices: tuple[str, ...] = ()
    label: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict, hash=False)
    owner: str | None = None
    parent: int | None = None
    pool: bool = False
    lane: str | None = field(default=None, repr=False)
    process: str | None = field(default=None, repr=False)
    reach: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False, compare=False)


@dataclass(frozen=True)
class NodeTraits:
    """What a node says of itself when it meets the others, beyond where it runs (see ``NodeInfo``).

    ``resources`` holds the declared amounts only; the transport adds what the node detects.
    """

    label: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict, hash=False)
    owner: str | None = None
    parent: int | None = None
    pool: bool = False

    def info(self, rank: int, host: str, pid: int, devices: tuple[str, ...], lane: str | None = None) -> NodeInfo:
        """This node as node ``rank`` of the world, its detected resources filled in (its fast lane at ``lane``)."""
        resources = node_resources(devices, self.resources)
        name = f"node{rank}"
        return NodeInfo(rank, name, host, pid, devices, self.label, resources, self.owner, self.parent, self.pool, lane)


class Transport(ABC):
    """Moves message bundles between ranks; implementations differ in how.

    Subclasses implement :meth:`_send_bundle`, :meth:`start`, :meth:`close` and
    :meth:`peers`; everything runs on the node's loop except where a method says
    otherwise. Capabilities beyond these are protocols of their own (``capabilities``).
    """

    rank: int
    world_size: int
    paths: tuple[str, ...] = ()
    """The paths its bundles take, as the byte counters name them (``lane``, ``torch_rpc``, ``in_process``)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._receive: ReceiveFn | None = None
        self._lost: LostFn | None = None
        self._outgoing: dict[int, Bundle] = {}
        self._queued: dict[int, int] = {}  # bytes of ``_outgoing``, by destination
        self._flush_scheduled = False
        self.bundles_sent = 0
        self.messages_sent = 0
        self.bytes_sent: dict[int, int] = {}
        """Bytes of message envelopes and bodies sent in bundles, by destination rank (not the tensors)."""
        self.tensor_bytes_sent: dict[int, int] = {}
        """Bytes of tensor data sent in bundles, by destination rank: a tensor shared by messages of one bundle once.

        Replies on a bundle's response are not counted.
        """
        self.bytes_sent_by_path = dict.fromkeys(self.paths, 0)
        """Bytes of message envelopes and bodies sent, by the path they took (replies on a bundle's response too)."""
        self.bytes_received_by_path = dict.fromkeys(self.paths, 0)
        """Bytes of message envelopes and bodies received, by the path they came on (not the tensors)."""
        self.lost_in_thread: LostFn | None = None
        """Called from the transport's own threads the moment a peer is seen lost, before the loop hears.

        For what must happen even when the event loop is stuck (a watchdog).
        """
        self.on_joined: Callable[[NodeInfo], None] | None = None
        """Called on the loop when a node joins the world (``Elastic`` worlds only)."""
        self.off_loop: Callable[[str], Any] | None = None
        """Answers another node's question (``ask_off_loop``) on a transport thread, never on the loop.

        For what must be answered even when the event loop is blocked (``actorch stacks``).
        """
        self.traits = NodeTraits()
        """What this node says of itself to the others (label, declared resources...); set before ``start``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank={self.rank}/{self.world_size}>"

    def attach(self, loop: asyncio.AbstractEventLoop, receive: ReceiveFn, lost: LostFn) -> None:
        """Route incoming bundles to ``receive(src, bundle, port)`` and peer loss to ``lost(rank, why)``."""
        self._loop = loop
        self._receive = receive
        self._lost = lost

    @abstractmethod
    async def start(self) -> None:
        """Join the world; return when every peer can be reached."""

    @abstractmethod
    async def close(self) -> None:
        """Leave the world at once; pending sends may be dropped."""

    @abstractmethod
    def peers(self) -> list[NodeInfo]:
        """Every rank of the world, this one included, by rank."""

    def peer(self, rank: int) -> NodeInfo:
        """Node ``rank``'s host, pid and devices (``KeyError`` if it is not a node of the world)."""
        for info in self.peers():
            if info.rank == rank:
                return info
        raise KeyError(rank)

    def knows(self, rank: int) -> bool:
        """Whether ``rank`` is another node of the world, one this node takes messages from."""
        return rank != self.rank and 0 <= rank < self.world_size

    def forget(self, rank: int) -> None:  # noqa: B027 - a static world has nothing to forget
        """Node ``rank`` left the world on purpose: nothing more goes to or comes from it."""

    def backlog(self, dest: int) -> int:
        """Bytes sent toward ``dest`` that it has not taken yet: here, those queued for this loop iteration's bundle."""
        return self._queued.get(dest, 0)

    def route(self, dest: int) -> TensorRoute | None:
        """How tensors reach ``dest`` (which accelerator devices go directly); None: they stay in this process."""
        return None

    def path(self, dest: int, tensors: bool) -> str:
        """The path a message to ``dest`` takes (with ``tensors`` of its own or not): one of ``paths``, for a trace.

        A transport of one path takes it for everything; one of several says which.
        """
        return self.paths[0] if self.paths else "none"

    def ask_off_loop(self, rank: int, question: str, timeout: float) -> Any:
        """Node ``rank``'s ``off_loop`` answer to ``question``, served there by a thread that needs no loop.

        Blocks up to ``timeout`` seconds: call it from a thread of its own,
        never the loop. Raises ``UnsupportedError`` where the transport cannot
        reach another node's threads; ``OSError`` or ``RuntimeError`` when it did
        not answer.
        """
        raise UnsupportedError(f"{type(self).__name__} cannot ask node {rank} off its event loop")

    def carry(self, dest: int, bundle: Bundle, in_context: bool = False) -> str | None:
        """Send one bundle to ``dest`` now, as it is (never blocks): for a transport that wraps this one.

        The wrapper batched it and counts it; this one only carries it. Returns
        the path it took (one of ``paths``), None if it went nowhere.
        """
        return self._send_bundle(dest, bundle, in_context)

    @abstractmethod
    def _send_bundle(self, dest: int, bundle: Bundle, in_context: bool) -> str | None:
        """Send one bundle to ``dest`` (never blocks); report failure through ``lost``.

        ``in_context``: it leaves in the thread's distributed autograd context
        (one call made in it); any other bundle mixes messages of any context.
        Returns the path it took (one of ``paths``), None if it went nowhere.
        """

    def send(self, dest: int, message: bytes, tensors: list[torch.Tensor] | None = None) -> None:
        """Queue ``message`` for ``dest``; it leaves with the others of this loop iteration."""
        bundle = self._outgoing.get(dest)
        if bundle is None:
            bundle = self._outgoing[dest] = ([], {})
        size = len(message)
        if tensors:
            bundle[1][len(bundle[0])] = tensors
            size += sum(getattr(tensor, "nbytes", 0) for tensor in tensors)
        bundle[0].append(message)
        self._queued[dest] = self._queued.get(dest, 0) + size
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None, "transport used before attach()"
            self._loop.call_soon(self._flush)

    def send_alone(self, dest: int, message: bytes, tensors: list[torch.Tensor] | None = None) -> None:
        """Send ``message`` to ``dest`` now, in a bundle of its own, after what is queued for ``dest``.

        For a call inside a distributed autograd context: its reply must ride
        its own bundle's response, and the bundle leaves in the thread's context.
        """
        queued = self._outgoing.pop(dest, None)
        if queued is not None:
            self._queued.pop(dest, None)
            self._dispatch(dest, queued)
        self._dispatch(dest, ([message], {0: tensors} if tensors else {}), in_context=True)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outgoing, self._outgoing = self._outgoing, {}
        self._queued.clear()
        for dest, bundle in outgoing.items():
            self._dispatch(dest, bundle)

    def _dispatch(self, dest: int, bundle: Bundle, *, in_context: bool = False) -> None:
        messages, tensors = bundle
        self.bundles_sent += 1
        self.messages_sent += len(messages)
        size = sum(map(len, messages))
        self.bytes_sent[dest] = self.bytes_sent.get(dest, 0) + size
        if tensors:
            # A tensor object that several messages of the bundle share is pickled, and sent, once.
            distinct = {id(tensor): tensor for side in tensors.values() for tensor in side}
            tensor_size = sum(getattr(tensor, "nbytes", 0) for tensor in distinct.values())  # side lists hold RRefs too
            self.tensor_bytes_sent[dest] = self.tensor_bytes_sent.get(dest, 0) + tensor_size
        path = self._send_bundle(dest, bundle, in_context)
        if path is not None:
            by_path = self.bytes_sent_by_path
            by_path[path] = by_path.get(path, 0) + size

    def reply(self, dest: int, port: Port | None, message: bytes, tensors: list[torch.Tensor] | None) -> None:
        """Send a reply to ``dest``: on the bundle's response if its port is open and takes it, else on its own."""
        if port is not None:
            port = self.port_for(port, tensors)
        if port is None or not port.put(message, tensors):
            self.send(dest, message, tensors)

    def port_for(self, port: Port | None, tensors: list[torch.Tensor] | None) -> Port | None:
        """The port a reply with ``tensors`` may ride: ``port``, or None (released) where it cannot carry them."""
        return port

    def _report_lost(self, rank: int, why: str) -> None:
        if self._lost is not None:
            self._lost(rank, why)
