"""The transport conformance suite's world: one kind of transport, four ranks, every promise of ``Transport`` checked.

``python conformance.py <kind>`` runs rank 0 here and drives the cases; ranks
1 to 3 are peers that answer what rank 0 asks (``Peer``): in this process
and loop for an in-process kind, else processes of their own that rebuild the
kind from its options record, sent to them as json. Each case prints one
``RESULT`` line (``tests/transport/test_conformance.py`` reads them). Rank 3
is forgotten and rank 2 killed, so those cases come last.

Messages between the driver and its peers are bytes: ``D<n>`` is data number
``n``, ``P...`` padding, anything starting ``{`` a command in json (``op``: ``echo``, ``report``,
``burst``, ``block``, ``leave``, ``impersonate``, ``exit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from actors import emit

from actorch._transport.base import Bundle, Port, Transport
from actorch._transport.capabilities import fast_lane_of, layers
from actorch._transport.faulty import FaultyTransport
from actorch._transport.inprocess import InProcess, InProcessHub
from actorch._transport.kinds import open_transport, options_from_json, options_to_json
from actorch._transport.network import listen_socket
from actorch._transport.torch_rpc.options import TorchRpc
from actorch._transport.world import WorldSpec

WORLD_SIZE = 4
ECHO, FORGOTTEN, VICTIM = 1, 3, 2  # the peer that answers, the one that leaves, the one killed
MESSAGES = 300
"""Data messages each way in the order cases."""
LIVENESS = 2.5
CASE_SECONDS = 30.0
BLOCK_SECONDS = 1.5

KINDS: dict[str, object] = {
    "in_process": InProcess(),
    "torch_rpc": TorchRpc(lane=False),
    "torch_rpc_lane": TorchRpc(),
    "faulty_in_process": FaultyTransport(InProcess()),
    "faulty_torch_rpc_lane": FaultyTransport(TorchRpc()),
}
"""Every kind the suite runs over, by the name the test gives it: a new kind is a line here."""


PADDING = b"P"
"""A message the peers take and do nothing with."""


def data(number: int) -> bytes:
    return b"D%d" % number


def command(op: str, **values: Any) -> bytes:
    return json.dumps({"op": op, **values}).encode()


def tensors_for(number: int) -> list[torch.Tensor] | None:
    """Every third data message carries a tensor of its own: its bundle takes the main path, the others the lane."""
    return [torch.full((4,), float(number))] if number % 3 == 0 else None


# ---------------------------------------------------------------------- the peers


@dataclass
class Peer:
    """A rank that answers the driver: echoes, reports what it saw, sends bursts, blocks its loop, leaves."""

    transport: Transport
    seen: dict[int, list[int]] = field(default_factory=dict)
    lost: list[tuple[int, str]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Future[Any]] = field(default_factory=set)

    def receive(self, src: int, bundle: Bundle, port: Port | None) -> None:
        messages, tensors = bundle
        for index, message in enumerate(messages):
            if message.startswith(b"D"):
                self.seen.setdefault(src, []).append(int(message[1:]))
            elif message.startswith(b"{"):
                self.obey(src, json.loads(message), message, tensors.get(index), port)
        if port is not None:
            port.release()

    def obey(self, src: int, order: dict[str, Any], raw: bytes, tensors: Any, port: Port | None) -> None:
        op, transport = order["op"], self.transport
        loop = asyncio.get_running_loop()
        if op == "echo":
            if port is not None:
                port.expect()
            transport.reply(src, port, raw, tensors)
        elif op == "report":
            transport.send(src, json.dumps({"seen": self.seen.get(src, [])}).encode())
        elif op == "burst":
            self.start(self.burst(src, order["n"]))
        elif op == "block":
            loop.call_soon(time.sleep, order["seconds"])  # the whole loop stops: nothing is taken meanwhile
        elif op == "leave":
            self.start(self.leave(src, order["after"], order["n"]))
        elif op == "impersonate":
            self.start(asyncio.to_thread(self.impersonate, src, order["rank"]))
        elif op == "exit":
            self.done.set()

    def start(self, work: Awaitable[Any]) -> None:
        """Run ``work`` on the loop, kept until it ends."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def burst(self, dest: int, count: int) -> None:
        for number in range(count):
            self.transport.send(dest, data(number), tensors_for(number))
            if number % 10 == 9:
                await asyncio.sleep(0)  # the next ten leave in another bundle

    async def leave(self, dest: int, after: float, count: int) -> None:
        """Send ``count`` bundles after ``after`` seconds (the driver forgot this rank meanwhile), then leave."""
        await asyncio.sleep(after)
        for number in range(count):
            self.transport.send(dest, data(number))
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        self.done.set()

    def impersonate(self, dest: int, rank: int) -> None:
        """Send ``dest`` a bundle that claims to be from ``rank`` on torch RPC (in a thread), and say the answer."""
        from torch.distributed import rpc  # noqa: PLC0415, TID251 - a stranger speaks torch RPC's own protocol

        from actorch._transport.torch_rpc import rpc as torch_rpc  # noqa: PLC0415

        answer = rpc.rpc_sync(torch_rpc.worker_name(dest), torch_rpc._inbound, args=(rank, 0, [data(7)], {}))
        self.transport.send(dest, json.dumps({"impersonated": answer}).encode())

    def on_lost(self, rank: int, why: str) -> None:
        self.lost.append((rank, why))
        if rank == 0:
            self.done.set()


def serve_peer(rank: int, port: int, record: str) -> None:
    """A peer process: rebuild the kind from its json record, join, and answer until told to exit."""

    async def serve() -> None:
        options = options_from_json(json.loads(record))
        transport = open_transport(WorldSpec(rank, WORLD_SIZE, "127.0.0.1", port, liveness_timeout=LIVENESS), options)
        peer = Peer(transport)
        transport.attach(asyncio.get_running_loop(), peer.receive, peer.on_lost)
        await transport.start()
        await peer.done.wait()
        await transport.close()

    asyncio.run(serve())
    os._exit(0)


# ---------------------------------------------------------------------- the driver


@dataclass
class Delivery:
    """A bundle rank 0 took: from whom, what, and whether its transport knew the sender (and counted it lost) then."""

    src: int
    messages: list[bytes]
    tensors: dict[int, list[Any]]
    known: bool
    lost: bool
    at: float


@dataclass
class World:
    """Rank 0's transport and what it saw, and how to reach the peers."""

    transport: Transport
    remote: bool
    deliveries: list[Delivery] = field(default_factory=list)
    lost: list[tuple[int, str, float]] = field(default_factory=list)
    kill: Callable[[int], None] = lambda rank: None
    hub: InProcessHub | None = None
    peers: dict[int, Peer] = field(default_factory=dict)

    def receive(self, src: int, bundle: Bundle, port: Port | None) -> None:
        known = self.transport.knows(src)
        lost = any(rank == src for rank, _, _ in self.lost)
        self.deliveries.append(Delivery(src, list(bundle[0]), dict(bundle[1]), known, lost, time.monotonic()))
        if port is not None:
            port.release()

    def on_lost(self, rank: int, why: str) -> None:
        self.lost.append((rank, why, time.monotonic()))

    def taken(self, src: int, prefix: bytes = b"") -> list[bytes]:
        """Every message taken from ``src`` as a live peer's (known, not lost), starting with ``prefix``."""
        return [
            message
            for delivery in self.deliveries
            if delivery.src == src and delivery.known and not delivery.lost
            for message in delivery.messages
            if message.startswith(prefix)
        ]

    async def until(self, condition: Callable[[], bool], seconds: float = 10.0) -> None:
        async with asyncio.timeout(seconds):
            while not condition():  # noqa: ASYNC110 - polling the observations is the point
                await asyncio.sleep(0.01)

    async def reply_to(self, src: int, key: str) -> dict[str, Any]:
        """The next json message from ``src`` that holds ``key``."""
        found: list[dict[str, Any]] = []

        def look() -> bool:
            found[:] = [json.loads(message) for message in self.taken(src, b"{") if key.encode() in message]
            return bool(found)

        await self.until(look)
        return found[-1]


async def open_world(kind: str) -> World:
    record = KINDS[kind]
    loop = asyncio.get_running_loop()
    core = next(layer for layer in (record, getattr(record, "inner", None)) if not isinstance(layer, FaultyTransport))
    if isinstance(core, InProcess):
        hub = InProcessHub(WORLD_SIZE)
        transports = [
            open_transport(WorldSpec(rank, WORLD_SIZE, hub.address, 0, liveness_timeout=LIVENESS), record)
            for rank in range(WORLD_SIZE)
        ]
        world = World(transports[0], remote=False, hub=hub, kill=lambda rank: hub.disconnect(rank, "killed"))
        transports[0].attach(loop, world.receive, world.on_lost)
        for rank, transport in enumerate(transports[1:], start=1):
            peer = world.peers[rank] = Peer(transport)
            transport.attach(loop, peer.receive, peer.on_lost)
        for transport in transports:
            await transport.start()
        for peer in world.peers.values():
            peer.start(_close_when_done(peer))
        return world
    listener = listen_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["actorch"])
    record_json = json.dumps(options_to_json(record))  # the peers rebuild the kind from its record
    processes = [
        context.Process(target=serve_peer, args=(rank, port, record_json), daemon=True) for rank in range(1, WORLD_SIZE)
    ]
    for process in processes:
        process.start()
    spec = WorldSpec(0, WORLD_SIZE, "127.0.0.1", port, liveness_timeout=LIVENESS, listener=listener)
    transport = open_transport(spec, record)
    world = World(transport, remote=True)
    world.kill = lambda rank: os.kill(processes[rank - 1].pid or 0, signal.SIGKILL)
    transport.attach(loop, world.receive, world.on_lost)
    await transport.start()
    return world


async def _close_when_done(peer: Peer) -> None:
    await peer.done.wait()
    with contextlib.suppress(Exception):
        await peer.transport.close()


# ---------------------------------------------------------------------- the cases


async def order(world: World) -> dict[str, Any]:
    """Per-link order both ways, bundles with tensors (the main path) and without (a lane, if any) mixed."""
    transport = world.transport
    for number in range(MESSAGES):
        transport.send(ECHO, data(number), tensors_for(number))
        if number % 10 == 9:
            await asyncio.sleep(0)
    transport.send(ECHO, command("report"))
    out = (await world.reply_to(ECHO, "seen"))["seen"]
    transport.send(ECHO, command("burst", n=MESSAGES))
    await world.until(lambda: len(world.taken(ECHO, b"D")) >= MESSAGES)
    back = [int(message[1:]) for message in world.taken(ECHO, b"D")]
    return {"out": out, "back": back, "paths": sorted(transport.bytes_sent_by_path)}


async def replies(world: World) -> dict[str, Any]:
    """Replies put on a received bundle's port come back, each once, in one bundle's response or on their own."""
    transport = world.transport
    for number in range(20):
        transport.send(ECHO, command("echo", n=number), [torch.full((3,), float(number))])
        if number % 5 == 4:
            await asyncio.sleep(0)
    await world.until(lambda: len(world.taken(ECHO, b'{"op": "echo"')) >= 20)
    await asyncio.sleep(0.2)  # none more comes
    echoed = []
    for delivery in world.deliveries:
        for index, message in enumerate(delivery.messages):
            if message.startswith(b'{"op": "echo"'):
                echoed.append([json.loads(message)["n"], delivery.tensors[index][0].tolist()])
    return {"echoed": sorted(echoed)}


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    floats = torch.randn(257, generator=generator)
    floats[:4] = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")])
    return {
        "float32": floats,
        "float64": torch.randn(33, generator=generator, dtype=torch.float64),
        "float16": floats.to(torch.float16),
        "bfloat16": floats.to(torch.bfloat16),
        "int8": torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8),
        "uint8": torch.arange(256, dtype=torch.uint8),
        "int64": torch.tensor([-(2**63), -1, 0, 2**63 - 1]),
        "bool": torch.tensor([True, False, True]),
        "complex64": torch.randn(9, generator=generator, dtype=torch.complex64),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 5),
        "strided": torch.arange(64.0).reshape(8, 8).t()[::2],
        "large": torch.randn(1 << 20, generator=generator),
    }


def _bits(tensor: torch.Tensor) -> tuple[str, list[int], str]:
    contiguous = tensor.contiguous()
    raw = contiguous.reshape(-1).view(torch.uint8) if contiguous.numel() else torch.empty(0, dtype=torch.uint8)
    return str(tensor.dtype), list(tensor.shape), raw.numpy().tobytes().hex()


async def tensors(world: World) -> dict[str, Any]:
    """Every tensor arrives bitwise as it was sent: dtypes, odd values, views, scalars, empties, a large one."""
    transport = world.transport
    sent = _tensors()
    for name, tensor in sent.items():
        transport.send(ECHO, command("echo", tensor=name), [tensor])
    await world.until(lambda: len(world.taken(ECHO, b'{"op": "echo", "tensor"')) >= len(sent))
    came: dict[str, torch.Tensor] = {}
    for delivery in world.deliveries:
        for index, message in enumerate(delivery.messages):
            if message.startswith(b'{"op": "echo", "tensor"'):
                came[json.loads(message)["tensor"]] = delivery.tensors[index][0]
    different = sorted(name for name, tensor in sent.items() if _bits(came[name]) != _bits(tensor))
    return {"sent": sorted(sent), "came": sorted(came), "different": different}


async def backlog(world: World) -> dict[str, Any]:
    """``backlog`` counts what a peer has not taken, from the moment it is queued until the peer takes it."""
    transport = world.transport
    for _ in range(3):
        transport.send(ECHO, PADDING * 1000)
    queued = transport.backlog(ECHO)
    await world.until(lambda: transport.backlog(ECHO) == 0)
    blocked = None
    if world.remote:  # a peer of another process can stop taking while this one sends
        transport.send(ECHO, command("block", seconds=BLOCK_SECONDS))
        await asyncio.sleep(0.3)
        for _ in range(8):
            transport.send(ECHO, PADDING, [torch.zeros(1 << 18)])  # a MiB each: the main path
            await asyncio.sleep(0)
        await asyncio.sleep(0.3)
        blocked = transport.backlog(ECHO)
        await world.until(lambda: transport.backlog(ECHO) == 0)
    return {"queued": queued, "blocked": blocked, "drained": transport.backlog(ECHO)}


async def strangers(world: World) -> dict[str, Any]:
    """Nothing a node outside the world sends is taken as a peer's; the transport does not know it."""
    transport = world.transport
    knows_stranger = transport.knows(7)
    before = len(world.deliveries)
    impersonated = refused_lane = None
    if world.hub is not None:
        stranger = world.hub.transport(7)  # a transport the world never met, on the same hub
        stranger.attach(asyncio.get_running_loop(), lambda *_: None, lambda *_: None)
        stranger.send(0, data(7))
        await asyncio.sleep(0.05)
    else:
        transport.send(ECHO, command("impersonate", rank=7))
        impersonated = (await world.reply_to(ECHO, "impersonated"))["impersonated"]
    lane = fast_lane_of(transport)
    if lane is not None and lane.lane is not None and lane.lane.address is not None:
        refused_before = lane.lane.refused_total
        host, _, port = lane.lane.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))  # the lane listens on this loop
        await reader.read(64)  # its challenge
        writer.write(b"\x3c\x00\x00\x00" + b"\x00" * 60)  # a hello that proves nothing
        with contextlib.suppress(OSError):
            while await reader.read(64):
                pass
        writer.close()
        await world.until(lambda: lane.lane is not None and lane.lane.refused_total > refused_before)
        refused_lane = lane.lane.refused_total - refused_before
    from_stranger = [delivery for delivery in world.deliveries[before:] if delivery.src == 7]
    return {
        "knows_stranger": knows_stranger,
        "taken_as_known": sum(delivery.known for delivery in from_stranger),
        "handed_over": len(from_stranger),
        "impersonated": impersonated,
        "refused_lane": refused_lane,
    }


async def forgotten(world: World) -> dict[str, Any]:
    """A peer forgotten (it left on purpose) is not known, not listed, and never reported lost when it goes."""
    transport = world.transport
    transport.send(FORGOTTEN, command("leave", after=0.3, n=3))
    await asyncio.sleep(0.05)  # the order has left
    transport.forget(FORGOTTEN)
    forgot_at = time.monotonic()
    transport.send(FORGOTTEN, data(1))  # nothing goes to a forgotten peer, and nothing fails
    await asyncio.sleep(LIVENESS + 0.5)  # it sent, left, and its process ended meanwhile
    return {
        "knows": transport.knows(FORGOTTEN),
        "listed": FORGOTTEN in [info.rank for info in transport.peers()],
        "taken_as_known": sum(
            delivery.known for delivery in world.deliveries if delivery.src == FORGOTTEN and delivery.at > forgot_at
        ),
        "reported_lost": [why for rank, why, _ in world.lost if rank == FORGOTTEN],
    }


async def loss(world: World) -> dict[str, Any]:
    """A peer killed is reported lost once, with a reason, and sends to it afterwards neither fail nor report again."""
    transport = world.transport
    killed_at = time.monotonic()
    world.kill(VICTIM)
    await world.until(lambda: any(rank == VICTIM for rank, _, _ in world.lost), seconds=4 * LIVENESS)
    reported_after = next(at for rank, _, at in world.lost if rank == VICTIM) - killed_at
    for number in range(5):
        transport.send(VICTIM, data(number), tensors_for(number))
        await asyncio.sleep(0.05)
    await asyncio.sleep(LIVENESS)
    reports = [why for rank, why, _ in world.lost if rank == VICTIM]
    return {"reports": reports, "reported_after": reported_after, "others_lost": sorted({r for r, _, _ in world.lost})}


CASES: list[tuple[str, Callable[[World], Awaitable[dict[str, Any]]]]] = [
    ("order", order),
    ("replies", replies),
    ("tensors", tensors),
    ("backlog", backlog),
    ("strangers", strangers),
    ("forgotten", forgotten),
    ("loss", loss),
]


async def drive(kind: str) -> None:
    started = time.monotonic()
    world = await open_world(kind)
    emit(
        "world", seconds=time.monotonic() - started, layers=[type(layer).__name__ for layer in layers(world.transport)]
    )
    for name, case in CASES:
        began = time.monotonic()
        try:
            async with asyncio.timeout(CASE_SECONDS):
                values = await case(world)
        except Exception as exc:
            emit(name, failed=repr(exc), traceback=traceback.format_exc())
        else:
            emit(name, seconds=time.monotonic() - began, **values)
    world.transport.send(ECHO, command("exit"))
    await asyncio.sleep(0.2)
    await world.transport.close()
    emit("suite", seconds=time.monotonic() - started)


if __name__ == "__main__":
    asyncio.run(drive(sys.argv[1]))
