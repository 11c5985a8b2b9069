"""Two "hosts" for fault tests: Linux network namespaces joined by a veth pair, and a silent partition.

:func:`host_pair` creates two namespaces, each with its loopback up and one end
of a veth pair addressed in 198.18.0.0/15 (the benchmarking range, never routed
on a real network), and removes them on the way out, failure included. Nothing
is added to the namespace the tests run in: the veth is created inside the
first namespace with its peer placed straight into the second, so parallel runs
cannot collide on interface names, and namespace names carry the creating
process's pid, so :func:`remove_stale` can delete those of runs that died
without cleaning up.

:meth:`HostPair.partition` cuts the link silently: each veth end gets a
``pfifo`` queue with a limit of 0 packets as its root qdisc, so every packet
(TCP data, ACK, FIN, RST, ARP) either end tries to send is dropped before it
reaches the wire. The peers see nothing at all, no error and no close; TCP on
each side just retransmits into the void, as across a dead switch. (A new
connect() across it fails after about 3 s with "no route to host", once ARP
gives up, as on a real shared segment whose peer vanished.)
:meth:`HostPair.heal` removes the two qdiscs and the retransmissions get
through again. ``netem loss 100%`` would be the usual tool, but kernels built
without ``sch_netem`` (the one these tests were written on) refuse it, while
``pfifo`` comes with traffic control itself. Taking the link down is not
silent: a connect() then fails at once with "network unreachable".

Everything here shells out to ``ip`` and ``tc`` (iproute2) and needs root or
CAP_NET_ADMIN plus CAP_SYS_ADMIN; :func:`unavailable_reason` tells why a test
must be skipped, by actually trying.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

PREFIX = "actorch-nt"
"""Start of the names of every namespace this module creates (``{PREFIX}-{pid}-{n}-a``)."""
ADDRESS_A = "198.18.0.1"
ADDRESS_B = "198.18.0.2"
PREFIX_LEN = 30
INTERFACE_A = "veth-a"
INTERFACE_B = "veth-b"
COMMAND_TIMEOUT = 10.0
LINK_TIMEOUT = 5.0

_counter = itertools.count()
_OWNED = re.compile(rf"^{re.escape(PREFIX)}-(\d+)-")


class NetnsError(RuntimeError):
    """An ``ip`` or ``tc`` command failed."""


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found is not None:
        return found
    for folder in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an ``ip``/``tc`` command line (the first word is looked up) and return what it printed."""
    tool = _tool(argv[0])
    if tool is None:
        raise NetnsError(f"no {argv[0]!r} binary on this machine")
    done = subprocess.run(
        [tool, *argv[1:]],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        raise NetnsError(
            f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip() or done.stdout.strip()}"
        )
    return done


def unavailable_reason() -> str | None:
    """Why namespaces, veths and the partition qdisc cannot be used here, or None if they can.

    Probes by creating a throwaway namespace with a veth pair in it and the
    partition qdisc on one end, and deleting it again.
    """
    for name in ("ip", "tc"):
        if _tool(name) is None:
            return f"no {name!r} binary (iproute2) on this machine"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        _run("ip", "netns", "add", probe)
    except (NetnsError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace (needs root or CAP_SYS_ADMIN): {exc}"
    try:
        _run("ip", "-n", probe, "link", "add", "probe-a", "type", "veth", "peer", "name", "probe-b")
        _run("tc", "-n", probe, "qdisc", "replace", "dev", "probe-a", "root", "pfifo", "limit", "0")
    except (NetnsError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot build a veth pair with a dropping qdisc in a namespace: {exc}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def silence_port(port: int, interface: str = "lo", namespace: str | None = None) -> None:
    """Drop, silently, every IPv4 packet that ``interface`` sends to TCP ``port``; the rest goes through.

    What goes to the port vanishes as across a dead switch, while every other
    connection on the interface keeps working: a link that is silent while
    the peer itself answers on another one. An HTB root qdisc sorts packets
    to the port (a ``u32`` filter) into a class whose queue holds 0 packets.
    """
    where = ["-n", namespace] if namespace else []

    def tc(*words: str) -> None:
        _run("tc", *where, *words)

    tc("qdisc", "replace", "dev", interface, "root", "handle", "1:", "htb", "default", "10")
    for leaf in ("10", "20"):
        tc("class", "add", "dev", interface, "parent", "1:", "classid", f"1:{leaf}", "htb", "rate", "10gbit")
    tc("qdisc", "add", "dev", interface, "parent", "1:20", "pfifo", "limit", "0")
    match = ["u32", "match", "ip", "protocol", "6", "0xff", "match", "ip", "dport", str(port), "0xffff"]
    tc("filter", "add", "dev", interface, "parent", "1:", "protocol", "ip", "prio", "1", *match, "flowid", "1:20")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces() -> list[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    listed = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def pids_in(namespace: str) -> list[int]:
    """Pids of the processes that live in ``namespace``."""
    listed = _run("ip", "netns", "pids", namespace, check=False).stdout
    return [int(word) for word in listed.split() if word.isdigit()]


def _kill_and_delete(namespace: str) -> list[int]:
    """SIGKILL every process in ``namespace``, delete it, and return the pids that were killed."""
    killed = []
    for pid in pids_in(namespace):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    _run("ip", "netns", "del", namespace, check=False)
    return killed


def remove_stale() -> list[str]:
    """Delete namespaces of this module left by runs whose process is gone; return their names."""
    removed = []
    for name in namespaces():
        match = _OWNED.match(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        _kill_and_delete(name)
        removed.append(name)
    return removed


@dataclass(frozen=True)
class Host:
    """One side of the pair: a namespace, its end of the veth, and that end's address."""

    namespace: str
    interface: str
    address: str

    def exec_argv(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """``argv`` run inside this host's namespace, with ``env`` added to the environment it inherits."""
        assignments = [f"{key}={value}" for key, value in (env or {}).items()]
        ip = _tool("ip") or "ip"
        return [ip, "netns", "exec", self.namespace, "env", *assignments, *argv]

    def operstate(self) -> str:
        """The kernel's operational state of this host's veth end (``UP`` once it carries traffic)."""
        shown = _run("ip", "-n", self.namespace, "-j", "link", "show", "dev", self.interface).stdout
        state: str = json.loads(shown)[0]["operstate"]
        return state

    def wait_until_running(self, timeout: float = LINK_TIMEOUT) -> None:
        """Wait until this host's veth end is operationally up (IFF_RUNNING), not only set up.

        The kernel turns a new veth's carrier on in a deferred task, rate-limited
        to about once a second, so an interface can be up but not yet running
        for up to a second. TensorPipe only sees running interfaces (libuv lists
        no others): asked for one that is not running yet, torch falls back to
        listening on 127.0.0.1, and the other host's connections to it are
        refused at start ("Followers ['node1'] timed out in _all_gather ...
        ECONNREFUSED"). Without this wait, about 1 start in 20 failed so.
        """
        deadline = time.monotonic() + timeout
        while (state := self.operstate()) != "UP":
            if time.monotonic() >= deadline:
                raise NetnsError(f"{self.interface} in {self.namespace} is still {state} after {timeout} s")
            time.sleep(0.02)

    def pids(self) -> list[int]:
        """Pids of the processes running in this host's namespace."""
        return pids_in(self.namespace)

    def counters(self) -> dict[str, int]:
        """Packets sent and received by this host's veth end (``tx_packets``, ``rx_packets``)."""
        shown = _run("ip", "-n", self.namespace, "-j", "-s", "link", "show", "dev", self.interface).stdout
        stats = json.loads(shown)[0]["stats64"]
        return {"tx_packets": int(stats["tx"]["packets"]), "rx_packets": int(stats["rx"]["packets"])}

    def dropped(self) -> int:
        """Packets the partition qdisc of this host's veth end has dropped (0 without one)."""
        shown = _run("tc", "-n", self.namespace, "-s", "qdisc", "show", "dev", self.interface, "root").stdout
        found = re.search(r"dropped (\d+)", shown)
        return int(found.group(1)) if found is not None and "pfifo" in shown else 0


@dataclass
class HostPair:
    """Two namespaces joined by a veth pair; see :func:`host_pair`."""

    a: Host
    b: Host
    partitioned_at: float | None = None
    torn_down: bool = False
    killed: list[int] = field(default_factory=list)

    @property
    def hosts(self) -> tuple[Host, Host]:
        """Both hosts, ``a`` first."""
        return (self.a, self.b)

    def partition(self, senders: Sequence[Host] | None = None) -> float:
        """Drop every packet between the hosts from now on, silently.

        The time is taken before the first qdisc goes in, so a delay measured
        from it is never shorter than the real one.

        Args:
            senders: Drop only what these hosts send (a one-way partition);
                both by default.

        Returns:
            When the partition began (``time.monotonic()``).
        """
        started = time.monotonic()
        for host in self.hosts if senders is None else senders:
            _run("tc", "-n", host.namespace, "qdisc", "replace", "dev", host.interface, "root", "pfifo", "limit", "0")
        self.partitioned_at = started
        return started

    def heal(self) -> None:
        """Let packets through again (what TCP retransmits then arrives)."""
        for host in self.hosts:
            _run("tc", "-n", host.namespace, "qdisc", "del", "dev", host.interface, "root", check=False)
        self.partitioned_at = None

    def kill_processes(self) -> list[int]:
        """SIGKILL whatever still runs in either namespace and return those pids."""
        killed = []
        for host in self.hosts:
            for pid in host.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        self.killed.extend(killed)
        return killed

    def teardown(self) -> None:
        """Kill what runs in the namespaces and delete them (the veth pair goes with them)."""
        if self.torn_down:
            return
        self.torn_down = True
        for host in self.hosts:
            self.killed.extend(_kill_and_delete(host.namespace))


def create_pair() -> HostPair:
    """Create two namespaces joined by a veth pair, addressed and up (see the module docstring)."""
    base = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
    pair = HostPair(Host(f"{base}-a", INTERFACE_A, ADDRESS_A), Host(f"{base}-b", INTERFACE_B, ADDRESS_B))
    created: list[str] = []
    try:
        for host in pair.hosts:
            _run("ip", "netns", "add", host.namespace)
            created.append(host.namespace)
            _run("ip", "-n", host.namespace, "link", "set", "lo", "up")
        a, b = pair.hosts
        _run(
            "ip", "-n", a.namespace, "link", "add", a.interface,
            "type", "veth", "peer", "name", b.interface, "netns", b.namespace,
        )  # fmt: skip
        for host in pair.hosts:
            _run("ip", "-n", host.namespace, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", host.interface)
            _run("ip", "-n", host.namespace, "link", "set", host.interface, "up")
        for host in pair.hosts:
            host.wait_until_running()
    except BaseException:
        for namespace in created:
            _run("ip", "netns", "del", namespace, check=False)
        raise
    return pair


@contextlib.contextmanager
def host_pair() -> Iterator[HostPair]:
    """Two fresh hosts for the duration of the block; stale ones of dead runs are removed first."""
    remove_stale()
    pair = create_pair()
    try:
        yield pair
    finally:
        pair.teardown()
