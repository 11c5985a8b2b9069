"""Logging set-up for programs started by ``actorch.run`` (the library itself never configures).

Human-readable lines on a terminal (stderr is a tty), with a failure's
traceback as lines under its line; JSON lines otherwise, one object per line
with the traceback as text under ``exception``. The level comes from
``run(log_level=...)``, else ``ACTORCH_LOG_LEVEL``, else ``warning``. Every
node of a launch is configured with rank 0's level (it travels in the plan).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from actorch._launch.options.environment import effective_log_level

__all__ = ["configure_logging"]


_MADE: dict[str, Any] = {}
"""The processors of the configuration made here (``"processors"``), to tell it from one the program made."""


def configure_logging(level: str | None = None) -> None:
    """Configure structlog for this process at ``level`` (see ``effective_log_level``), unless the program already did.

    A configuration made here before (an earlier ``run`` in this process) is
    made again, at the new level.

    Raises:
        ValueError: The level is not one of ``LOG_LEVELS`` (``options.environment``).
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
        # one write per line: the nodes share a stderr, and a line written in two parts can be cut by another's
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        # A node binds its logger as it opens, so it logs at the level of the run that opened it; without the
        # cache, a second run in this process (at another level) reaches the module-level loggers too.
        cache_logger_on_first_use=False,
    )
    _MADE["processors"] = processors
