"""The torch RPC (TensorPipe) transport: with ``elastic``, the only module that imports ``torch.distributed.rpc``.

Each bundle is one ``rpc_async`` to the peer's :func:`_inbound`, an
``async_execution`` function that queues it for the peer's event loop and
returns a future at once, so no RPC thread ever blocks. The loop completes that
future with the replies ready within the port's hold (see ``Port``). Bundles
carry a per-link sequence number because RPC threads may hand them over out of
order. Every rank keeps one call to :func:`_watch` pending on every peer; it
fails within milliseconds when the peer's process dies, which is how peer loss
is noticed even when nothing else is in flight. A process that stops answering
without closing its connections (stopped, or cut off by the network) is caught
by heartbeats instead: a thread of every rank pings every peer, and a peer
heard from by neither ping, answer to a ping nor bundle for ``liveness_timeout``
seconds is lost, unless its process is seen still running on this machine
(``suspicion``: starved, not dead). The heartbeat runs outside the event loop,
so a loop busy with a long handler does not make its node look dead. A node
that was lost but comes back (it was only stopped, or the partition healed) is
stale: its bundles and pings are answered with ``EXPELLED``, which tells it that
this node counts it lost, so it sees this node lost in turn instead of talking
to a world that moved on.

A path beside torch RPC (the fast lane, ``lane``) is a wrapper of its own: it
shares this transport's links (``SharedLinks``: every bundle of a link, on
either path, carries the link's next number, and ``sequencing`` puts them back
in order here), opens with the world's secret and meets every peer as this
transport does. The heartbeat's judgement of a silent peer is ``suspicion``'s.
Peers can be cut off on purpose (``Severable``, for fault injection): neither
pinged nor heard (not even saying that they count this node lost, which a real
partition would not carry), and judged by their silence alone.

Everything torch's threads hand the loop goes through one ``Inbox`` as a typed
item (``inbox``): a bundle ``Arrived`` (with its response, if it came by torch
RPC), replies ``Answered`` on a bundle's response, a bundle ``Refused``, a peer
``Lost``, a node ``Joined``.

The module is one piece past 600 lines because the send path, the watch on
each peer, the heartbeat thread and the off-loop answers all read and change
the same per-peer state (its link, when it was last heard, whether it is lost
or cut off); the heartbeat thread is the next part to move into a module of
its own, with that state as a record it shares.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from torch.distributed import rpc

from actorch._base.channels.route import TensorRoute
from actorch._base.codec import register_side_type
from actorch._base.devices import accelerator
from actorch._base.errors import UnsupportedError
from actorch._transport.autograd import NO_CONTEXT, current_context_id, force_context_id
from actorch._transport.base import Bundle, NodeInfo, Port, Transport
from actorch._transport.bridge import Inbox, in_daemon_thread
from actorch._transport.capabilities import SidePath
from actorch._transport.membership import own_info
from actorch._transport.network import address_towards, interface_chosen, interface_towards, is_loopback
from actorch._transport.sequencing import LinkOrder
from actorch._transport.suspicion import Suspicion
from actorch._transport.torch_rpc.inbox import Answered, Arrived, InboxItem, Joined, Lost, Refused
from actorch._transport.torch_rpc.options import TorchRpc
from actorch._transport.torch_rpc.rpc_setup import (
    exchange_node_facts,
    quiet_cpp_logs,
    rendezvous_store,
    resolve_device_maps,
    world_secret,
)
from actorch._transport.world import DEFAULT_LIVENESS_TIMEOUT

__all__ = ["RpcTransport", "tensorpipe_options"]

# torch's RPC pickler carries RRefs (with their reference counting) in the side list.
register_side_type(rpc.PyRRef)  # type: ignore[attr-defined]

_active: RpcTransport | None = None
_TORCH_RPC = "torch_rpc"  # the path its bundles take, as the byte counters name it
HEARTBEATS_PER_TIMEOUT = 5
"""Heartbeats go every this fraction of the liveness timeout."""
EXPELLED = "actorch:expelled"
"""A bundle's or ping's answer from a node that counts the sender lost (or does not know it)."""


def _forget_world() -> None:
    # torch numbers its start-up all-gathers per process; a later world whose
    # other ranks are fresh processes must count from zero like them.
    for state in ("_all_gather_sequence_id", "_all_gather_sequence_id_to_states"):
        table = getattr(rpc.api, state, None)
        if isinstance(table, dict):
            table.clear()


def worker_name(rank: int) -> str:
    """Name of ``rank``'s torch RPC worker."""
    return f"node{rank}"


def active_transport() -> RpcTransport | None:
    """The torch RPC transport running in this process, if any (torch RPC is one per process)."""
    return _active


EXIT_DROP_TIMEOUT = 2.0
"""How long the interpreter's exit waits for torch RPC to go down (it takes under 0.03 s)."""


def drop_at_exit() -> None:
    """Take torch RPC down, without its barrier, for an interpreter that exits with a system still up.

    Left up, its threads outlive the interpreter's finalization, and now and
    then the C++ runtime aborts the exit (``terminate called without an active
    exception``, exit code 134). Runs in a daemon thread, bounded, so that the
    exit cannot hang on it.
    """
    if _active is None:
        return
    dropping = threading.Thread(target=lambda: rpc.shutdown(graceful=False), name="actorch-drop-at-exit", daemon=True)
    dropping.start()
    dropping.join(EXIT_DROP_TIMEOUT)


@rpc.functions.async_execution  # type: ignore[untyped-decorator]
def _inbound(src: int, seq: int, messages: list[bytes], tensors: dict[int, Any]) -> torch.futures.Future[Any]:
    response: torch.futures.Future[Any] = torch.futures.Future()
    transport = _active
    if transport is None:
        response.set_result(None)
    elif src not in transport._heard or src in transport._lost_ranks:
        response.set_result(EXPELLED)
        transport._inbox.post(Refused(src, (messages, tensors)))
    else:
        if src not in transport._severed:
            transport._heard[src] = time.monotonic()
        if transport._routes_direct:
            accelerator().wait_landed(tensor for group in tensors.values() for tensor in group)
        # torch makes a bundle's distributed autograd context current while this runs
        transport._inbox.post(Arrived(src, seq, (messages, tensors), response, current_context_id()))
    return response


def _size_of(bundle: Bundle) -> int:
    """Bytes of a bundle's messages and of its tensors (side lists hold RRefs too: they count nothing)."""
    messages, tensors = bundle
    size = sum(map(len, messages))
    if tensors:
        size += sum(getattr(tensor, "nbytes", 0) for side in tensors.values() for tensor in side)
    return size


def _held_size(arrived: Arrived) -> int:
    """Bytes a bundle held for its turn counts against ``HELD_BUDGET``."""
    return _size_of(arrived.bundle)


def _on_device(item: object) -> bool:
    """Whether a side-list item is a tensor off the CPU (the list also holds torch RRefs)."""
    return isinstance(item, torch.Tensor) and item.device.type != "cpu"


def _ping(src: int) -> bool:
    """Note that ``src`` is alive; answer whether this node counts it lost (it is stale then)."""
    transport = _active
    if transport is None or src not in transport._heard or src in transport._severed:
        return False  # not (or no longer) a peer: it learns the world from rank 0, not from pings; or cut off
    if src in transport._lost_ranks:
        return True
    transport._heard[src] = time.monotonic()
    return False


def _off_loop(question: str) -> Any:
    """Answer another node's question on this torch RPC thread (``Transport.off_loop``), without the loop."""
    transport = _active
    hook = None if transport is None else transport.off_loop
    return None if hook is None else hook(question)


@rpc.functions.async_execution  # type: ignore[untyped-decorator]
def _watch(src: int) -> torch.futures.Future[Any]:
    future: torch.futures.Future[Any] = torch.futures.Future()
    transport = _active
    if transport is None or transport._closing:
        future.set_result(None)
    elif src not in transport._heard or src in transport._lost_ranks:
        future.set_result(EXPELLED)
    else:
        transport._watchers[src] = future
    return future


def tensorpipe_options(options: TorchRpc, device_maps: dict[int, dict[str, str]]) -> Any:
    """The TensorPipe options for ``options``, with this rank's device map to each destination rank."""
    backend = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=options.threads,
        rpc_timeout=options.timeout,
        _transports=[options.tensorpipe],
    )
    for dest, pairs in device_maps.items():
        backend.set_device_map(worker_name(dest), dict(pairs.items()))
    return backend


class RpcTransport(Transport):
    """Talks torch RPC to the other ranks of a world (static here; see ``elastic`` for one that grows).

    It is ``TorchInterop``, ``SharedLinks`` (a path beside it may share its
    links) and ``Severable``.
    """

    paths = (_TORCH_RPC,)

    def route(self, dest: int) -> TensorRoute:
        """How tensors reach ``dest``: the CUDA devices this rank's device map carries there directly."""
        route = self._routes.get(dest)
        return route if route is not None else TensorRoute(dest)

    def make_rref(self, value: Any) -> Any:
        """A torch RRef owned by this rank holding ``value``."""
        return rpc.RRef(value)

    def shared_store(self) -> Any:
        """The TCPStore the ranks met in (rank 0 serves it, or torchrun's agent does)."""
        if self._store is None:
            raise UnsupportedError("the world has not started, or has closed: its store is gone")
        return self._store

    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        options: TorchRpc,
        listener: socket.socket | None = None,
        *,
        liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT,
    ) -> None:
        super().__init__(rank, world_size)
        self._master = (master_addr, master_port)
        self._listener = listener
        self._store: Any = None
        self._options = options
        self._liveness_timeout = liveness_timeout
        # Per peer, by rank: peers are added as they are met (all at start in a static world).
        self.links: LinkOrder[Arrived] = LinkOrder(self._deliver, _held_size)
        """Every link's numbers, and the bundles held for their turn (both paths', with a path beside)."""
        self._workers: dict[int, Any] = {}  # rank -> torch WorkerInfo, for sends
        self._heard: dict[int, float] = {}  # when each peer was last heard from (monotonic; RPC threads write)
        self._routes: dict[int, TensorRoute] = {}
        self._watchers: dict[int, torch.futures.Future[Any]] = {}
        self._peers: dict[int, NodeInfo] = {}  # every node met, this one included
        self._lost_ranks: set[int] = set()
        self._gone: set[int] = set()  # peers that left the world on purpose, forgotten
        self._severed: frozenset[int] = frozenset()  # peers cut off on purpose: neither pinged nor heard
        self._stop_heartbeat = threading.Event()
        self._closing = False
        self._inbox: Inbox[InboxItem]
        self._routes_direct = False  # whether any device map is set (received CUDA tensors are waited for)
        self._beside: SidePath | None = None  # a path beside torch RPC (the fast lane), sharing the links
        self._in_flight: dict[int, int] = {}  # per peer: bytes of bundles sent by torch RPC, not yet answered
        self._in_flight_lock = threading.Lock()  # torch's threads take answered bundles off

    def __repr__(self) -> str:
        host, port = self._master
        return f"<RpcTransport rank={self.rank}/{self.world_size} master={host}:{port}>"

    async def start(self) -> None:
        """Join the world (blocking rendezvous runs in a thread) and watch every peer."""
        global _active  # noqa: PLW0603 - torch RPC is one per process
        if _active is not None:
            raise RuntimeError("a torch RPC transport is already running in this process")
        loop = asyncio.get_running_loop()
        self._inbox = Inbox(loop, self._on_inbox)
        self._inbox_loop = loop
        _active = self
        try:
            await in_daemon_thread(self._init_rpc)
        except BaseException:
            _active = None
            raise

    def put_beside(self, path: SidePath) -> None:
        """Run ``path`` beside torch RPC: it opens once the world's secret is known, and meets every peer."""
        self._beside = path
        self.bytes_received_by_path.setdefault(path.name, 0)

    def sever(self, ranks: Collection[int]) -> None:
        """Stop pinging and hearing ``ranks`` (any thread): past the liveness timeout of silence, they are lost."""
        self._severed = self._severed | frozenset(ranks)

    def heal(self, ranks: Collection[int]) -> None:
        """Ping and hear ``ranks`` again (any thread)."""
        self._severed = self._severed - frozenset(ranks)

    def _watch_peers(self) -> None:
        """Watch every peer and start the heartbeat, from the thread that brought torch RPC up.

        Not later on the loop: peers send requests the moment this node's agent
        is up, and a handler that blocks the loop before ``start`` resumed would
        leave the node without heartbeats, so rank 0 would count it lost.
        """
        now = time.monotonic()
        for peer in list(self._heard):
            self._heard[peer] = now
            self._watch_peer(peer)
        threading.Thread(target=self._heartbeat, name="actorch-heartbeat", daemon=True).start()

    def _watch_peer(self, peer: int) -> None:
        """Keep a call to ``peer``'s ``_watch`` pending: it ends the moment the peer's process does."""
        watch = rpc.rpc_async(worker_name(peer), _watch, args=(self.rank,), timeout=0)
        watch.add_done_callback(self._watch_callback(peer))

    def _add_peer(self, info: NodeInfo, direct: Mapping[str, str] | None = None) -> None:
        """Know node ``info.rank`` (from whichever thread meets it): it may send to us, and we to it.

        ``direct``: this rank's device map toward it (each CUDA device and where it lands there).
        """
        rank = info.rank
        if rank != self.rank:
            self.links.meet(rank)
            self._routes[rank] = TensorRoute(rank, dict(direct or {}), reach=info.reach)
            if self._beside is not None:
                self._beside.met(info)
            self._heard[rank] = time.monotonic()  # last: from here on, its bundles are taken
        self._peers[rank] = info
        self.world_size = len(self._peers)

    def forget(self, rank: int) -> None:
        """Node ``rank`` left the world on purpose: stop watching and pinging it, refuse what it still sends."""
        if rank == self.rank or rank in self._gone:
            return
        self._gone.add(rank)
        self._heard.pop(rank, None)
        self._peers.pop(rank, None)
        self.world_size = len(self._peers)
        for held in self.links.forget(rank):
            if held.response is not None:
                held.response.set_result(None)
        watcher = self._watchers.pop(rank, None)
        if watcher is not None:
            watcher.set_result(None)

    def _heartbeat(self) -> None:
        """Ping every peer each interval; report a peer the moment it has been silent for the liveness timeout.

        The thread wakes for the next round of pings or for the earliest moment
        a peer would pass the timeout, whichever comes first, so a loss is
        reported at ``liveness_timeout`` after the last sign of life rather than
        up to an interval later. Silence is counted only while this thread runs:
        one that wakes an interval late was held up itself (its process starved
        or stopped), and what it missed meanwhile says nothing of the peers. A
        silent peer whose process still runs on this machine is suspected, not
        lost (see ``suspicion``), unless it was cut off on purpose (``sever``):
        neither pinged nor spared, it is judged by its silence alone.
        """
        timeout = self._liveness_timeout
        interval = timeout / HEARTBEATS_PER_TIMEOUT
        suspicion = Suspicion(self.rank, timeout)
        reported: set[int] = set()
        next_ping = wake = judged_from = time.monotonic()
        while True:
            now = time.monotonic()
            if now - wake > interval:
                judged_from = now
            live, suspected, watched = [], [], []
            severed = self._severed
            for peer, heard in list(self._heard.items()):
                if peer in self._lost_ranks or peer in reported:
                    continue
                silent = now - max(heard, judged_from)
                if silent < timeout:
                    suspicion.heard(peer)
                    watched.append(peer)
                    if peer not in severed:
                        live.append(peer)  # pinged; a severed peer is only waited for
                elif peer not in severed and suspicion.spares(self._peers.get(peer), now - heard):
                    suspected.append(peer)
                else:
                    reported.add(peer)
                    self._lost_from_thread(peer, f"not heard from for {silent:.1f} s (liveness timeout {timeout:g} s)")
            if now >= next_ping:
                next_ping = now + interval
                for peer in live + suspected:
                    try:
                        ping = rpc.rpc_async(worker_name(peer), _ping, args=(self.rank,), timeout=timeout)
                    except Exception:  # noqa: BLE001, S112 - a dead link shows as silence, then loss
                        continue
                    ping.add_done_callback(self._ping_callback(peer))
            wake = min([next_ping, *(max(self._heard.get(peer, now), judged_from) + timeout for peer in watched)])
            if self._stop_heartbeat.wait(max(wake - time.monotonic(), 0.0) + 0.001):
                return

    def _ping_callback(self, peer: int) -> Any:
        def on_pong(future: torch.futures.Future[bool]) -> None:
            try:
                expelled = future.value()
            except Exception:  # noqa: BLE001 - a failed ping is silence; the timeout decides
                return
            if peer in self._severed:
                return  # cut off: its answer is not heard
            if expelled:
                self._lost_from_thread(peer, f"node {peer} counts this node lost (it was silent too long)")
            elif peer in self._heard:
                # An answer is a sign of life too: this node's view of a peer must not hang on the
                # peer's own pings, which start later (a node that joins later) or run slower than ours.
                self._heard[peer] = time.monotonic()
                if peer in self._gone:  # it left meanwhile (forget runs on the loop): keep it forgotten
                    self._heard.pop(peer, None)

        return on_pong

    def _lost_from_thread(self, peer: int, why: str) -> None:
        """A torch or heartbeat thread saw ``peer`` lost: tell the loop, and the thread hook at once."""
        if peer in self._gone:
            return  # it left on purpose: its links closing are expected
        self._inbox.post(Lost(peer, why))
        hook = self.lost_in_thread
        if hook is not None and not self._closing:
            hook(peer, why)

    def _init_rpc(self) -> None:
        quiet_cpp_logs()
        store = self._rendezvous_store()
        me = own_info(self.rank, accelerator().inventory(), self.traits, self._open_beside(store))
        infos = exchange_node_facts(store, me, self.world_size)
        hosts, inventories = [info.host for info in infos], [info.devices for info in infos]
        device_maps = resolve_device_maps(self._options.device_maps, self.rank, inventories, hosts)
        options = tensorpipe_options(self._options, device_maps)
        self._routes_direct = bool(device_maps)
        for info in infos:
            self._add_peer(info, device_maps.get(info.rank))

        def static_agent() -> None:
            rpc._init_rpc_backend(  # type: ignore[no-untyped-call]
                rpc.BackendType.TENSORPIPE,  # type: ignore[attr-defined]
                store,
                worker_name(self.rank),
                self.rank,
                self.world_size,
                options,
            )

        self._bring_up(static_agent)
        self._watch_peers()

    def _open_beside(self, store: Any) -> str | None:
        """Open the path beside torch RPC once the world's secret is known (from the init thread); where it listens.

        It listens only now, so that no connection ever meets it without the
        secret its peers must prove.
        """
        if self._beside is None:
            return None
        secret = world_secret(store, self.rank)
        opening = asyncio.run_coroutine_threadsafe(
            self._beside.open_beside(secret, address_towards(*self._master)), self._inbox_loop
        )
        return opening.result(self._options.init_timeout)

    def _bring_up(self, make_agent: Callable[[], None]) -> None:
        """Run ``make_agent`` (it starts this rank's torch RPC agent) as ``init_rpc`` would, on the right interface."""
        host, port = self._master
        # TensorPipe and Gloo otherwise listen on what the host name resolves to,
        # which may be another interface (or loopback on a multi-host world).
        interface = "lo" if is_loopback(host) else interface_towards(host, port)
        with interface_chosen(interface), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*ProcessGroup.*", category=UserWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            # What init_rpc does, minus its per-process key prefix counter: with it, a
            # second world in the same process used other keys than its fresh workers
            # and waited forever.
            rpc.dist_autograd._init(self.rank)  # type: ignore[attr-defined]
            rpc._set_profiler_node_id(self.rank)  # type: ignore[attr-defined]
            make_agent()

    def _rendezvous_store(self) -> Any:
        """The store the ranks meet in; rank 0 serves it on its own socket (loopback by default)."""
        listener, self._listener = self._listener, None
        size = max(self.world_size, 1)  # an elastic world starts from none known
        self._store, prefixed = rendezvous_store(self._master, self.rank, size, self._options.init_timeout, listener)
        return prefixed

    def peers(self) -> list[NodeInfo]:
        """Every node of the world with its host and pid, by rank (nodes that left are forgotten)."""
        return sorted(list(self._peers.values()), key=lambda info: info.rank)  # noqa: C414 - list() copies at once: RPC threads add peers

    def knows(self, rank: int) -> bool:
        """Whether ``rank`` is a peer this node has met and not forgotten."""
        return rank in self._heard

    def peer(self, rank: int) -> NodeInfo:
        """Node ``rank``'s host, pid and devices (``KeyError`` if it is not a node of the world)."""
        return self._peers[rank]

    async def close(self) -> None:
        """Tell watching peers we leave, then drop torch RPC without its hang-prone barrier."""
        global _active  # noqa: PLW0603 - torch RPC is one per process
        if self._closing:
            return
        self._flush()  # what is queued leaves before the link goes
        self._closing = True
        self._stop_heartbeat.set()
        watchers, self._watchers = self._watchers, {}
        for watcher in watchers.values():
            watcher.set_result(None)
        try:
            await in_daemon_thread(lambda: rpc.shutdown(graceful=False))
        finally:
            _active = None
            self._store = None
            if self._listener is not None:
                self._listener.close()
            _forget_world()

    def port_for(self, port: Port | None, tensors: list[torch.Tensor] | None) -> Port | None:
        """``port``, but None (released) for a reply with CUDA tensors, which always leaves on its own.

        A response carries CPU tensors only: device maps cover requests. Only
        with a map can a reply hold CUDA tensors here (others were staged).
        """
        if self._routes_direct and port is not None and tensors and any(_on_device(item) for item in tensors):
            port.release()
            return None
        return port

    def _send_bundle(self, dest: int, bundle: Bundle, in_context: bool) -> str | None:
        if in_context or current_context_id() == NO_CONTEXT:
            return self._rpc_bundle(dest, bundle)
        # A bundle mixes messages of any context: none may record it, whatever the thread holds.
        previous = force_context_id(NO_CONTEXT)
        try:
            return self._rpc_bundle(dest, bundle)
        finally:
            force_context_id(previous)

    def _rpc_bundle(self, dest: int, bundle: Bundle) -> str | None:
        next_seq = self.links.next_seq
        seq = next_seq.get(dest)
        if seq is None or dest in self._lost_ranks or dest in self._gone:
            return None  # lost or gone: the node above fails what waits for it
        next_seq[dest] = seq + 1
        messages, tensors = bundle
        size = _size_of(bundle)
        with self._in_flight_lock:
            self._in_flight[dest] = self._in_flight.get(dest, 0) + size
        try:
            # No timeout: a bundle may wait for a long handler's reply. Liveness is the heartbeats' to judge.
            to = self._workers.get(dest)
            if to is None:  # looked up once: torch would look the name up on every send
                to = self._workers[dest] = rpc.get_worker_info(worker_name(dest))
            sent = rpc.rpc_async(to, _inbound, args=(self.rank, seq, messages, tensors), timeout=0)
        except Exception as exc:  # noqa: BLE001 - any failure to send means the link is gone
            self._peer_lost(dest, f"send failed: {exc}")
            return None
        sent.add_done_callback(self._sent_callback(dest, size))
        return _TORCH_RPC

    def ask_off_loop(self, rank: int, question: str, timeout: float) -> Any:
        """Node ``rank``'s answer to ``question``, from one of its torch RPC threads (never its loop)."""
        return rpc.rpc_sync(worker_name(rank), _off_loop, args=(question,), timeout=timeout)

    def backlog(self, dest: int) -> int:
        """Bytes sent toward ``dest`` that it has not taken yet: queued, and sent by torch RPC until answered."""
        return self._queued.get(dest, 0) + self._in_flight.get(dest, 0)  # on every call: kept lean

    def _sent_callback(self, dest: int, size: int) -> Any:
        inbox = self._inbox

        def on_response(future: torch.futures.Future[Any]) -> None:
            with self._in_flight_lock:
                self._in_flight[dest] -= size
            try:
                replies = future.value()
            except Exception as exc:  # noqa: BLE001 - reported as peer loss on the loop
                self._lost_from_thread(dest, f"send failed: {exc}")
            else:
                if replies == EXPELLED:
                    if dest not in self._severed:  # a cut-off peer's word cannot cross the cut: its silence decides
                        self._lost_from_thread(dest, f"node {dest} counts this node lost (it was silent too long)")
                elif replies is not None and replies[0]:
                    inbox.post(Answered(dest, replies))

        return on_response

    def _watch_callback(self, peer: int) -> Any:
        def on_watch_done(future: torch.futures.Future[Any]) -> None:
            try:
                answer = future.value()
            except Exception as exc:  # noqa: BLE001 - reported as peer loss on the loop
                self._lost_from_thread(peer, f"connection lost: {exc}")
            else:
                if answer == EXPELLED:
                    if peer not in self._severed:  # a cut-off peer's word cannot cross the cut: its silence decides
                        self._lost_from_thread(peer, f"node {peer} counts this node lost")
                else:
                    self._lost_from_thread(peer, "left the world")

        return on_watch_done

    def arrived_beside(self, src: int, seq: int, messages: list[bytes]) -> None:
        """A bundle that came on the path beside torch RPC: refused from a lost or unknown node, else taken in order."""
        if src not in self._heard or src in self._lost_ranks:
            self._on_inbox(Refused(src, (messages, {})))
            return
        if src not in self._severed:
            self._heard[src] = time.monotonic()
        self._on_arrived(Arrived(src, seq, (messages, {}), None, NO_CONTEXT))  # no response: replies go apart

    def lose(self, rank: int, why: str) -> None:
        """The path beside torch RPC saw ``rank`` lost: count it lost here too (and report it)."""
        self._peer_lost(rank, why)

    def _on_inbox(self, item: InboxItem) -> None:
        if type(item) is Arrived:
            self._on_arrived(item)
        elif type(item) is Answered:  # replies that came back on a bundle's response
            if self._receive is None:
                return
            if item.src not in self._lost_ranks and item.src not in self._gone:
                self.bytes_received_by_path[_TORCH_RPC] += sum(map(len, item.replies[0]))
            self._receive(item.src, item.replies, None)  # from a lost node, the node refuses them
        elif type(item) is Refused:
            if self._receive is not None:
                self._receive(item.src, item.bundle, None)  # the node refuses it: it counts and logs that
        elif type(item) is Lost:
            self._peer_lost(item.src, item.why)
        elif type(item) is Joined and self.on_joined is not None and item.info.rank not in self._gone:
            self.on_joined(item.info)

    def _on_arrived(self, item: Arrived) -> None:
        """Take a bundle in its link's order, or hand it to the node to refuse if its sender is lost or gone."""
        if self._receive is None:
            return
        src = item.src
        if src in self._lost_ranks or src in self._gone:
            if item.response is not None:
                item.response.set_result(EXPELLED)
            self._receive(src, item.bundle, None)
            return
        why = self.links.arrived(src, item.seq, item)  # in link order, now or once the bundles before it came
        if why is not None:  # it waited too long for a bundle that never came
            self._peer_lost(src, why)
            self._on_arrived(item)  # refused, as from any lost node

    def _deliver(self, src: int, item: Arrived) -> None:
        """Hand a bundle whose turn came to the node, with a port on its response if it has one."""
        bundle, response = item.bundle, item.response
        received = self.bytes_received_by_path
        if response is None:  # it came on the path beside
            assert self._beside is not None
            received[self._beside.name] += sum(map(len, bundle[0]))
            port = None
        else:
            received[_TORCH_RPC] += sum(map(len, bundle[0]))
            port = Port(self._inbox_loop, functools.partial(self._respond, response), item.context)
        assert self._receive is not None
        self._receive(src, bundle, port)

    def _respond(self, response: torch.futures.Future[Any], replies: Bundle) -> None:
        """Send ``replies`` back on a received bundle's response (counted as bytes sent by torch RPC)."""
        messages = replies[0]
        if messages:
            self.bytes_sent_by_path[_TORCH_RPC] += sum(map(len, messages))
        response.set_result(replies)

    def _peer_lost(self, rank: int, why: str) -> None:
        if self._closing or rank in self._lost_ranks or rank in self._gone:
            return
        self._lost_ranks.add(rank)
        for held in self.links.drop_held(rank):
            if held.response is not None:
                held.response.set_result(EXPELLED)
        watcher = self._watchers.pop(rank, None)
        if watcher is not None:
            watcher.set_result(EXPELLED)  # if the peer is only stale, it hears that we count it lost
        self._report_lost(rank, why)
