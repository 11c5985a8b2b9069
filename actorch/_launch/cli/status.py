"""``actorch status``: find a system, and show what its rank 0 serves.

A system is found by an address given on the command line, by
``ACTORCH_STATUS_PORT``, or by the runtime file its rank 0 writes on this host
(``actorch._launch.services.runtime``); ``actorch stacks`` finds one the same
way, and ``actorch stop`` by its runtime file alone (``one_system``). What
cannot be read is one line on stderr: exit code 2 when the command line is at
fault (or it does not say which of several systems), 1 when the system is not
there or does not answer as an actorch status does. With ``--json``, stdout
has JSON whatever happens: the status, or an object whose ``error`` says what
went wrong, for a script to read.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any, NoReturn

from actorch._launch.options.environment import STATUS_OFF, STATUS_PORT_ENV
from actorch._launch.services.runtime import RunningSystem, running_systems, runtime_dir
from actorch._launch.services.status import READABLE_SCHEMAS

__all__ = [
    "StatusUnavailable",
    "fail_command",
    "fetch_served",
    "fetch_status",
    "find_address",
    "one_system",
    "status_command",
]

_MAX_ANSWER = 64 << 20
"""Bytes of an answer read at most (a status of thousands of actors is a few MB)."""


class StatusUnavailable(Exception):  # noqa: N818 - reads as what happened
    """Raised when an address gives no actorch status: nothing answers, or something else does."""


def fail_command(command: str, message: str, code: int = 1, *, as_json: bool = False, **details: Any) -> NoReturn:
    """End the command with ``message`` on stderr and exit code ``code``; ``as_json`` says it on stdout too."""
    if as_json:
        print(json.dumps({"error": message, "exit_code": code, **details}), flush=True)
    print(f"actorch {command}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


# ---------------------------------------------------------------------- finding a system


def _systems(command: str, *, as_json: bool = False) -> list[RunningSystem]:
    try:
        return running_systems()
    except OSError as exc:
        fail_command(command, f"cannot read the runtime directory: {exc}", as_json=as_json)


def one_system(command: str, pid: int | None, *, as_json: bool = False) -> RunningSystem:
    """The system of this host that the command means: the one with rank 0's ``pid``, or the only one.

    Each system has a runtime file of its own (named by rank 0's pid): with
    several, which one is meant is the user's to say, by ``--pid``.
    """
    systems = _systems(command, as_json=as_json)
    if pid is not None:
        for system in systems:
            if system.pid == pid:
                return system
        fail_command(
            command,
            f"no actorch system whose rank 0 has pid {pid} runs on this host (actorch status --list)",
            as_json=as_json,
        )
    if not systems:
        fail_command(
            command,
            f"no actorch system runs on this host (none has a runtime file in {runtime_dir()})",
            as_json=as_json,
        )
    if len(systems) > 1:
        if not as_json:
            _print_systems(systems)
        fail_command(
            command,
            f"{len(systems)} actorch systems run on this host: pick one with --pid PID",
            2,
            as_json=as_json,
            systems=[_record(system) for system in systems],
        )
    return systems[0]


def _record(system: RunningSystem) -> dict[str, Any]:
    """A system found in the runtime directory, as ``--json`` shows it."""
    return {
        "pid": system.pid,
        "status": system.status,
        "world_size": system.world_size,
        "started": system.started,
        "argv": system.argv,
        "cwd": system.cwd,
    }


def find_address(args: argparse.Namespace, command: str = "status") -> str:
    """Where the status is: ``--address``, ``--port``, ``ACTORCH_STATUS_PORT``, else the runtime file's."""
    if args.address is not None:
        return str(args.address)
    if args.port is not None:
        return f"127.0.0.1:{args.port}"
    port = os.environ.get(STATUS_PORT_ENV)
    # 0 asks a system for a free port (find which it took), and off for none: the runtime file says which
    if args.pid is None and port and port not in ("0", STATUS_OFF):
        if not port.isdigit() or int(port) > 65535:
            fail_command(
                command,
                f"{STATUS_PORT_ENV} must be a port (1..65535) or {STATUS_OFF!r}, not {port!r}",
                2,
                as_json=args.json,
            )
        return f"127.0.0.1:{port}"
    system = one_system(command, args.pid, as_json=args.json)
    if system.status is None:
        fail_command(
            command,
            f"the system of pid {system.pid} ({system.script}) serves no status: it was started with "
            "run(..., status=False) or actorch run --no-status (actorch stop still finds it)",
            as_json=args.json,
            pid=system.pid,
        )
    return system.status


def _print_systems(systems: list[RunningSystem]) -> None:
    from rich.console import Console  # noqa: PLC0415 - only these commands need rich
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=f"actorch systems on this host ({len(systems)})", title_justify="left")
    for column in ("pid", "status", "nodes", "started", "command"):
        table.add_column(column, justify="right" if column in ("pid", "nodes") else "left")
    for system in systems:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(system.started))
        table.add_row(str(system.pid), system.status or "-", str(system.world_size), started, system.script)
    (Console() if sys.stdout.isatty() else Console(width=200)).print(table)


# ---------------------------------------------------------------------- actorch status


def fetch_status(address: str, timeout: float = 10.0) -> dict[str, Any]:
    """The status that rank 0 serves at ``address`` (``host:port``), checked to be one.

    Raises:
        StatusUnavailable: Nothing answers there, or what answers is not an
            actorch status of a schema this version reads; the message says which.
    """
    return fetch_served(address, "/status", timeout)


def fetch_served(address: str, path: str, timeout: float = 10.0) -> dict[str, Any]:
    """What rank 0 serves at ``address`` under ``path`` (``/status``, ``/stacks``), checked to be actorch's.

    Raises:
        StatusUnavailable: As ``fetch_status``; also when rank 0 says it cannot
            answer (its loop is blocked), in its words.
    """
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as answer:
            raw = answer.read(_MAX_ANSWER)
    except urllib.error.HTTPError as exc:
        said = exc.read(1024).decode("utf-8", "replace").strip() if exc.code == 503 else ""
        exc.close()
        if said:
            raise StatusUnavailable(f"the system at {address} cannot answer: {said}") from None
        if exc.code == 404 and path != "/status":
            raise StatusUnavailable(f"the system at {address} serves no {path} (an older actorch?)") from None
        raise StatusUnavailable(
            f"no actorch status at {address}: it answered HTTP {exc.code} {exc.reason} (is it another service?)"
        ) from None
    except http.client.RemoteDisconnected:
        raise StatusUnavailable(f"no status at {address}: it closed the connection without answering") from None
    except http.client.HTTPException:
        raise StatusUnavailable(f"no actorch status at {address}: the answer is not HTTP (another service?)") from None
    except OSError as exc:
        raise StatusUnavailable(f"no status at {address} ({_reason(exc)})") from None
    try:
        found = json.loads(raw)
    except ValueError:
        raise StatusUnavailable(
            f"no actorch status at {address}: the answer is not JSON (is it another service?)"
        ) from None
    if not isinstance(found, dict) or not isinstance(found.get("nodes"), list) or "schema" not in found:
        raise StatusUnavailable(f"no actorch status at {address}: the answer is JSON of another kind")
    if found["schema"] not in READABLE_SCHEMAS:
        readable = " and ".join(map(str, READABLE_SCHEMAS))
        raise StatusUnavailable(
            f"the status at {address} has schema {found['schema']!r}; this actorch reads schemas {readable}"
        )
    return found


def _reason(exc: OSError) -> str:
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, OSError):
        return exc.reason.strerror or str(exc.reason)
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return exc.strerror or str(exc)


def status_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``actorch status``: print the status once, as JSON, or ``--watch``-ing; the exit code."""
    if args.list:
        systems = _systems("status", as_json=args.json)
        if args.json:
            print(json.dumps({"systems": [_record(system) for system in systems]}), flush=True)
        else:
            _print_systems(systems)
        return 0
    address = find_address(args)
    from rich.console import Console  # noqa: PLC0415 - only this command needs rich

    from actorch._launch.cli.tables import status_tables  # noqa: PLC0415 - needs rich

    console = Console() if sys.stdout.isatty() else Console(width=200)  # piped: whole rows, never wrapped
    previous: dict[str, Any] | None = None
    refreshes = 0
    while True:
        try:
            current = fetch_status(address)
        except StatusUnavailable as exc:
            fail_command("status", str(exc), as_json=args.json, address=address)
        if args.json:
            print(json.dumps(current), flush=True)
        else:
            if args.watch:
                if console.is_terminal:
                    console.clear()
                else:
                    console.print(f"--- {time.strftime('%H:%M:%S')} ({address})")
            for table in status_tables(current, previous):
                console.print(table)
        refreshes += 1
        if not args.watch or (args.count is not None and refreshes >= args.count):
            return 0
        previous = current
        time.sleep(args.interval)
