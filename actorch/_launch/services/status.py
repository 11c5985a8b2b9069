"""The live status of a running system: gathered from every node, served read-only by rank 0 over HTTP.

Rank 0 serves it unless told not to (``run(status=False)``,
``ACTORCH_STATUS_PORT=off``), on a free loopback port unless told otherwise
(``status_port``, ``status_host``), and writes the address into its runtime
file. It answers ``GET /status`` with the whole system as JSON, ``GET
/metrics`` with Prometheus' text format when ``prometheus_client`` is
installed, ``GET /stacks`` with where every node is, line by line, and refuses
everything else: it changes nothing in the system. ``actorch status`` and
``actorch stacks`` are its clients. The JSON carries ``"schema":
STATUS_SCHEMA``; docs/operations.md lists every field, and a change to them
raises the version.

The server is a thread of rank 0, not a part of its event loop, because
``/stacks`` must answer when a loop is blocked: rank 0's own (an actor there,
or ``main``, that never yields) or any other node's. Idle, it is one thread
blocked in ``accept``, which adds nothing to the handling of messages; each
request gets a thread of its own. ``/status`` is gathered on the loop (the
thread waits for it, bounded): each node's status comes through its node
service, and a node that does not answer in time is asked how its loop is
from a thread instead. ``/stacks`` never touches a loop: rank 0 reads its own
node from this thread, and asks every other node through its transport's
threads (``Transport.ask_off_loop``: with torch RPC, a plain RPC function
served by one of its thread pool's threads). That reuses the connections and
the authentication the system already has, where a socket of each node's own
would need a port, an address published somewhere, and a check of its own
of who connects. A node that does not answer within ``STACKS_TIMEOUT`` is
reported as such.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import json
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from actorch._transport.network import family

if TYPE_CHECKING:
    from actorch._actors.node.host import ActorHost

__all__ = [
    "READABLE_SCHEMAS",
    "STACKS_TIMEOUT",
    "STATUS_SCHEMA",
    "StatusServer",
    "check_status_port",
    "gather_stacks",
    "gather_status",
]

STATUS_SCHEMA = 5
"""Version of the status JSON's fields (its ``schema`` field); docs/operations.md lists them.

2 added each node's ``resources``, ``free``, ``held``, ``owner``, ``parent`` and ``pool``.
3 added each node's ``loop``, each actor's ``handlers``, ``queued_seconds`` and
``queued_callers``, and the system's ``wait_cycles``.
4 added each node's ``statistics.paths`` and ``loop.lags``, each endpoint's
``waits``, and a last histogram bucket whose bound is null.
5 added each actor's ``hooks`` (its ``handled`` counts its endpoints' messages
alone, as before), and, in the stacks, each frame's ``user`` and each thread's ``loop``.
"""
READABLE_SCHEMAS = (1, 2, 3, 4, 5)
"""The versions ``actorch status`` reads: a system of the version before shows without the fields added since."""
NODE_TIMEOUT = 2.0
"""Seconds a node has to answer a status request; one that does not is shown as not answering."""
STACKS_TIMEOUT = 5.0
"""Seconds a node has to say where it is (``actorch stacks``); one that does not is shown as not answering."""
LOOP_TIMEOUT = 1.0
"""Seconds a node whose loop did not give its status has to say, from a thread, how its loop is."""
_MAX_REQUEST = 8192


async def gather_status(host: ActorHost) -> dict[str, Any]:
    """Every node's status as rank 0 sees it now; lost nodes and those that did not answer say so.

    A node whose loop did not answer in time is asked how its loop is from a
    thread (its ``loop``: a blocked one is far ``behind``). Who waits on whom
    is put together from every node's mailboxes (``waits``): each running
    handler gets ``waits_on`` (the actors its calls wait at), and
    ``wait_cycles`` lists every cycle of handlers waiting on each other.
    """
    # Imported here: actorch status and stop read this module's constants without importing torch.
    from actorch._actors.node.service import NodeService  # noqa: PLC0415
    from actorch._engine.waits import WaitGraph  # noqa: PLC0415

    async def one(rank: int) -> dict[str, Any]:
        if rank in host.lost:
            return {"rank": rank, "lost": host.lost[rank]}
        if rank == host.rank:
            return host.status()
        try:
            async with asyncio.timeout(NODE_TIMEOUT):
                found: dict[str, Any] = await host.services[rank].call(NodeService.status)
                return found
        except Exception as exc:  # noqa: BLE001 - shown in the table, not raised
            unanswered: dict[str, Any] = {"rank": rank, "unanswered": repr(exc)}
        try:
            async with asyncio.timeout(LOOP_TIMEOUT + 1.0):
                answer = await asyncio.to_thread(host.ask_off_loop, rank, "loop", LOOP_TIMEOUT)
            unanswered["loop"] = answer["loop"]
        except Exception:  # noqa: BLE001, S110 - its threads do not answer either: unanswered says it all
            pass
        return unanswered

    nodes = await asyncio.gather(*(one(rank) for rank in host.ranks()))
    actors = [actor for each in nodes for actor in each.get("actors", ())]
    graph = WaitGraph.of(actors)
    for actor in actors:
        for handler in actor.get("handlers", ()):
            handler["waits_on"] = graph.waits_on(handler["key"])
    return {
        "schema": STATUS_SCHEMA,
        "time": time.time(),
        "world_size": host.world_size,
        "nodes": list(nodes),
        "wait_cycles": graph.cycles(),
    }


def gather_stacks(host: ActorHost) -> dict[str, Any]:
    """Where every node is now (``Node.answer_off_loop``), read on threads only: call it off the loop.

    Rank 0's own node is read from this thread; every other one is asked
    through the transport's threads, all at once, each within
    ``STACKS_TIMEOUT``. Lost nodes say so; one that did not answer says why.
    """
    ranks, lost = host.ranks(), dict(host.lost)
    asked = [rank for rank in ranks if rank not in lost and rank != host.rank]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(asked))))
    try:
        futures = {rank: pool.submit(host.ask_off_loop, rank, "stacks", STACKS_TIMEOUT) for rank in asked}
        found = {host.rank: host.answer_off_loop("stacks")}
        concurrent.futures.wait(futures.values(), timeout=STACKS_TIMEOUT + 1.0)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    answers = []
    for rank in ranks:
        if rank in lost:
            answers.append({"rank": rank, "lost": lost[rank]})
        elif rank in found:
            answers.append(found[rank])
        else:
            future = futures[rank]
            if not future.done():
                answers.append({"rank": rank, "unanswered": f"no answer within {STACKS_TIMEOUT:g} s"})
            elif future.exception() is not None:
                answers.append({"rank": rank, "unanswered": repr(future.exception())})
            else:
                answers.append(future.result())
    return {"schema": STATUS_SCHEMA, "time": time.time(), "world_size": host.world_size, "nodes": answers}


def check_status_port(host: str, port: int) -> None:
    """Fail now, before any worker starts, if rank 0 could not serve the status at ``host:port``.

    It binds as the server will (address reuse on, so a port in TIME_WAIT
    passes) and lets go at once; port 0 always passes.

    Raises:
        OSError: The port is taken, or the address is not this host's; the message says which.
    """
    with socket.socket(family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be used ({exc.strerror or exc})"
            raise OSError(exc.errno, f"status port {port} on {host} {why}") from None


class StatusServer:
    """Rank 0's read-only HTTP endpoint for ``actorch status`` and ``actorch stacks`` (and Prometheus), on a thread."""

    def __init__(self, host: ActorHost, address: str, port: int) -> None:
        self._host = host
        self._address = address
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<StatusServer {self._address}:{self.port}>"

    @property
    def port(self) -> int:
        """The port it listens on (the one asked, or the one the system chose for 0)."""
        if self._socket is None:
            return self._port
        port: int = self._socket.getsockname()[1]
        return port

    async def start(self) -> None:
        """Listen, and serve from a thread of its own; ``OSError`` if the port is taken."""
        self._loop = asyncio.get_running_loop()
        self._socket = socket.create_server((self._address, self._port), family=family(self._address))
        self._thread = threading.Thread(target=self._accept, name="actorch-status", daemon=True)
        self._thread.start()
        self._host.log.info("status served", address=self._address, port=self.port)

    async def close(self) -> None:
        """Stop listening; requests being answered end on their own threads."""
        listening, self._socket = self._socket, None
        if listening is None:
            return
        with contextlib.suppress(OSError):
            listening.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept()
        listening.close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, NODE_TIMEOUT)

    def _accept(self) -> None:
        while (listening := self._socket) is not None:
            try:
                connection, _ = listening.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(connection,), name="actorch-status-request", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(NODE_TIMEOUT * 2)
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) <= _MAX_REQUEST:
                    chunk = connection.recv(4096)
                    if not chunk:
                        break
                    head += chunk
            except OSError:
                head = b""
            if b"\r\n\r\n" in head or len(head) > _MAX_REQUEST:
                status, kind, body = self._answer(head)
            else:
                status, kind, body = "400 Bad Request", "text/plain", b"a status request is GET /status\n"
            with contextlib.suppress(OSError):
                connection.sendall(
                    f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n".encode()
                    + body
                )

    def _answer(self, head: bytes) -> tuple[str, str, bytes]:
        """The reply to one request: the status, the metrics, the stacks, or a refusal."""
        if len(head) > _MAX_REQUEST:
            return "431 Request Header Fields Too Large", "text/plain", b"request too large\n"
        method, _, rest = head.decode("latin-1").partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"read-only: only GET /status, /metrics and /stacks\n"
        if path == "/stacks":
            return "200 OK", "application/json", json.dumps(gather_stacks(self._host)).encode()
        if path not in ("/status", "/metrics"):
            return "404 Not Found", "text/plain", b"only GET /status, /metrics and /stacks\n"
        return self._gathered(path)

    def _gathered(self, path: str) -> tuple[str, str, bytes]:
        """The reply to ``GET /status`` or ``GET /metrics``: gathered on rank 0's loop, if it takes it up."""
        status = self._status()
        if status is None:
            behind = self._host.loop_behind()
            return (
                "503 Service Unavailable",
                "text/plain",
                f"rank 0's event loop did not answer (its last probe is {behind:.1f} s overdue): "
                "something blocks it; actorch stacks shows where\n".encode(),
            )
        if path == "/status":
            return "200 OK", "application/json", json.dumps(status).encode()
        from actorch._launch.services.prometheus import metrics_text  # noqa: PLC0415 - an optional dependency

        try:
            text = metrics_text(status)
        except ImportError:
            return "501 Not Implemented", "text/plain", b"install actorch[metrics] for /metrics\n"
        return "200 OK", "text/plain; version=0.0.4; charset=utf-8", text

    def _status(self) -> dict[str, Any] | None:
        """The status gathered on rank 0's loop, or None if the loop did not take it up in time."""
        assert self._loop is not None
        try:
            future = asyncio.run_coroutine_threadsafe(gather_status(self._host), self._loop)
        except RuntimeError:  # the loop is closed
            return None
        try:
            return future.result(NODE_TIMEOUT + LOOP_TIMEOUT + 2.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return None
