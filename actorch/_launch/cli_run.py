"""``actorch run``: hand a script to ``torch.distributed.run`` with torchrun's flags, or run it here for ``-n 1``.

Through torchrun every rank is a process of torchrun's agent, which runs in
this very process: its per-rank log files (``--log-dir``, ``--redirects``,
``--tee``), its restarts (``--max-restarts``) and its summary of a failed run
come with it. Each rank runs the script under ``actorch._launch.runner``,
which ends an interrupted rank quietly and gives torchrun the exception of a
rank that failed, so that the summary names rank 0's error as the root cause.
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

from actorch._launch.run import WORLD_SIZE_ENV
from actorch._launch.status import STATUS_OFF, STATUS_PORT_ENV, check_status_port

__all__ = ["RENDEZVOUS_FLAGS", "RUNNER", "TORCHRUN_FLAGS", "run_command"]

RUNNER = "actorch._launch.runner"
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
        os.environ[STATUS_PORT_ENV] = str(args.status_port)
    elif args.no_status:
        os.environ[STATUS_PORT_ENV] = STATUS_OFF
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
    """Run torchrun's agent here, as ``torchrun`` would, with its errors as one line and its summary kept."""
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
        rank, failure = exc.get_first_failure()
        exc.name = str(script)  # the summary's title: the user's script, not the runner
        sys.stderr.write(f"{exc.format_msg()}\n")  # type: ignore[no-untyped-call]
        print(
            f"actorch run: {script} failed: rank {rank} exited with code {failure.exitcode} (first failure above)",
            file=sys.stderr,
        )
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
    """Keep torchrun's agent to its errors: its warnings narrate a Ctrl-C or a failure line by line."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.ERROR)
