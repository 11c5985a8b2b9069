"""Logging set-up for programs started by ``actorch.run`` (the library itself never configures).

Human-readable lines on a terminal (stderr is a tty), with a failure's
traceback as lines under its line; JSON lines otherwise, one object per line
with the traceback as text under ``exception``. The level comes from
``run(log_level=...)``, else ``ACTORCH_LOG_LEVEL``, else ``warning``. Every
node of a launch is configured with rank 0's level (it travels in the plan).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

__all__ = ["LOG_LEVELS", "LOG_LEVEL_ENV", "check_log_level", "configure_logging", "effective_log_level"]

LOG_LEVEL_ENV = "ACTORCH_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""The levels ``log_level`` and ``ACTORCH_LOG_LEVEL`` take, in any case."""

_MADE: dict[str, Any] = {}
"""The processors of the configuration made here (``"processors"``), to tell it from one the program made."""


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


def configure_logging(level: str | None = None) -> None:
    """Configure structlog for this process at ``level`` (see ``effective_log_level``), unless the program already did.

    A configuration made here before (an earlier ``run`` in this process) is
    made again, at the new level.

    Raises:
        ValueError: The level is not one of ``LOG_LEVELS``.
    """
    from actorch._engine.log_context import add_call_context  # noqa: PLC0415 - it brings torch: the CLI's help needs neither

    chosen = effective_log_level(level)
    if structlog.is_configured() and structlog.get_config()["processors"] is not _MADE.get("processors"):
        return
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_call_context,  # the node, actor, endpoint and call a handler's own lines were written in
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    if sys.stderr.isatty():  # the console renderer prints a traceback (``exception``, ``exc_info``) as lines
        processors.append(structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback))
    else:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[chosen.upper()]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        # A node binds its logger as it opens, so it logs at the level of the run that opened it; without the
        # cache, a second run in this process (at another level) reaches the module-level loggers too.
        cache_logger_on_first_use=False,
    )
    _MADE["processors"] = processors
