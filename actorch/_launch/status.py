"""The live status of a running system: gathered from every node, served read-only by rank 0 over HTTP.

Rank 0 serves it unless told not to (``run(status=False)``,
``ACTORCH_STATUS_PORT=off``), on a free loopback port unless told otherwise
(``status_port``, ``status_host``), and writes the address into its runtime
file. The server runs on rank 0's event loop: until a client connects it is
one listening socket there, which adds nothing to the handling of messages. It
answers ``GET /status`` with the whole system as JSON, ``GET /metrics`` with
Prometheus' text format when ``prometheus_client`` is installed, and refuses
everything else: it changes nothing in the system. ``actorch status`` is its
client. The JSON carries ``"schema": STATUS_SCHEMA``; docs/operations.md lists
every field, and a change to them raises the version.
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import time
from typing import TYPE_CHECKING, Any

from actorch._transport.network import family

if TYPE_CHECKING:
    from actorch._actors.host import ActorHost

__all__ = [
    "READABLE_SCHEMAS",
    "STATUS_OFF",
    "STATUS_PORT_ENV",
    "STATUS_SCHEMA",
    "StatusServer",
    "check_status_port",
    "gather_status",
]

STATUS_PORT_ENV = "ACTORCH_STATUS_PORT"
"""Environment variable naming rank 0's status port (as ``run(status_port=...)``), or ``off`` for none."""
STATUS_OFF = "off"
"""``ACTORCH_STATUS_PORT``'s value that serves no status (``actorch run --no-status``), as ``run(status=False)``."""
STATUS_SCHEMA = 2
"""Version of the status JSON's fields (its ``schema`` field); docs/operations.md lists them.

2 added each node's ``resources``, ``free``, ``held``, ``owner``, ``parent`` and ``pool``.
"""
READABLE_SCHEMAS = (1, 2)
"""The versions ``actorch status`` reads: a system of the version before shows without the fields added since."""
NODE_TIMEOUT = 2.0
"""Seconds a node has to answer a status request; one that does not is shown as not answering."""
_MAX_REQUEST = 8192


async def gather_status(host: ActorHost) -> dict[str, Any]:
    """Every node's status as rank 0 sees it now; lost nodes and those that did not answer say so."""
    # Imported here: actorch status and stop read this module's constants without importing torch.
    from actorch._actors.service import NodeService  # noqa: PLC0415

    node = host.node

    async def one(rank: int) -> dict[str, Any]:
        if rank in node.lost:
            return {"rank": rank, "lost": node.lost[rank]}
        if rank == host.rank:
            return host.status()
        try:
            async with asyncio.timeout(NODE_TIMEOUT):
                found: dict[str, Any] = await host.services[rank].call(NodeService.status)
                return found
        except Exception as exc:  # noqa: BLE001 - shown in the table, not raised
            return {"rank": rank, "unanswered": repr(exc)}

    nodes = await asyncio.gather(*(one(rank) for rank in node.ranks()))
    return {"schema": STATUS_SCHEMA, "time": time.time(), "world_size": node.world_size, "nodes": list(nodes)}


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
    """Rank 0's read-only HTTP endpoint for ``actorch status`` (and Prometheus, when installed)."""

    def __init__(self, host: ActorHost, address: str, port: int) -> None:
        self._host = host
        self._address = address
        self._port = port
        self._server: asyncio.Server | None = None

    def __repr__(self) -> str:
        return f"<StatusServer {self._address}:{self.port}>"

    @property
    def port(self) -> int:
        """The port it listens on (the one asked, or the one the system chose for 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        """Listen; ``OSError`` if the port is taken."""
        self._server = await asyncio.start_server(self._serve, self._address, self._port)
        self._host.node.log.info("status served", address=self._address, port=self.port)

    async def close(self) -> None:
        """Stop listening and drop open connections."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(NODE_TIMEOUT * 2):
                head = await reader.readuntil(b"\r\n\r\n")
            status, kind, body = await self._answer(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            status, kind, body = "400 Bad Request", "text/plain", b"a status request is GET /status\n"
        try:
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, head: bytes) -> tuple[str, str, bytes]:
        """The reply to one request: the status, the metrics, or a refusal."""
        if len(head) > _MAX_REQUEST:
            return "431 Request Header Fields Too Large", "text/plain", b"request too large\n"
        method, _, rest = head.decode("latin-1").partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"read-only: only GET /status and GET /metrics\n"
        if path == "/status":
            return "200 OK", "application/json", json.dumps(await gather_status(self._host)).encode()
        if path == "/metrics":
            from actorch._launch.prometheus import metrics_text  # noqa: PLC0415 - an optional dependency

            try:
                text = metrics_text(await gather_status(self._host))
            except ImportError:
                return "501 Not Implemented", "text/plain", b"install actorch[metrics] for /metrics\n"
            return "200 OK", "text/plain; version=0.0.4; charset=utf-8", text
        return "404 Not Found", "text/plain", b"only GET /status and GET /metrics\n"
