"""``actorch run``: hand a script to ``torch.distributed.run`` with torchrun's flags, or run it here for ``-n 1``.

Through torchrun every rank is a process of torchrun's agent, which runs in
this very process: its per-rank log files (``--log-dir``, ``--redirects``,
``--tee``) and its restarts (``--max-restarts``) come with it. Each rank runs
the script under ``actorch._launch.cli.runner``, which ends an interrupted rank
quietly, and prints the traceback of a rank that failed where the rank's
stderr goes and records its exception for the agent. A failed run then ends
with one line naming the first failure's rank, type and message (and with the
tracebacks the console did not show, those of ranks whose stderr went to a
file), instead of torchrun's summary, which would print each traceback again.
``-n 1`` without any of torchrun's flags replaces this process with the
script's (an in-process world: no torch RPC, nothing else to start).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from actorch._launch.options.environment import WORLD_SIZE_ENV
from actorch._launch.options.system_options import launcher_environment
from actorch._launch.services.status import check_status_port

__all__ = ["RENDEZVOUS_FLAGS", "RUNNER", "TORCHRUN_FLAGS", "run_command"]

RUNNER = "actorch._launch.cli.runner"
"""The module each rank runs, with the script and its arguments after it."""
RENDEZVOUS_FLAGS = (
    "standalone",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
)
"""Flags that say where the hosts meet; without any, the run is one host's alone (``--standalone``)."""
TORCHRUN_FLAGS = ("log_dir", "redirects", "tee", "local_ranks_filter", "max_restarts", "rdzv_conf", *RENDEZVOUS_FLAGS)
"""``actorch run``'s flags that are torchrun's, handed over unchanged."""


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``actorch run``: check what can be checked before anything starts, then launch; the exit code."""
    if args.script is None:
        parser.exit(2, "actorch run: error: no script given (actorch run -n N script.py [args...])\n")
    script = Path(args.script)
    if not script.is_file():
        parser.exit(2, f"actorch run: error: no such script: {args.script}\n")
    if args.status_port is not None:
        try:
            check_status_port("127.0.0.1", args.status_port)
        except OSError as exc:
            parser.exit(2, f"actorch run: error: --status-port: {exc.strerror}\n")
    try:
        environment = launcher_environment(
            status=not args.no_status,
            status_port=args.status_port,
            log_level=args.log_level,
            record=not args.no_record,
            trace=args.trace,
            otel=args.otel,
            snapshots=args.snapshots,
        )
    except ImportError as exc:  # --otel (or ACTORCH_OTEL=1) without the extra installed
        parser.exit(2, f"actorch run: error: {exc}\n")
    os.environ.update(environment)
    handed = [flag for flag in TORCHRUN_FLAGS if getattr(args, flag) not in (None, False)]
    if args.nproc == 1 and not handed:
        os.environ[WORLD_SIZE_ENV] = "1"
        sys.stdout.flush()
        sys.stderr.flush()
        argv = [sys.executable, "-m", RUNNER, str(script), *args.args]
        os.execv(sys.executable, argv)  # noqa: S606 - the user's own script, as python would run it
    os.environ[WORLD_SIZE_ENV] = "launcher"  # the script's world is the one torchrun starts
    return _torchrun(parser, args, handed, script)


def _torchrun(parser: argparse.ArgumentParser, args: argparse.Namespace, handed: list[str], script: Path) -> int:
    """Run torchrun's agent here, as ``torchrun`` would, with its errors and a failed run's end as one line."""
    from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: PLC0415 - heavy
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: PLC0415
    from torch.distributed.launcher.api import elastic_launch  # noqa: PLC0415
    from torch.distributed.run import get_args_parser  # noqa: PLC0415

    argv = ["--nproc-per-node", str(args.nproc)]
    for flag in handed:
        value = getattr(args, flag)
        option = f"--{flag.replace('_', '-')}"
        argv += [option] if value is True else [option, str(value)]
    if not any(flag in handed for flag in RENDEZVOUS_FLAGS):
        argv.append("--standalone")
    argv += ["--module", RUNNER, str(script), *args.args]
    _quiet_agent_logs()
    try:
        config, entrypoint, entry_args = _launch_config(get_args_parser().parse_args(argv))
    except (ValueError, RuntimeError) as exc:
        parser.exit(2, f"actorch run: error: {exc}\n")
    try:
        elastic_launch(config, entrypoint)(*entry_args)
    except ChildFailedError as exc:
        _report_failures(script, exc.failures, args)
        return 1
    except SignalException as exc:
        if exc.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        print(f"actorch run: ended by {signal.Signals(exc.sigval).name}", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ValueError as exc:  # a setting torchrun only checks once it starts (an unknown rendezvous backend)
        parser.exit(2, f"actorch run: error: {exc}\n")
    except Exception as exc:  # noqa: BLE001 - the agent's own frames would say nothing more
        print(f"actorch run: the launch failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _report_failures(script: Path, failures: dict[int, Any], args: argparse.Namespace) -> None:
    """Say how a failed run failed: each traceback the console has not shown yet, then the first failure in a line.

    Each rank prints its own traceback, as Python would, where its stderr
    goes; only the tracebacks of ranks whose stderr went to a file alone are
    printed here. Ranks that ended without an error of their own (the agent
    stops the others once one fails) are not failures worth a line.
    """
    first = min(failures, key=lambda rank: (failures[rank].timestamp, _error_of(failures[rank]) is None, rank))
    for rank, failure in sorted(failures.items()):
        error = _error_of(failure)
        if error is None:
            continue
        text = error.get("extraInfo", {}).get("py_callstack")
        if text and not _stderr_on_console(args, failure.local_rank):
            print(f"actorch run: rank {rank}'s traceback (its stderr went to a log file):", file=sys.stderr)
            sys.stderr.write(text if text.endswith("\n") else f"{text}\n")
        if rank != first:
            print(f"actorch run: rank {rank} failed too: {_what_failed(failure)}", file=sys.stderr)
    print(f"actorch run: {script} failed on rank {first}: {_what_failed(failures[first])}", file=sys.stderr)


def _error_of(failure: Any) -> dict[str, Any] | None:
    """The exception a rank's runner recorded in its error file (``message``, ``extraInfo``), or None."""
    message = failure.message
    return message if isinstance(message, dict) else None


def _what_failed(failure: Any) -> str:
    """A rank's failure in a few words: its exception's type and message, its signal, or its exit code."""
    error = _error_of(failure)
    if error is not None and error.get("message"):
        return str(error["message"])
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()}"
    return f"exited with code {failure.exitcode}"


def _stderr_on_console(args: argparse.Namespace, local_rank: int) -> bool:
    """Whether local rank ``local_rank``'s stderr reached this console, by torchrun's rules for its output flags."""
    from torch.distributed.elastic.multiprocessing.api import Std  # noqa: PLC0415 - heavy

    def has_stderr(flag: str | None) -> bool:
        if flag is None:
            return False
        streams = Std.from_str(flag)
        stream = streams.get(local_rank, Std.NONE) if isinstance(streams, dict) else streams
        return stream & Std.ERR == Std.ERR

    if args.local_ranks_filter and local_rank not in {int(rank) for rank in args.local_ranks_filter.split(",")}:
        return False
    return has_stderr(args.tee) or not has_stderr(args.redirects)


def _launch_config(args: Any) -> tuple[Any, Any, list[str]]:
    """Torchrun's launch config from its parsed flags, as ``torch.distributed.run.run`` makes it.

    Raises:
        ValueError: A flag's value is not one torchrun takes (RuntimeError for a bad ``--nnodes`` range).
    """
    from torch.distributed.run import config_from_args, parse_min_max_nnodes  # noqa: PLC0415 - heavy

    if args.standalone or (
        args.rdzv_backend == "static"
        and not args.rdzv_endpoint
        and args.master_port is None
        and parse_min_max_nnodes(args.nnodes)[1] == 1  # one host and no port given: a free one
    ):
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    config, entrypoint, entry_args = config_from_args(args)
    return config, entrypoint, list(entry_args)


def _quiet_agent_logs() -> None:
    """Keep torchrun's agent to its errors: its warnings narrate a Ctrl-C or a failure line by line.

    Its error line for a failed rank goes too: the closing line says which
    rank failed, and how.
    """
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_not_a_failed_rank)


def _not_a_failed_rank(record: logging.LogRecord) -> bool:
    """False for the agent's line about a failed rank (``failed (exitcode: 1) local_rank: 0 ...``)."""
    return not str(record.msg).startswith("failed (exitcode")
