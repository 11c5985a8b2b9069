"""The torch RPC transport of an elastic world: nodes join while it runs, and leave.

Every rank runs a dynamic TensorPipe agent (made without a world size). Rank 0
serves the rendezvous store and admits newcomers one at a time, from a thread
of its own: it checks the request's proof of the join token (see
``membership``), answers with the current members, waits for the newcomer's
agent, then *welcomes* it on every member, itself first. A welcome enters the
newcomer in the member's torch RPC agent and in this transport's peers, and
starts watching it; only then may the newcomer serve. Rank 0's own loop hears
of the join last, once every member has met the newcomer, so that what rank 0
then asks of it (a spawn, a leave) never has it call a member that does not
know it yet. Joins never run
concurrently, so torch's own join lock is not needed. The launch's first
workers join the same way, under ranks chosen in advance.

A node that leaves on purpose is *forgotten* (``forget``): it is neither
pinged nor watched, and what it still sends is refused. Ranks are never
reused: a process that comes back joins as a new node.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import socket
import threading
import time
import weakref
from typing import Any

import structlog
from torch.distributed import rpc

from actorch._base.devices import accelerator
from actorch._base.errors import JoinError, UnsupportedError
from actorch._transport.base import NodeInfo, NodeTraits
from actorch._transport.bridge import in_daemon_thread
from actorch._transport.capabilities import NOT_ELASTIC
from actorch._transport.membership import (
    ADDRESS_ENV,
    BELL_WAIT,
    POLL,
    TOKEN_ENV,
    JoinRequest,
    Membership,
    facts_of,
    info_of,
    own_info,
)
from actorch._transport.torch_rpc import rpc as rpc_transport
from actorch._transport.torch_rpc.inbox import Joined
from actorch._transport.torch_rpc.options import TorchRpc
from actorch._transport.torch_rpc.rpc import RpcTransport, tensorpipe_options, worker_name
from actorch._transport.torch_rpc.rpc_setup import cpp_errors_quiet, quiet_cpp_logs, rendezvous_store
from actorch._transport.world import DEFAULT_LIVENESS_TIMEOUT

__all__ = ["ElasticRpcTransport"]

log = structlog.get_logger("actorch")


_admitting: weakref.WeakSet[ElasticRpcTransport] = weakref.WeakSet()
"""Rank 0 transports whose admission thread may still run, for the exit hook."""


@atexit.register
def _end_admission_at_exit() -> None:
    """A process that exits with its system up (no shutdown) ends the admission threads first."""
    for transport in list(_admitting):
        with contextlib.suppress(Exception):
            transport.end_admission()


def _welcome(facts: str) -> bool:
    """Rank 0 introduces a newcomer to this member (runs on a torch RPC thread)."""
    transport = rpc_transport.active_transport()
    if not isinstance(transport, ElasticRpcTransport) or transport._closing:
        return False
    transport.welcome(info_of(json.loads(facts)))
    return True


def prepare_join(host: str, port: int, timeout: float, *, invited: bool = False) -> tuple[int, dict[str, Any]]:
    """A fresh rank in the elastic system whose rank 0 serves its store at ``host:port``, and its settings.

    ``invited``: the system itself started this process (``add_nodes``), so a
    system that is not elastic takes it too.

    Raises:
        JoinError: Nothing answers there within ``timeout`` seconds, or the
            system there does not take new nodes.
    """
    store, prefixed = _reach_store(host, port, timeout)
    try:
        members = Membership(prefixed)
        members.wait_elastic(min(timeout, 5.0), invited=invited)
        return members.take_rank(), members.settings()
    finally:
        del store


def _reach_store(host: str, port: int, timeout: float) -> tuple[Any, Any]:
    """Connect to rank 0's store at ``host:port`` within ``timeout`` seconds, as ``rendezvous_store`` gives it.

    torch's store client retries past its own timeout (twice it, and more, where
    nothing listens). So a plain socket first waits for something to listen
    there, until the deadline; then the store connects in a daemon thread that
    is given up on at the deadline (something listens but does not answer as
    a store), and ends by itself when torch gives up.
    """
    limit = time.monotonic() + timeout
    _wait_listening(host, port, limit, timeout)
    reached: dict[str, Any] = {}

    def connect() -> None:
        try:
            with cpp_errors_quiet():
                reached["store"] = rendezvous_store((host, port), 1, 1, timeout, None)
        except Exception as exc:  # noqa: BLE001 - torch's store says why in its own words
            reached["error"] = exc

    connecting = threading.Thread(target=connect, name="actorch-join", daemon=True)
    connecting.start()
    connecting.join(max(limit - time.monotonic(), 0.0))
    if "store" in reached:
        found: tuple[Any, Any] = reached["store"]
        return found
    why = reached.get("error", f"nothing answered within {timeout:g} s")
    raise JoinError(f"cannot reach an actorch system at {host}:{port}: {why}")


def _wait_listening(host: str, port: int, limit: float, timeout: float) -> None:
    """Return once a TCP connection to ``host:port`` succeeds; ``JoinError`` at ``limit`` (monotonic) if none did."""
    while True:
        left = limit - time.monotonic()
        try:
            socket.create_connection((host, port), timeout=max(min(left, 1.0), 0.01)).close()
        except OSError as exc:  # refused, unreachable, unresolved: it may come up before the deadline
            if time.monotonic() + POLL >= limit:
                raise JoinError(
                    f"cannot reach an actorch system at {host}:{port}: nothing answered within {timeout:g} s ({exc})"
                ) from None
            time.sleep(POLL)
        else:
            return


class ElasticRpcTransport(RpcTransport):
    """Talks torch RPC to a world that nodes join and leave while it runs (it is ``Elastic``).

    Args:
        rank: This node's rank (a newcomer's from ``prepare_join``).
        master_addr: Host of rank 0's store.
        master_port: Its port.
        options: torch RPC's options; elastic worlds have no device maps.
        token: The join token (rank 0 checks newcomers against it; newcomers prove it).
        initial: On rank 0, how many ranks the launch starts itself (they join first).
        label: A name for this node, shown with it (``NodeInfo.label``).
        listener: Rank 0's listening socket for the store, if already bound.
        shared: On rank 0, the settings every node must run with, for newcomers to read (json-ready).
        public: On rank 0, whether any process with the token may join (``run(..., elastic=True)``),
            or only those the system starts itself (``add_nodes``: a system that is not elastic
            but grows on demand). Newcomers to a private system must be ``invited``.
        invited: On a newcomer, whether the system itself started this process.
        liveness_timeout: Seconds of silence after which a peer is lost.
    """

    def __init__(
        self,
        rank: int,
        master_addr: str,
        master_port: int,
        options: TorchRpc,
        *,
        token: str | None,
        initial: int = 1,
        label: str | None = None,
        listener: socket.socket | None = None,
        shared: dict[str, Any] | None = None,
        public: bool = True,
        invited: bool = False,
        liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT,
    ) -> None:
        if options.device_maps not in (None, "auto"):
            raise ValueError("an elastic system has no device maps: GPU tensors are staged through host memory")
        super().__init__(rank, 0, master_addr, master_port, options, listener, liveness_timeout=liveness_timeout)
        self._token = token
        self._initial = initial
        self.public = public
        self._invited = invited
        if label is not None:
            self.traits = NodeTraits(label=label)
        self._shared = shared or {}
        self._members: Membership | None = None
        self._admitted = threading.Condition()
        self._joined_ranks: set[int] = set()
        self._admission_stop = threading.Event()
        self._admission: threading.Thread | None = None

    def __repr__(self) -> str:
        host, port = self._master
        return f"<ElasticRpcTransport rank={self.rank} nodes={self.world_size} master={host}:{port}>"

    @property
    def address(self) -> str:
        """Where newcomers find the system: ``host:port`` of rank 0's store."""
        host, port = self._master
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def join_env(self) -> dict[str, str]:
        """``ACTORCH_ADDRESS`` and ``ACTORCH_JOIN_TOKEN`` for a process to join (rank 0 only)."""
        if not self.public:
            raise UnsupportedError(NOT_ELASTIC)
        if self.rank != 0 or not self._token:
            raise UnsupportedError("only rank 0 of an elastic system hands out what joining takes")
        return {ADDRESS_ENV: self.address, TOKEN_ENV: self._token}

    async def invitation(self) -> tuple[str, str]:
        """Where, and with which token, the processes that rank 0 starts join: ``(host:port, token)``."""
        if self.rank != 0 or not self._token:
            raise UnsupportedError("only rank 0 of a system hands out what joining takes")
        return self.address, self._token

    def _init_rpc(self) -> None:
        quiet_cpp_logs()
        options = tensorpipe_options(self._options, {})
        if self.rank == 0:
            store = self._rendezvous_store()
            members = self._members = Membership(store)
            self._add_peer(own_info(0, accelerator().inventory(), self.traits, self._open_beside(store)))
            self._bring_up(lambda: self._start_agent(store, options))
            # The heartbeat runs from now on, each newcomer watched and pinged from its welcome: a worker
            # of the launch that is ready early must hear from rank 0 before the last one has joined.
            self._watch_peers()
            members.open(self._initial, self._shared, public=self.public)
            self._admission = threading.Thread(target=self._admit_newcomers, name="actorch-admission", daemon=True)
            self._admission.start()
            _admitting.add(self)
            self._wait_launch_joined()
        else:
            try:
                with cpp_errors_quiet():
                    store = self._rendezvous_store()
                members = self._members = Membership(store)
                self._join(store, members, options)
            except JoinError:
                raise
            except Exception as exc:  # the store or the agent failed under it: rank 0 went, most likely
                raise JoinError(f"could not join the system at {self.address}: {exc}") from exc
            self._watch_peers()

    def _start_agent(self, store: Any, options: Any) -> None:
        agent = rpc.TensorPipeAgent(store, worker_name(self.rank), self.rank, None, options, {}, [])  # type: ignore[attr-defined]
        rpc.api._init_rpc_states(agent)  # type: ignore[no-untyped-call]

    def _join(self, store: Any, members: Membership, options: Any) -> None:
        """Ask rank 0 to join, meet the members it names, bring the agent up, and wait to be welcomed."""
        timeout = self._options.init_timeout
        me = own_info(self.rank, accelerator().inventory(), self.traits, self._open_beside(store))
        members.ask(me, self._token)
        for info in members.wait_answer(self.rank, timeout):
            self._add_peer(info)
        self._add_peer(me)
        self._bring_up(lambda: self._start_agent(store, options))
        try:
            members.up(self.rank)
            members.wait_ready(self.rank, timeout)
        except BaseException:
            rpc.shutdown(graceful=False)  # the agent is up: take it down, or the process cannot exit
            raise

    def _wait_launch_joined(self) -> None:
        """Rank 0 waits for the launch's own workers (ranks below ``initial``) to have joined."""
        expected = set(range(1, self._initial))
        limit = time.monotonic() + self._options.init_timeout
        with self._admitted:
            while not expected <= self._joined_ranks:
                left = limit - time.monotonic()
                missing = ", ".join(map(str, sorted(expected - self._joined_ranks)))
                if left <= 0:
                    raise RuntimeError(f"actor system failed to start: ranks {missing} did not join in time")
                if self._admission_stop.is_set():  # the launch gave up (a worker died)
                    raise RuntimeError(f"actor system failed to start: ranks {missing} did not join")
                self._admitted.wait(min(left, POLL))

    # ------------------------------------------------------------------ rank 0 admits

    def _admit_newcomers(self) -> None:
        """Rank 0's admission thread: take each request in rank order, one at a time.

        It talks to the store on a connection of its own: a store client
        serves one request at a time, and the thread's waits for the next bell
        (up to ``BELL_WAIT``) would otherwise hold up every other use of the
        store, such as closing it to newcomers when the system ends.
        """
        try:
            own, prefixed = rendezvous_store(self._master, 1, 1, self._options.init_timeout, None)
        except Exception:  # noqa: BLE001 - the shared connection serves, only slower to close
            own, prefixed = None, None
        members = Membership(prefixed) if prefixed is not None else self._members
        assert members is not None
        try:
            self._admit_until_stopped(members)
        finally:
            del own

    def _admit_until_stopped(self, members: Membership) -> None:
        waiting: set[int] = set()  # ranks handed out whose request has not been taken yet
        seen = 1
        bell = 1
        while not self._admission_stop.is_set():
            try:
                if members.wait_bell(bell, BELL_WAIT):
                    bell += 1
                handed = members.handed_out()
                waiting.update(range(seen, handed))
                seen = max(seen, handed)
                for rank in sorted(waiting):
                    if self._admission_stop.is_set():
                        return
                    request = members.request(rank)
                    if request is None:
                        continue  # it holds a rank and has yet to ask (its setup runs first), or it died
                    waiting.discard(rank)
                    self._admit(members, request)
            except Exception:  # the store is gone: the system is closing
                if not self._closing:
                    log.exception("admitting new nodes failed", node=self.rank)
                return

    def _admit(self, members: Membership, request: JoinRequest) -> None:
        """Answer one request; if admitted, welcome the newcomer everywhere and tell it to start."""
        info = request.info
        rank = info.rank
        if self._closing or self._admission_stop.is_set():
            members.answer(rank, "the system is shutting down")
            return
        if not (self._token and request.verify(self._token)):
            why = f"no join token (set {TOKEN_ENV})" if not request.proof else "wrong join token"
            log.warning("node refused", node=self.rank, peer=rank, host=info.host, pid=info.pid, why=why)
            members.answer(rank, why)
            return
        live = [peer for peer in self.peers() if peer.rank not in self._lost_ranks]
        members.answer(rank, None, live)
        limit = time.monotonic() + self._options.init_timeout
        while not members.is_up(rank):
            if time.monotonic() >= limit or self._admission_stop.wait(POLL):
                log.warning("node admitted but never came up", node=self.rank, peer=rank)
                return
        self.welcome(info, announce=False)
        facts = json.dumps(facts_of(info))
        welcomes = [
            (
                peer.rank,
                rpc.rpc_async(worker_name(peer.rank), _welcome, args=(facts,), timeout=self._options.init_timeout),
            )
            for peer in live
            if peer.rank != self.rank
        ]
        for member, welcome in welcomes:
            self._wait_welcomed(member, welcome)
        self._announce(info)
        members.ready(rank)
        with self._admitted:
            self._joined_ranks.add(rank)
            self._admitted.notify_all()

    def _wait_welcomed(self, member: int, welcome: Any) -> None:
        """Wait until ``member`` has met the newcomer, or is lost, or admission ends (the admission thread).

        The newcomer may not serve before every live member knows it: one that
        does not yet refuses its bundles and its watch as a stranger's, and the
        newcomer would count that member lost. A member too starved to answer
        soon answers late, not never, so no timeout of its own ends the wait: a
        dead member fails the call at once, and a frozen one is lost by the
        heartbeats (the call's own timeout, ``init_timeout``, bounds the rest).
        """
        answered = threading.Event()
        welcome.add_done_callback(lambda _: answered.set())
        while not answered.wait(POLL):
            if member in self._lost_ranks or self._admission_stop.is_set():
                return

    # ------------------------------------------------------------------ every member

    def welcome(self, info: NodeInfo, *, announce: bool = True) -> None:
        """Enter newcomer ``info`` in torch's agent and among the peers, watch it; tell the loop if ``announce``.

        Any thread. Rank 0 announces the newcomer itself once every member has met it.
        """
        agent: Any = rpc.api._get_current_rpc_agent()  # type: ignore[attr-defined]
        agent._update_group_membership(rpc.WorkerInfo(worker_name(info.rank), info.rank), [], {}, True)  # type: ignore[attr-defined]
        self._add_peer(info)
        self._watch_peer(info.rank)
        if announce:
            self._announce(info)

    def _announce(self, info: NodeInfo) -> None:
        """Tell this node's loop that ``info`` joined (its listeners: events, the node pool's waits)."""
        self._inbox.post(Joined(info))

    def stop_admitting(self) -> None:
        """On rank 0, take no more newcomers: those still waiting are told the system is shutting down."""
        self._admission_stop.set()
        if self.rank == 0 and self._members is not None and not self._closing:
            with contextlib.suppress(Exception):  # the store is already gone
                self._members.close()
                self._members.ring()  # the admission thread wakes, and stops

    async def close(self) -> None:
        """Take no more newcomers, let the admission thread end (it holds a store connection); leave as all do."""
        await in_daemon_thread(self.end_admission)
        await super().close()

    def end_admission(self) -> None:
        """Take no more newcomers and wait (bounded) until the admission thread has ended (any thread).

        The thread holds a store connection of its own; one still open when
        the process exits, after the store it talks to, aborts the process.
        """
        self.stop_admitting()
        admission = self._admission
        if admission is not None and admission.is_alive() and admission is not threading.current_thread():
            admission.join(BELL_WAIT + 1.0)
