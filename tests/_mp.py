"""Helpers for the multi-process tests: run a script of ``tests/mp_scripts`` in its own session.

Every script runs as ``python tests/mp_scripts/<name>.py ...`` in a new session
(so its process group holds rank 0, the workers it spawns and their helpers),
with a unique marker in its environment that every descendant inherits. A run
that outlives its timeout is killed as a whole group, so a hang becomes a test
failure and leaves no orphan. After each run the helpers look for processes
that are still alive in the group or carry the marker, and kill them, so a
test can assert that none were left.

Scripts report what they observed as ``RESULT {json}`` lines on stdout.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = TESTS / "mp_scripts"
MARKER_ENV = "ACTORCH_MP_TEST_MARKER"
RESULT_PREFIX = "RESULT "
RETURNED_PREFIX = "RETURNED "
LEFTOVER_GRACE = 5.0
"""Seconds processes may take to disappear after rank 0 exited (zombies being reaped, helpers ending)."""

# A run must not inherit a world from an enclosing torchrun, nor quiet knobs the tests check.
_SCRUBBED = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "TORCH_CPP_LOG_LEVEL",
    "ACTORCH_LOG_LEVEL",
)

CPP_WARNING = re.compile(r"^\s*\[W", re.MULTILINE)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses every connection while the block runs.

    Bound and never listening: a port merely found free could meanwhile be taken
    by a node of a test running beside this one, whose TensorPipe listener
    aborts its process on bytes that are not TensorPipe's.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def script_env(marker: str) -> dict[str, str]:
    """The environment of a script run: ours, scrubbed, with the marker and the repo importable."""
    env = {key: value for key, value in os.environ.items() if key not in _SCRUBBED}
    env[MARKER_ENV] = marker
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    return fields[0], int(fields[2])


def pid_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie waiting to be reaped)."""
    stat = _stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def _has_marker(pid: int, marker: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_ENV}={marker}".encode() in environ.split(b"\0")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def live_processes(marker: str, pgid: int | None) -> list[int]:
    """Pids of live (not zombie) processes in group ``pgid`` or carrying ``marker``."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        if (pgid is not None and stat[1] == pgid) or _has_marker(pid, marker):
            found.append(pid)
    return found


def kill_all(marker: str, pgid: int | None) -> None:
    """SIGKILL the whole group and every process carrying ``marker``."""
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in live_processes(marker, pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def leftovers_after(marker: str, pgid: int | None, grace: float = LEFTOVER_GRACE) -> list[str]:
    """Wait up to ``grace`` seconds for the run's processes to go; describe (and kill) any that stay."""
    deadline = time.monotonic() + grace
    while True:
        alive = live_processes(marker, pgid)
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    described = [f"pid {pid}: {_cmdline(pid)}" for pid in alive]
    if alive:
        kill_all(marker, pgid)
    return described


@dataclass
class Finished:
    """What a script run did (``ended_at`` is the ``time.monotonic()`` when its output closed)."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    ended_at: float
    leftovers: list[str] = field(default_factory=list)

    def report(self, tail: int = 6000) -> str:
        """A description for assertion messages."""
        return (
            f"\n--- {' '.join(self.argv)}\n"
            f"returncode={self.returncode} timed_out={self.timed_out} seconds={self.seconds:.1f} "
            f"leftovers={self.leftovers}\n"
            f"--- stdout (tail)\n{self.stdout[-tail:]}\n--- stderr (tail)\n{self.stderr[-tail:]}"
        )

    def results(self) -> dict[str, dict[str, Any]]:
        """The ``RESULT`` records by check name (the last one wins)."""
        found = {}
        for line in self.stdout.splitlines():
            if line.startswith(RESULT_PREFIX):
                record = json.loads(line[len(RESULT_PREFIX) :])
                found[record["check"]] = record
        return found

    def result(self, check: str) -> dict[str, Any]:
        """The record of ``check``; fails the test if it is missing or reports a failure."""
        record = self.results().get(check)
        assert record is not None, f"the script printed no result for {check!r}{self.report()}"
        assert "failed" not in record, (
            f"check {check!r} raised {record['failed']}\n{record.get('traceback', '')}{self.report(2000)}"
        )
        return record

    def logs(self, event: str) -> list[dict[str, Any]]:
        """The JSON log records of ``event`` that every process of the run wrote to stderr (not a terminal)."""
        records = []
        for line in self.stderr.splitlines():
            if line.startswith("{") and f'"event": {json.dumps(event)}' in line:
                with contextlib.suppress(ValueError):  # a line two processes wrote into each other
                    records.append(json.loads(line))
        return [record for record in records if record.get("event") == event]

    def returned(self) -> Any:
        """The JSON value after ``RETURNED`` (what ``actorch.run`` returned), or fail."""
        for line in self.stdout.splitlines():
            if line.startswith(RETURNED_PREFIX):
                return json.loads(line[len(RETURNED_PREFIX) :])
        raise AssertionError(f"the script printed no RETURNED line{self.report()}")

    def assert_clean_exit(self, returncode: int = 0) -> None:
        """Exited by itself with ``returncode`` and left no process behind."""
        assert not self.timed_out, f"the run hung and was killed{self.report()}"
        assert self.returncode == returncode, f"expected exit code {returncode}{self.report()}"
        assert not self.leftovers, f"processes were left behind{self.report()}"


class Script:
    """A script run in its own session; call :meth:`finish` (always) to collect it."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.marker = uuid.uuid4().hex
        self.argv = argv
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**script_env(self.marker), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
        self.pgid = self.proc.pid  # the session leader leads its group

    def signal_leader(self, sig: int) -> None:
        """Send ``sig`` to rank 0's process only."""
        os.kill(self.proc.pid, sig)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the whole process group, as a terminal does on Ctrl-C."""
        os.killpg(self.pgid, sig)

    def finish(self, timeout: float) -> Finished:
        """Wait up to ``timeout`` seconds for the run to end (killing it all past that) and collect it."""
        timed_out = False
        try:
            stdout, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_all(self.marker, self.pgid)
            try:
                stdout, stderr = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a descendant outside the group still holds the pipes
                self.proc.kill()
                stdout, stderr = "", "(output lost: the pipes stayed open after the kill)"
        ended_at = time.monotonic()
        leftovers = leftovers_after(self.marker, self.pgid)
        return Finished(
            self.argv, self.proc.returncode, stdout, stderr, ended_at - self.started, timed_out, ended_at, leftovers
        )

    def kill(self) -> None:
        """Kill everything this run started (for cleanup after a failed test)."""
        kill_all(self.marker, self.pgid)
        if self.proc.returncode is None:
            try:
                self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def script_argv(name: str, *args: str) -> list[str]:
    """``python tests/mp_scripts/<name> args...``."""
    return [sys.executable, str(SCRIPTS / name), *args]


def torchrun_argv(name: str, *args: str, nproc: int = 2, port: int | None = None) -> list[str]:
    """``python -m torch.distributed.run`` launching ``name`` on ``nproc`` local processes."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port if port is not None else free_port()),
        str(SCRIPTS / name),
        *args,
    ]


def start_world(name: str, world_size: int, *args: str) -> list[Script]:
    """Start ``tests/mp_scripts/<name>`` once per rank with torchrun's variables, each in its own session.

    Unlike ``actorch.run(world_size=N)``, no rank is the parent of another, so
    a test sees every rank's own exit code, and rank 0 kills no lost worker.
    """
    port = str(free_port())
    return [
        Script(
            script_argv(name, *args),
            env={
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
        )
        for rank in range(world_size)
    ]


def finish_all(scripts: list[Script], timeout: float) -> list[Finished]:
    """Collect every script at once, so that each one's ``ended_at`` is when it really ended."""
    with ThreadPoolExecutor(len(scripts)) as pool:
        return list(pool.map(lambda script: script.finish(timeout), scripts))


def run_script(name: str, *args: str, timeout: float = 90.0) -> Finished:
    """Run ``tests/mp_scripts/<name>`` to its end (or kill it all after ``timeout`` s) and collect it."""
    return Script(script_argv(name, *args)).finish(timeout)


def run_argv(argv: list[str], timeout: float = 90.0) -> Finished:
    """Run an arbitrary command line like :func:`run_script`."""
    return Script(argv).finish(timeout)


def run_on_terminal(
    argv: list[str],
    timeout: float = 90.0,
    *,
    env: dict[str, str | None] | None = None,
    size: tuple[int, int] | None = None,
    colour: bool = False,
) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr a pseudo-terminal; its exit code (-9 if it hung) and what it wrote.

    ``env`` sets (or, with None, removes) variables of the script's
    environment; ``size`` is the terminal's (rows, columns). The text comes
    with plain newlines, and without colour codes unless ``colour``. A run that
    outlives ``timeout`` is killed as a whole, as :func:`run_script` does.
    """
    marker = uuid.uuid4().hex
    environment = script_env(marker)
    for name, value in (env or {}).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    main, side = os.openpty()
    if size is not None:
        fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    process = subprocess.Popen(
        argv,
        cwd=REPO,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=side,
        stderr=side,
        start_new_session=True,
    )
    os.close(side)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([main], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every holder of the terminal's other side has closed it
                break
            if not chunk:
                break
            chunks.append(chunk)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        os.close(main)
        kill_all(marker, process.pid)
        process.wait()
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return process.returncode, text if colour else _COLOUR.sub("", text)


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def wait_for_file(path: Path, script: Script, timeout: float) -> None:
    """Wait until ``path`` exists; fail early if the script exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if script.proc.poll() is not None:
            raise AssertionError(f"the script exited before writing {path.name}{script.finish(5).report()}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{path.name} did not appear within {timeout} s{script.finish(0.1).report()}")
        time.sleep(0.05)
