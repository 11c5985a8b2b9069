"""The ``actorch`` command: run a script's system, show a running system, stop it.

``actorch run -n 4 script.py args`` runs the script through PyTorch's own
launcher, ``torch.distributed.run``, with torchrun's flags (``-n 1`` alone runs
it in this one process). ``actorch serve`` joins a running elastic system as a
node, or as its host's agent (``--pool``). ``actorch status`` reads the status
rank 0 serves and shows it as tables, once or ``--watch``-ing; with no address
it finds the systems of this host in their runtime files. ``actorch stop`` asks
one to shut down. Bad input is one line on stderr and exit code 2; a failure is one line
and exit code 1; Ctrl-C ends ``actorch run`` with 130 and ``--watch`` with 0.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from actorch._base.record import RECORD_ENV, RUNS_DIR_ENV
from actorch._launch.cli.history import history_command
from actorch._launch.cli.serve import parse_resource
from actorch._launch.cli.stacks import stacks_command
from actorch._launch.cli.status import status_command
from actorch._launch.cli.stop import stop_command
from actorch._launch.options.environment import LOG_LEVELS, STATUS_PORT_ENV
from actorch._launch.services.runtime import RUNTIME_DIR_ENV

__all__ = ["INTERRUPTED", "main", "parser"]

INTERRUPTED = 130
"""Exit code of ``actorch run`` ended by Ctrl-C: 128 + SIGINT, as shells report it."""

_EXAMPLES = """\
examples:
  actorch run -n 4 train.py --epochs 3        four local processes; train.py calls actorch.run(main)
  actorch run -n 4 --status-port 8470 train.py
                                              ... rank 0 serves its status on port 8470 (by default: a free one)
  actorch run -n 4 --log-dir logs -r 3 train.py
                                              each rank's output in logs/<run id>/attempt_0/<rank>/
  actorch run -n 2 --max-restarts 3 train.py  start the whole group again (up to 3 times) when a rank fails
  actorch run -n 2 --max-restarts 3 --snapshots ckpt train.py
                                              ... and its relocatable actors start from their snapshots in ckpt/
  actorch run -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.5 --master-port 29500 train.py
                                              host 0 of two (the same on host 1 with --node-rank 1)
  actorch serve --pool --name gpu-b           (with ACTORCH_ADDRESS, ACTORCH_JOIN_TOKEN) join an elastic system
                                              as this host's agent: add_nodes(..., host="gpu-b") starts processes here
  actorch status                              the system running on this host: its nodes and actors
  actorch status --watch                      ... refreshed every second (Ctrl-C ends it)
  actorch status --list                       every system running on this host
  actorch status --address 10.0.0.5:8470      a system on another host
  actorch stacks                              where every handler and thread of the system is, line by line
  actorch stop                                shut the system of this host down gracefully
  actorch history                             the runs recorded on this host, newest first
  actorch history last                        the newest one as a report: what happened, errors, statistics
  python -m actorch ...                       the same, without the console script
"""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    """The ``actorch`` command's argument parser (also what the CLI reference in the docs is made from)."""
    top = _Parser(
        prog="actorch",
        description="Run actorch systems, watch them, stop them.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="{run,serve,status,stacks,stop,history}"
    )
    _add_run(commands)
    _add_serve(commands)
    _add_status(commands)
    _add_stacks(commands)
    _add_stop(commands)
    _add_history(commands)
    return top


def _add_run(commands: argparse._SubParsersAction[_Parser]) -> None:
    run = commands.add_parser(
        "run",
        help="run a script's actor system on local processes, or across machines, through torch.distributed.run",
        description=(
            "Run SCRIPT (which calls actorch.run(main)) on N processes per host through PyTorch's launcher, "
            "torch.distributed.run, with torchrun's flags: rank 0 runs main, the others serve actors. Each rank's "
            "output can go to its own log file, a failed run ends with a line naming the rank that failed first "
            "and its error, and --max-restarts starts the group again when a rank fails. -n 1 without torchrun's flags "
            "runs SCRIPT in this one process."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "-n",
        "--nproc-per-node",
        "--nproc",
        dest="nproc",
        type=_nproc,
        default=1,
        metavar="N",
        help="processes on this host (1); torchrun's auto, cpu and gpu also work",
    )
    status = run.add_mutually_exclusive_group()
    status.add_argument(
        "--status-port",
        type=_port,
        metavar="PORT",
        help="rank 0 serves its status on this port (by default: a free one, found by actorch status)",
    )
    status.add_argument("--no-status", action="store_true", help="rank 0 serves no status (actorch stop still works)")
    run.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        help="actorch's log level on every node: debug, info, warning, error or critical (by default: "
        "$ACTORCH_LOG_LEVEL, else warning), for a script whose run() leaves log_level unset",
    )
    run.add_argument(
        "--trace",
        metavar="PATH",
        help="write a timeline of the run to PATH (Chrome Trace Event JSON: open it in ui.perfetto.dev), "
        "for a script whose run() leaves trace unset",
    )
    run.add_argument(
        "--snapshots",
        metavar="DIR",
        help="keep the snapshots of named relocatable actors in DIR, so that a restarted group (--max-restarts) "
        "or a later run with the same DIR starts them from their last one, for a script whose run() leaves "
        "snapshots unset",
    )
    run.add_argument(
        "--otel",
        action="store_true",
        help="make every call and handler an OpenTelemetry span, the context carried across nodes (needs "
        "actorch[otel]; each process sets up its tracer provider), for a script whose run() leaves otel unset",
    )
    run.add_argument(
        "--no-record",
        action="store_true",
        help="keep no record of the run for actorch history (as record=False)",
    )
    logs = run.add_argument_group("per-rank logs (torchrun's)")
    logs.add_argument(
        "--log-dir", metavar="DIR", help="write each rank's output under DIR/<run id>/attempt_<k>/<rank>/"
    )
    logs.add_argument(
        "-r", "--redirects", metavar="STD", help="send 1 (stdout), 2 (stderr) or 3 (both) to the log files, per rank"
    )
    logs.add_argument("-t", "--tee", metavar="STD", help="as --redirects, and to the console too")
    logs.add_argument("--local-ranks-filter", metavar="RANKS", help="show only these local ranks' output (0,1)")
    group = run.add_argument_group("restarts and rendezvous (torchrun's)")
    group.add_argument(
        "--max-restarts", type=_count, metavar="K", help="start the whole group again up to K times when a rank fails"
    )
    group.add_argument("--standalone", action="store_true", help="a rendezvous of this host alone, on a free port")
    group.add_argument("--rdzv-backend", metavar="NAME", help="rendezvous backend (static, c10d)")
    group.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="rendezvous endpoint (c10d backend)")
    group.add_argument("--rdzv-id", metavar="ID", help="rendezvous id shared by the hosts of one job")
    group.add_argument("--rdzv-conf", metavar="K=V,...", help="more rendezvous settings (timeout=900,...)")
    multi = run.add_argument_group("several machines (torchrun's)")
    multi.add_argument("--nnodes", metavar="N[:M]", help="number of hosts (or a range, for elastic torchrun)")
    multi.add_argument("--node-rank", type=_count, metavar="R", help="this host's rank among them")
    multi.add_argument("--master-addr", metavar="HOST", help="address of the host of rank 0")
    multi.add_argument("--master-port", type=_port, metavar="PORT", help="port of the master's store")
    run.add_argument("script", nargs="?", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    run.set_defaults(func=_run_command)


def _add_serve(commands: argparse._SubParsersAction[_Parser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="join a running elastic system as a node, or as this host's agent (--pool)",
        description=(
            "Join the elastic system at ADDRESS (else $ACTORCH_ADDRESS) with the join token in $ACTORCH_JOIN_TOKEN "
            "(never a flag, so that it stays off command lines), and serve actors until the system ends or this "
            "node leaves (SIGTERM leaves gracefully). With --pool the node is this host's agent: the system starts "
            "node processes here, for add_nodes(..., host=NAME) and Where(process='own', host=NAME), NAME being "
            "this host's name or --name. Actor classes are imported by module path, the current directory first."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--address", type=_address, metavar="HOST:PORT", help="the system's address (rank 0's store)")
    serve.add_argument("--name", metavar="NAME", help="this node's label (NodeInfo.label)")
    serve.add_argument(
        "--resource",
        type=parse_resource,
        action="append",
        metavar="NAME=AMOUNT",
        help="a resource this node declares over those it detects (repeatable: --resource env_slots=4)",
    )
    serve.add_argument("--pool", action="store_true", help="be this host's agent: start node processes when asked")
    serve.add_argument(
        "--join-timeout", type=_seconds, default=60.0, metavar="SECONDS", help="seconds to wait for the system (60)"
    )
    serve.set_defaults(func=_serve_command)


def _add_status(commands: argparse._SubParsersAction[_Parser]) -> None:
    status = commands.add_parser(
        "status",
        help="show a running system: its nodes, its actors, call rates",
        description=(
            "Show the nodes and actors of a running system, from the status its rank 0 serves (every system "
            "serves one, on a free port, unless started with status=False or --no-status). With no address it reads "
            f"${STATUS_PORT_ENV}, else finds the system running on this host by its runtime file "
            f"(${RUNTIME_DIR_ENV}, else $XDG_RUNTIME_DIR/actorch or a per-user temporary directory)."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = status.add_mutually_exclusive_group()
    where.add_argument("--port", type=_port, help="rank 0's status port on 127.0.0.1")
    where.add_argument("--address", type=_address, metavar="HOST:PORT", help="rank 0's status address, on another host")
    where.add_argument("--pid", type=_count, help="the system of this host whose rank 0 has this pid")
    where.add_argument("--list", action="store_true", help="list the systems running on this host, and end")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument(
        "--interval", type=_seconds, default=1.0, metavar="SECONDS", help="seconds between refreshes (1)"
    )
    status.add_argument("--count", type=_positive, metavar="N", help="with --watch: stop after N refreshes")
    status.add_argument(
        "--json",
        action="store_true",
        help='print the status as JSON (schema in docs/operations.md); a failure too, as {"error": ...}',
    )
    status.set_defaults(func=status_command)


def _add_stacks(commands: argparse._SubParsersAction[_Parser]) -> None:
    stacks = commands.add_parser(
        "stacks",
        help="show where every handler and thread of a running system is, line by line",
        description=(
            "Print, for every node of a running system, whether its event loop keeps up, each actor's running "
            "handlers as await chains down to the line each is on (and what it waits for), the loop's other "
            "tasks, and the threads' stacks: by default only your own frames (not actorch's, the standard "
            "library's or installed packages'), and the tasks and threads that have some; --all shows every "
            "frame, task and thread. Rank 0 gathers it on threads, so it answers also when a handler "
            "blocks an event loop and never yields; a node that does not answer within a few seconds is shown "
            "as such. The system is found as by actorch status."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = stacks.add_mutually_exclusive_group()
    where.add_argument("--port", type=_port, help="rank 0's status port on 127.0.0.1")
    where.add_argument("--address", type=_address, metavar="HOST:PORT", help="rank 0's status address, on another host")
    where.add_argument("--pid", type=_count, help="the system of this host whose rank 0 has this pid")
    stacks.add_argument(
        "--all",
        action="store_true",
        help="every frame, task and thread: actorch's, the standard library's and installed packages' too",
    )
    stacks.add_argument("--no-threads", action="store_true", help="leave out the threads' stacks")
    stacks.add_argument("--no-tasks", action="store_true", help="leave out the tasks that are not actors' handlers")
    stacks.add_argument(
        "--json",
        action="store_true",
        help='print them as JSON (see docs/operations.md); a failure too, as {"error": ...}',
    )
    stacks.set_defaults(func=stacks_command)


def _add_history(commands: argparse._SubParsersAction[_Parser]) -> None:
    history = commands.add_parser(
        "history",
        help="list past runs, or show one as a report",
        description=(
            "List the runs recorded on this host, newest first, or show one: what ran, what happened in order "
            "(nodes joined and lost, actors started, failed, restarted, relocated, stopped), the errors with their "
            "tracebacks, and each actor's final statistics. Every system records its run as it goes unless "
            f"started with record=False or ${RECORD_ENV}=0; the records are in ${RUNS_DIR_ENV}, else "
            "$XDG_STATE_HOME/actorch/runs or ~/.local/state/actorch/runs, the newest 100 runs kept."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    history.add_argument("run", nargs="?", help="the run to show: its id, part of it, or 'last'")
    history.add_argument("--limit", type=_positive, default=20, metavar="N", help="list at most N runs (20)")
    history.add_argument("--dir", metavar="PATH", help="the runs directory to read (default: this user's)")
    history.add_argument("--json", action="store_true", help="print the list, or the run's entries, as JSON")
    history.set_defaults(func=history_command)


def _add_stop(commands: argparse._SubParsersAction[_Parser]) -> None:
    stop = commands.add_parser(
        "stop",
        help="shut a system of this host down gracefully",
        description=(
            "Ask a system running on this host (found by its runtime file) to shut down in order, and wait until "
            "it has: SIGINT to torchrun's agent when one started it (as Ctrl-C, so the agent restarts nothing), "
            "else SIGTERM to rank 0."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    stop.add_argument("--pid", type=_count, help="the system whose rank 0 has this pid (needed when several run)")
    stop.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="seconds to wait for rank 0 to exit (60); past them, exit code 1",
    )
    stop.set_defaults(func=stop_command)


def _run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from actorch._launch.cli.run import run_command  # noqa: PLC0415 - imports torch: only this command pays for it

    return run_command(parser, args)


def _serve_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from actorch._launch.cli.serve import serve_command  # noqa: PLC0415 - imports torch: only this command pays for it

    return serve_command(parser, args)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, not {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an int >= 0, not {text!r}")
    return int(text)


def _nproc(text: str) -> int | str:
    if text in ("auto", "cpu", "gpu", "xpu"):
        return text
    return _positive(text)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port (0..65535), not {text!r}")
    return int(text)


def _address(text: str) -> str:
    host, colon, port = text.rpartition(":")
    bare = host.removeprefix("[").removesuffix("]")
    if not colon or not bare or any(char.isspace() or char in "/?#@" for char in bare) or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {text!r}")
    if not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port (1..65535) in {text!r}")
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 3600:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected seconds between 0.05 and 3600, not {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run the ``actorch`` command with ``argv`` (default: the process's); its exit code."""
    top = parser()
    args = top.parse_args(argv)
    try:
        code: int = args.func(top, args)
    except KeyboardInterrupt:
        if args.command == "status" and args.watch:
            return 0  # Ctrl-C is how a watch ends
        print(f"actorch {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
