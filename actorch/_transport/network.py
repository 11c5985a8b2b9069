"""Where a node listens: loopback by default, else the interface that routes to the master.

TensorPipe and Gloo pick their listening address from the host name unless
``TP_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` name an interface; on many
machines the host name resolves to loopback, and on a multi-host world that
would leave every node unreachable. Nothing here touches torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
from collections.abc import Iterator

__all__ = ["address_towards", "family", "interface_chosen", "interface_towards", "is_loopback", "listen_socket"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address
_INTERFACE_VARIABLES = ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface."""
    return host in _LOOPBACK


def family(host: str) -> socket.AddressFamily:
    """The address family of ``host`` (IPv6 if it has a colon)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def address_towards(host: str, port: int) -> str:
    """The address to listen on for peers that reach this node as TensorPipe does.

    The IPv4 address of the interface named by ``TP_SOCKET_IFNAME`` if set,
    else loopback's for a loopback ``host``, else the address this machine
    reaches ``host`` from (a UDP socket's ``connect`` only picks a route and a
    source address: nothing is sent).
    """
    chosen = os.environ.get("TP_SOCKET_IFNAME")
    if chosen:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
            address = _interface_address(query, chosen)
        if address is not None:
            return address
    if is_loopback(host):
        return "::1" if host == "::1" else "127.0.0.1"
    with socket.socket(family(host), socket.SOCK_DGRAM) as probe:
        probe.connect((host, port or 1))
        return str(probe.getsockname()[0])


def _interface_address(query: socket.socket, name: str) -> str | None:
    """The IPv4 address of interface ``name``, or None if it has none."""
    request = struct.pack("256s", name.encode()[:15])
    try:
        answer = fcntl.ioctl(query.fileno(), _SIOCGIFADDR, request)
    except OSError:
        return None
    return socket.inet_ntoa(answer[20:24])


def interface_towards(host: str, port: int) -> str | None:
    """The local interface whose IPv4 address this machine uses to reach ``host``, or None.

    A UDP socket's ``connect`` only picks a route and a source address: nothing is sent.
    """
    try:
        with socket.socket(family(host), socket.SOCK_DGRAM) as probe:
            probe.connect((host, port or 1))
            local = probe.getsockname()[0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
            for _, name in socket.if_nameindex():
                if _interface_address(query, name) == local:  # None: no IPv4 address on this interface
                    return name
    except OSError:
        return None
    return None


@contextlib.contextmanager
def interface_chosen(interface: str | None) -> Iterator[None]:
    """Have TensorPipe and Gloo listen on ``interface`` while they start, unless the user chose one.

    The variables are read when the agent starts; they are put back afterwards,
    so that nothing of one world leaks into the process's environment.
    """
    saved = {name: os.environ.get(name) for name in _INTERFACE_VARIABLES}
    if interface is not None:
        for name in _INTERFACE_VARIABLES:
            os.environ.setdefault(name, interface)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def listen_socket(host: str, port: int = 0) -> socket.socket:
    """A socket listening on ``host`` (at a free port by default), for rank 0's store (no port race)."""
    return socket.create_server((host, port), family=family(host))
