"""The ``actorch`` command: run a script's system on local processes or across machines, and show a live system.

``actorch run -n 4 script.py args`` runs the script with ``ACTORCH_WORLD_SIZE=4``,
so that its ``actorch.run(main)`` starts four local processes. With any of
torchrun's multi-node flags it hands over to ``torch.distributed.run`` with
those very flags. ``actorch status`` reads the status rank 0 serves
(``run(status_port=...)``) and shows it as tables, once or ``--watch``-ing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

from actorch._launch.status import STATUS_PORT_ENV

__all__ = ["main"]

_TORCHRUN_FLAGS = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_endpoint", "rdzv_backend", "rdzv_id")
_EXAMPLES = """\
examples:
  actorch run -n 4 train.py --epochs 3        four local processes; train.py calls actorch.run(main)
  actorch run -n 4 --status-port 8470 train.py
                                              ... and rank 0 serves its status on 127.0.0.1:8470
  actorch run -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.5 --master-port 29500 train.py
                                              host 0 of two, through torch.distributed.run (same on
                                              host 1 with --node-rank 1)
  actorch status --port 8470                  the nodes and actors of that system, once
  actorch status --port 8470 --watch          ... refreshed every second (Ctrl-C ends it)
  python -m actorch ...                       the same, without the console script
"""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="actorch",
        description="Run actorch systems and watch them.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="{run,status}")
    run = commands.add_parser(
        "run",
        help="run a script's actor system on local processes, or across machines with torchrun's flags",
        description=(
            "Run SCRIPT (which calls actorch.run(main)) on N local processes: rank 0 runs main, the others "
            "serve actors. Given any of torchrun's multi-node flags, hand over to torch.distributed.run with "
            "--nproc-per-node N and those flags, unchanged."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("-n", "--nproc", type=_positive, default=1, metavar="N", help="processes on this host (1)")
    run.add_argument("--status-port", type=_port, metavar="PORT", help="have rank 0 serve its status on this port")
    multi = run.add_argument_group("several machines (handed over to torch.distributed.run)")
    multi.add_argument("--nnodes", metavar="N[:M]", help="number of hosts (or a range, for elastic torchrun)")
    multi.add_argument("--node-rank", type=int, metavar="R", help="this host's rank among them")
    multi.add_argument("--master-addr", metavar="HOST", help="address of the host of rank 0")
    multi.add_argument("--master-port", type=_port, metavar="PORT", help="port of the master's store")
    multi.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="rendezvous endpoint (c10d backend)")
    multi.add_argument("--rdzv-backend", metavar="NAME", help="rendezvous backend (static, c10d)")
    multi.add_argument("--rdzv-id", metavar="ID", help="rendezvous id shared by the hosts of one job")
    run.add_argument("script", nargs="?", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    run.set_defaults(func=_run)

    status = commands.add_parser(
        "status",
        help="show a running system: its nodes, its actors, call rates",
        description=(
            "Show the nodes and actors of a running system, from the status its rank 0 serves "
            f"(actorch.run(..., status_port=PORT), actorch run --status-port PORT, or {STATUS_PORT_ENV})."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = status.add_mutually_exclusive_group()
    where.add_argument("--port", type=_port, help=f"rank 0's status port on 127.0.0.1 (default: ${STATUS_PORT_ENV})")
    where.add_argument("--address", metavar="HOST:PORT", help="rank 0's status address, on another host")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=_seconds, default=1.0, help="seconds between refreshes (1)")
    status.add_argument("--count", type=_positive, metavar="N", help="with --watch: stop after N refreshes")
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")
    status.set_defaults(func=_status)
    return parser


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, not {text!r}")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port (0..65535), not {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds between 0.05 and 3600, not {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run the ``actorch`` command with ``argv`` (default: the process's); its exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    code: int = args.func(parser, args)
    return code


# ---------------------------------------------------------------------- actorch run


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.script is None:
        parser.exit(2, "actorch run: error: no script given (actorch run -n N script.py [args...])\n")
    script = Path(args.script)
    if not script.is_file():
        parser.exit(2, f"actorch run: error: no such script: {args.script}\n")
    env = dict(os.environ)
    if args.status_port is not None:
        env[STATUS_PORT_ENV] = str(args.status_port)
    handed = [flag for flag in _TORCHRUN_FLAGS if getattr(args, flag) is not None]
    if handed:
        env["ACTORCH_WORLD_SIZE"] = "launcher"
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc)]
        for flag in handed:
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    else:
        env["ACTORCH_WORLD_SIZE"] = str(args.nproc)
        argv = [sys.executable]
    argv += [str(script), *args.args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # noqa: S606 - the user's own script, as python would run it


# ---------------------------------------------------------------------- actorch status


def _status(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    address = args.address
    if address is None:
        port = args.port if args.port is not None else os.environ.get(STATUS_PORT_ENV)
        if port is None:
            parser.exit(2, f"actorch status: error: give --port or --address (or set {STATUS_PORT_ENV})\n")
        address = f"127.0.0.1:{port}"
    url = f"http://{address}/status"
    from rich.console import Console  # noqa: PLC0415 - only this command needs rich

    console = Console() if sys.stdout.isatty() else Console(width=200)  # piped: whole rows, never wrapped
    previous: dict[str, Any] | None = None
    refreshes = 0
    try:
        while True:
            try:
                current = _fetch(url)
            except OSError as exc:
                print(f"actorch status: error: no status at {address} ({_reason(exc)})", file=sys.stderr)
                return 1
            if args.json:
                print(json.dumps(current), flush=True)
            else:
                if args.watch:
                    if console.is_terminal:
                        console.clear()
                    else:
                        console.print(f"--- {time.strftime('%H:%M:%S')} ({address})")
                for table in _tables(current, previous):
                    console.print(table)
            refreshes += 1
            if not args.watch or (args.count is not None and refreshes >= args.count):
                return 0
            previous = current
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def _fetch(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - an http URL we build ourselves
        found: dict[str, Any] = json.loads(answer.read())
        return found


def _reason(exc: OSError) -> str:
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, OSError):
        return exc.reason.strerror or str(exc.reason)
    return str(exc)


def _tables(current: dict[str, Any], previous: dict[str, Any] | None) -> list[Any]:
    """The nodes table and the actors table of one status (rates against ``previous``, else since start)."""
    from rich.table import Table  # noqa: PLC0415 - only this command needs rich

    elapsed = current["time"] - previous["time"] if previous is not None else None
    before = {node["rank"]: node for node in previous["nodes"]} if previous is not None else {}
    nodes = Table(title=f"nodes ({current['world_size']})", title_justify="left")
    for column in ("rank", "host", "pid", "devices", "label", "state", "actors", "msgs/s in", "msgs/s out"):
        nodes.add_column(column, justify="right" if column.startswith(("rank", "pid", "actors", "msgs")) else "left")
    actors = Table(title="actors", title_justify="left")
    for column in ("actor", "class", "node", "queued", "handled", "errors", "p50", "p99", "calls/s"):
        actors.add_column(column, justify="left" if column in ("actor", "class") else "right")
    for node in current["nodes"]:
        rank = node["rank"]
        if "statistics" not in node:
            state = f"lost: {node['lost']}" if "lost" in node else "not answering"
            nodes.add_row(str(rank), "", "", "", "", state, "", "", "")
            continue
        stats, old = node["statistics"], before.get(rank, {}).get("statistics")
        span = elapsed if old is not None and elapsed else node["uptime"]
        incoming = _in(stats) - (_in(old) if old else 0)
        outgoing = _out(stats) - (_out(old) if old else 0)
        nodes.add_row(
            str(rank),
            node["host"],
            str(node["pid"]),
            ", ".join(node["devices"]) or "-",
            node["label"] or "",
            "alive",
            str(len(node["actors"])),
            _rate(incoming, span),
            _rate(outgoing, span),
        )
        old_actors = {actor["id"]: actor for actor in before.get(rank, {}).get("actors", [])}
        for actor in node["actors"]:
            endpoints = actor["endpoints"].values()
            calls = sum(endpoint["calls"] for endpoint in endpoints)
            errors = sum(endpoint["errors"] for endpoint in endpoints)
            was = old_actors.get(actor["id"])
            done = calls - sum(e["calls"] for e in was["endpoints"].values()) if was is not None else calls
            actors.add_row(
                actor["name"] or f"#{actor['id']}",
                actor["class"],
                str(rank),
                str(actor["queued"]),
                str(calls),
                str(errors),
                _worst(endpoints, "p50"),
                _worst(endpoints, "p99"),
                _rate(done, span),
            )
    return [nodes, actors]


def _in(stats: dict[str, int]) -> int:
    return stats["calls_received"] + stats["tells_received"]


def _out(stats: dict[str, int]) -> int:
    return stats["calls_sent"] + stats["tells_sent"]


def _rate(count: float, seconds: float) -> str:
    return f"{count / seconds:,.1f}" if seconds > 0 else "-"


def _worst(endpoints: Any, key: str) -> str:
    """The largest of the endpoints' ``key`` quantile, as a duration (an actor's slowest endpoint rules)."""
    found = [endpoint[key] for endpoint in endpoints if endpoint[key] is not None]
    if not found:
        return "-"
    seconds = max(found)
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
