"""Logging set-up for programs started by ``actorch.run`` (the library itself never configures).

Human-readable lines on a terminal, JSON lines otherwise; the level comes from
``ACTORCH_LOG_LEVEL`` (default ``warning``).
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

__all__ = ["LOG_LEVEL_ENV", "configure_logging"]

LOG_LEVEL_ENV = "ACTORCH_LOG_LEVEL"


def configure_logging(level: str | None = None) -> None:
    """Configure structlog for this process unless the program already did."""
    if structlog.is_configured():
        return
    name = (level or os.environ.get(LOG_LEVEL_ENV) or "warning").upper()
    numeric = logging.getLevelName(name)
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {name!r} (set {LOG_LEVEL_ENV} to debug, info, warning or error)")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
