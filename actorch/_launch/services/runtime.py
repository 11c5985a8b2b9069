"""Runtime files: how a running system is found on its host, by ``actorch status`` and ``actorch stop``.

Rank 0 of every system started by ``actorch.run`` writes one small JSON file
while it runs, ``<pid>.json`` in a per-user directory: ``$ACTORCH_RUNTIME_DIR``
if set, else ``$XDG_RUNTIME_DIR/actorch``, else ``actorch-<uid>`` in the
temporary directory. The directory is made private (mode 0700) and a directory
that another user owns, or that others may write, is refused: what it says
decides which process ``actorch stop`` signals. The file is removed when the
system ends; one left by a process that died (or whose pid now belongs to
another process) is ignored and removed by the next reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actorch._base.processes import alive, started

__all__ = [
    "RUNTIME_DIR_ENV",
    "RUNTIME_SCHEMA",
    "Announcement",
    "RunningSystem",
    "running_systems",
    "runtime_dir",
    "status_address",
]

RUNTIME_DIR_ENV = "ACTORCH_RUNTIME_DIR"
"""Environment variable naming the directory of runtime files (else ``$XDG_RUNTIME_DIR/actorch`` or a temp dir)."""
RUNTIME_SCHEMA = 1
"""Version of the runtime file's fields; a reader skips files of a version it does not know."""


def runtime_dir() -> Path:
    """This user's directory of runtime files, made private if it did not exist.

    Raises:
        PermissionError: The directory belongs to another user, or others may write to it.
    """
    chosen = os.environ.get(RUNTIME_DIR_ENV)
    if chosen:
        path = Path(chosen)
    elif os.environ.get("XDG_RUNTIME_DIR") and Path(os.environ["XDG_RUNTIME_DIR"]).is_dir():
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "actorch"
    else:
        path = Path(tempfile.gettempdir()) / f"actorch-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = path.stat()
    if found.st_uid != os.getuid() or found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"the runtime directory {path} belongs to another user or others may write to it; "
            f"set {RUNTIME_DIR_ENV} to a private directory"
        )
    return path


def status_address(host: str, port: int) -> str:
    """``host:port`` as a client on this host reaches it (an address that means every interface: loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104 - mapped away
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class RunningSystem:
    """A system found in the runtime directory.

    Attributes:
        pid: Rank 0's process id (the process that runs ``main``).
        status: Rank 0's status address ``host:port``, or None if it serves none.
        argv: Rank 0's command line (``sys.argv``).
        cwd: Rank 0's working directory.
        started: When it started (seconds since the epoch).
        world_size: How many nodes it started with.
        launcher: The pid of the launcher that started rank 0 (torchrun's agent), if any.
        path: The runtime file.
        pid_start: When rank 0's process started (to tell its pid from a reused one), if known.
    """

    pid: int
    status: str | None
    argv: list[str]
    cwd: str
    started: float
    world_size: int
    launcher: int | None
    path: Path
    pid_start: int | None = None

    def running(self) -> bool:
        """Whether rank 0's process still runs (not gone, not a zombie, its pid not reused)."""
        return alive(self.pid, self.pid_start)

    def launcher_running(self) -> bool:
        """Whether rank 0 has a launcher (torchrun's agent) and it still runs."""
        return self.launcher is not None and alive(self.launcher, None)

    @property
    def script(self) -> str:
        """What rank 0 runs, as a user would recognise it (its script and arguments)."""
        return " ".join(self.argv) or "?"


def running_systems() -> list[RunningSystem]:
    """The systems running on this host for this user, oldest first; stale files are removed."""
    found = []
    for path in sorted(runtime_dir().glob("*.json")):
        try:
            record = json.loads(path.read_text())
            if record.get("schema") != RUNTIME_SCHEMA:
                continue
            system = RunningSystem(
                pid=int(record["pid"]),
                status=record["status"],
                argv=list(record["argv"]),
                cwd=str(record["cwd"]),
                started=float(record["started"]),
                world_size=int(record["world_size"]),
                launcher=record.get("launcher"),
                path=path,
                pid_start=record.get("pid_start"),
            )
            alive = system.running()
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours to read
        if alive:
            found.append(system)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return sorted(found, key=lambda system: system.started)


class Announcement:
    """This process's runtime file while its system runs: written by ``publish``, removed by ``withdraw``."""

    def __init__(self, world_size: int, status: str | None) -> None:
        self.world_size = world_size
        self.status = status
        self.path: Path | None = None

    def __repr__(self) -> str:
        return f"<Announcement {self.path or 'unpublished'} status={self.status}>"

    def publish(self) -> Path:
        """Write the file (atomically, readable by this user only); its path.

        Raises:
            OSError: The runtime directory cannot be made or written.
        """
        directory = runtime_dir()
        pid = os.getpid()
        record: dict[str, Any] = {
            "schema": RUNTIME_SCHEMA,
            "pid": pid,
            "pid_start": started(pid),
            "status": self.status,
            "argv": list(sys.argv),
            "cwd": os.getcwd(),
            "started": time.time(),
            "world_size": self.world_size,
            "launcher": os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None,
        }
        path = directory / f"{pid}.json"
        partial = directory / f".{pid}.json.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(record, file)
        partial.replace(path)
        self.path = path
        return path

    def withdraw(self) -> None:
        """Remove the file (if it was written)."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None
