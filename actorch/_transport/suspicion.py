"""Peers silent past the liveness timeout whose process runs on this machine: starved, or stopped and lost?

A node counts a peer lost once nothing came from it for ``liveness_timeout``
(see ``rpc``). From another machine that silence is all it can know. A peer
on the same machine can be looked at directly (``/proc``): a process that is
gone or stopped (``SIGSTOP``, a debugger) is lost, as is one that runs
nothing (it sleeps with its interpreter held, or is deadlocked); but one that
still runs, on a saturated CPU or in a long call that holds its interpreter,
is only slow. It is suspected rather than lost: looked at again at every
heartbeat, and lost once it stops running or after ``STARVED_LIMIT`` times
the liveness timeout of silence. A process in another network namespace is
judged by its silence alone, since the network may have cut it off.

A process is named across nodes by its machine's boot id and its start time
(``own_process``), so that a pid reused by another process, or one that means
another process in another pid namespace, is never taken for the peer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import structlog

from actorch._transport.base import NodeInfo

__all__ = ["STARVED_LIMIT", "Suspicion", "own_process"]

log = structlog.get_logger("actorch")

STARVED_LIMIT = 10
"""A silent peer whose process still runs on this machine is lost after this many liveness timeouts of silence."""

_RUNNING = frozenset("RD")  # a thread on the CPU or waiting for it, or in uninterruptible I/O: the process moves
_STOPPED = frozenset("tTZX")  # stopped, traced, zombie, dead
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def _stat_fields(pid: int | str, task: str | None = None) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` (of one thread with ``task``) after the command name, state first."""
    text = _read(f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat")
    if text is None:
        return None
    return text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses


def own_process() -> str | None:
    """This process as its machine's kernel knows it: ``<boot id>/<start time>``; None without ``/proc``."""
    boot, fields = _read(_BOOT_ID), _stat_fields("self")
    if boot is None or fields is None:
        return None
    return f"{boot.strip()}/{fields[19]}"


@dataclass(frozen=True)
class _Look:
    """What the kernel said of a process at one moment."""

    cpu_ticks: int  # user and system time of all its threads
    states: str  # one letter per thread


def _look(pid: int, process: str) -> _Look | None:
    """Process ``pid`` now, if it is the one ``process`` names and shares this node's network; else None."""
    boot, _, started = process.partition("/")
    fields = _stat_fields(pid)
    if fields is None or fields[19] != started or boot != (_read(_BOOT_ID) or "").strip():
        return None  # another machine, or the process is gone (its pid may be another's now)
    try:
        if os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net"):
            return None  # another network: it may be cut off rather than slow
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None  # not ours to look at, or gone
    states = "".join(thread[0] for thread in (_stat_fields(pid, task) for task in tasks) if thread)
    return _Look(int(fields[11]) + int(fields[12]), states or fields[0])


class Suspicion:
    """The heartbeat's view of peers silent past the liveness timeout (used from its thread only).

    Args:
        rank: This node's rank (for the log).
        timeout: The liveness timeout, in seconds.
    """

    def __init__(self, rank: int, timeout: float) -> None:
        self._rank = rank
        self._timeout = timeout
        self._looks: dict[int, _Look] = {}  # suspected peers, with what their process showed last

    def __repr__(self) -> str:
        return f"<Suspicion rank={self._rank} suspected={sorted(self._looks)}>"

    def spares(self, peer: NodeInfo | None, silent: float) -> bool:
        """Whether ``peer``, silent for ``silent`` seconds (past the timeout), is still running here: not lost yet."""
        if peer is None or peer.process is None or silent >= STARVED_LIMIT * self._timeout:
            return False
        look = _look(peer.pid, peer.process)
        before = self._looks.get(peer.rank)
        if look is None or _STOPPED & set(look.states):
            return False
        if not (_RUNNING & set(look.states) or (before is not None and look.cpu_ticks > before.cpu_ticks)):
            return False  # it runs nothing: sleeping with its interpreter held, or deadlocked
        if before is None:
            log.info("node silent, but its process runs: suspected, not lost", node=self._rank, peer=peer.rank)
        self._looks[peer.rank] = look
        return True

    def heard(self, rank: int) -> None:
        """``rank`` was heard from again: it is no longer suspected."""
        if self._looks.pop(rank, None) is not None:
            log.info("suspected node answers again", node=self._rank, peer=rank)
