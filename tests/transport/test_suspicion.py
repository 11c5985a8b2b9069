"""A silent peer on this machine: spared while its process runs, lost once it is stopped, asleep or gone.

The peers here are plain child processes, looked at through ``/proc`` as the
heartbeat looks at a node's process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from actorch._launch.options.system_options import SystemOptions
from actorch._transport.base import NodeInfo
from actorch._transport.suspicion import STARVED_LIMIT, Suspicion, own_process

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")

TIMEOUT = 1.0
SILENT = 1.5  # past the timeout


def identity(pid: int) -> str:
    """``pid``'s process as ``own_process`` names it, read here by hand."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    started = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    return f"{boot}/{started}"


def settle(pid: int, states: str) -> None:
    """Wait until the kernel shows ``pid`` in one of ``states`` (a signal takes effect when it is next scheduled)."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in states:
                return
        except OSError:
            return  # gone
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached state {states}")


def peer_of(child: subprocess.Popen[str], process: str | None = "") -> NodeInfo:
    """Node 1 running as ``child``; its process identity read from /proc unless given."""
    named = identity(child.pid) if process == "" else process
    return NodeInfo(1, "node1", "here", child.pid, process=named)


@pytest.fixture
def child() -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(code: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", f"print('ready', flush=True)\n{code}"], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


BUSY = "while True: pass"
ASLEEP = "import time\ntime.sleep(60)"


def test_own_process_names_this_process_by_boot_and_start_time() -> None:
    assert own_process() == identity(os.getpid())


def test_suspicion_spares_a_silent_peer_whose_process_runs(child) -> None:
    running = child(BUSY)
    suspicion = Suspicion(0, TIMEOUT)
    assert suspicion.spares(peer_of(running), SILENT)
    assert suspicion.spares(peer_of(running), SILENT + 1.0)


def test_suspicion_loses_a_running_peer_silent_past_its_limit(child) -> None:
    running = child(BUSY)
    assert not Suspicion(0, TIMEOUT).spares(peer_of(running), STARVED_LIMIT * TIMEOUT)


def test_the_reliability_page_states_and_explains_how_long_a_running_peer_is_spared() -> None:
    page = (Path(__file__).parents[2] / "docs" / "reliability.md").read_text()
    by_default = STARVED_LIMIT * SystemOptions().liveness_timeout
    times = "\N{MULTIPLICATION SIGN}"
    assert f"after {STARVED_LIMIT} {times} `liveness_timeout` ({by_default:g} s by default) of silence" in page
    assert f"### Why a running peer is spared {STARVED_LIMIT} {times} `liveness_timeout`" in page


def test_suspicion_loses_a_stopped_peer(child) -> None:
    stopped = child(BUSY)
    os.kill(stopped.pid, signal.SIGSTOP)
    settle(stopped.pid, "T")
    try:
        assert not Suspicion(0, TIMEOUT).spares(peer_of(stopped), SILENT)
    finally:
        os.kill(stopped.pid, signal.SIGCONT)


def test_suspicion_loses_a_peer_that_runs_nothing(child) -> None:
    asleep = child(ASLEEP)
    settle(asleep.pid, "S")  # on a loaded machine it may still be on its way from print() to sleep()
    assert not Suspicion(0, TIMEOUT).spares(peer_of(asleep), SILENT)


def test_suspicion_loses_a_peer_whose_process_is_dead_or_a_zombie(child) -> None:
    dying = child(BUSY)
    peer = peer_of(dying)
    dying.kill()
    settle(dying.pid, "ZX")
    suspicion = Suspicion(0, TIMEOUT)
    assert not suspicion.spares(peer, SILENT)  # a zombie until reaped
    dying.wait()
    assert not suspicion.spares(peer, SILENT)


def test_suspicion_judges_by_silence_alone_a_peer_it_cannot_identify(child) -> None:
    running = child(BUSY)
    boot, _, started = identity(running.pid).partition("/")
    suspicion = Suspicion(0, TIMEOUT)
    assert not suspicion.spares(peer_of(running, None), SILENT)  # its kernel said nothing of it
    assert not suspicion.spares(peer_of(running, f"{boot}/{int(started) + 1}"), SILENT)  # its pid is another's
    assert not suspicion.spares(peer_of(running, f"another-machine/{started}"), SILENT)
    assert not suspicion.spares(None, SILENT)  # not a node of the world


def test_suspicion_loses_a_spared_peer_once_its_process_stops(child) -> None:
    running = child(BUSY)
    suspicion = Suspicion(0, TIMEOUT)
    assert suspicion.spares(peer_of(running), SILENT)
    os.kill(running.pid, signal.SIGSTOP)
    settle(running.pid, "T")
    try:
        assert not suspicion.spares(peer_of(running), SILENT + 0.5)
    finally:
        os.kill(running.pid, signal.SIGCONT)


def test_suspicion_of_a_peer_ends_when_it_is_heard_from(child) -> None:
    running = child(BUSY)
    suspicion = Suspicion(0, TIMEOUT)
    assert suspicion.spares(peer_of(running), SILENT)
    assert repr(suspicion) == "<Suspicion rank=0 suspected=[1]>"
    suspicion.heard(1)
    assert repr(suspicion) == "<Suspicion rank=0 suspected=[]>"
