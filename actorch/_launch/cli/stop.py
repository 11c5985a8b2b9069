"""``actorch stop``: ask a system of this host to shut down in order, and wait until it has.

The system is found by its runtime file (``actorch status`` finds it the same
way, by ``one_system``); what cannot be found or signalled is one line on
stderr, as for ``actorch status``.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

from actorch._launch.cli.status import fail_command, one_system

__all__ = ["stop_command"]


def stop_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``actorch stop``: ask a system of this host to shut down in order, then wait until it has; the exit code.

    Rank 0 started by torchrun's agent (``actorch run -n N``, ``torchrun``): the
    agent gets SIGINT, as on Ctrl-C, and passes it to every rank; rank 0 leads
    the shutdown, the others follow it, and the agent restarts nothing. SIGTERM
    to rank 0 alone would end a rank of the group, which the agent counts as a
    failure (and restarts with ``--max-restarts``). Otherwise rank 0 gets
    SIGTERM, as from a scheduler.
    """
    system = one_system("stop", args.pid)
    through_launcher = system.launcher_running()
    target, how = (system.launcher, signal.SIGINT) if through_launcher else (system.pid, signal.SIGTERM)
    assert target is not None
    try:
        os.kill(target, how)
    except ProcessLookupError:
        print(f"actorch stop: the system of pid {system.pid} had already ended")
        return 0
    except PermissionError as exc:
        fail_command("stop", f"cannot signal pid {target}: {exc.strerror}")
    deadline = time.monotonic() + args.timeout
    while system.running() or (through_launcher and system.launcher_running()):
        if time.monotonic() >= deadline:
            who = f"its launcher (pid {target})" if through_launcher else f"rank 0 (pid {system.pid})"
            fail_command("stop", f"{who} has not exited {args.timeout:g} s after {how.name}")
        time.sleep(0.05)
    print(f"actorch stop: stopped the system of pid {system.pid} ({system.script})")
    return 0
