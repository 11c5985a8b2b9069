"""The environment variables that give a launch its options, and the values they take.

A launcher (``actorch run``) hands a script's ``run`` its flags through the
environment: each variable here stands in for one option where the script
leaves it at its default (``SystemOptions`` says which), and
``launcher_environment`` sets them. The options read them, the command line
names and sets them. Nothing here imports beyond the standard library: the
``actorch`` command imports this module for ``--help`` and ``status``, which
must not wait for torch.
"""

from __future__ import annotations

import os

__all__ = [
    "LOG_LEVELS",
    "LOG_LEVEL_ENV",
    "OFF",
    "ON",
    "OTEL_ENV",
    "SNAPSHOTS_ENV",
    "STATUS_OFF",
    "STATUS_PORT_ENV",
    "TRACE_ENV",
    "WORLD_SIZE_ENV",
    "check_log_level",
    "effective_log_level",
]

STATUS_PORT_ENV = "ACTORCH_STATUS_PORT"
"""Environment variable naming rank 0's status port (as ``run(status_port=...)``), or ``off`` for none."""
STATUS_OFF = "off"
"""``ACTORCH_STATUS_PORT``'s value that serves no status (``actorch run --no-status``), as ``run(status=False)``."""

LOG_LEVEL_ENV = "ACTORCH_LOG_LEVEL"
"""The log level where ``log_level`` is None (``actorch run --log-level``)."""
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""The levels ``log_level`` and ``ACTORCH_LOG_LEVEL`` take, in any case."""

TRACE_ENV = "ACTORCH_TRACE"
"""Where ``run`` writes a timeline of the run if its ``trace`` option is None (``actorch run --trace``)."""

OTEL_ENV = "ACTORCH_OTEL"
"""Turns OpenTelemetry spans on (``1``) where the ``otel`` option is None (``actorch run --otel``)."""

SNAPSHOTS_ENV = "ACTORCH_SNAPSHOTS"
"""The snapshot directory where the ``snapshots`` option is None (``actorch run --snapshots DIR``, torchrun)."""

WORLD_SIZE_ENV = "ACTORCH_WORLD_SIZE"
"""Set by ``actorch run -n N``: the number of local processes, in place of ``run``'s ``world_size``."""

ON = ("1", "true", "yes", "on")
"""Values of a variable that turn its option on (in any case)."""
OFF = ("0", "false", "no", "off")
"""Values of a variable that turn its option off (in any case): ``ACTORCH_RECORD=0``, ``ACTORCH_OTEL=0``."""


def check_log_level(level: object, option: str = "log_level") -> str | None:
    """``level`` as one of ``LOG_LEVELS``, or None if it is None.

    Raises:
        ValueError: ``level`` is not a level; the message names ``option`` and the levels it takes.
    """
    if level is None:
        return None
    if isinstance(level, str) and level.lower() in LOG_LEVELS:
        return level.lower()
    levels = ", ".join(repr(name) for name in LOG_LEVELS)
    if option == LOG_LEVEL_ENV:
        raise ValueError(f"{LOG_LEVEL_ENV} must be one of {levels} (in any case), not {level!r}")
    raise ValueError(
        f"{option} must be one of {levels} (in any case), or None for ${LOG_LEVEL_ENV} (else 'warning'), not {level!r}"
    )


def effective_log_level(level: object = None) -> str:
    """The level a process logs at: ``level``, else ``ACTORCH_LOG_LEVEL``, else ``warning``; each checked.

    Raises:
        ValueError: ``level``, or ``ACTORCH_LOG_LEVEL`` where ``level`` is None, is not a level.
    """
    return check_log_level(level) or check_log_level(os.environ.get(LOG_LEVEL_ENV) or None, LOG_LEVEL_ENV) or "warning"
