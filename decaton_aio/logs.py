"""Logging setup: structlog with a console renderer in a terminal, JSON lines otherwise.

The runtime binds topic, partition, offset, key and subscription id around each task (the
way Decaton fills its MDC); this module only decides how those events are rendered and
which level passes. The level comes from the caller, else ``$DECATON_AIO_LOG_LEVEL``,
else ``info``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog

from decaton_aio.errors import ConfigError

__all__ = ["LOG_LEVELS", "LOG_LEVEL_ENV_VAR", "configure_logging"]

LOG_LEVEL_ENV_VAR = "DECATON_AIO_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def configure_logging(
    level: str | None = None, *, json: bool | None = None, stream: TextIO | None = None
) -> None:
    """Configure structlog (and the standard ``logging`` module it forwards to).

    Args:
        level: one of :data:`LOG_LEVELS`; ``$DECATON_AIO_LOG_LEVEL`` or ``info`` if omitted.
        json: force JSON (True) or console (False) rendering; by default console when the
            stream is a terminal.
        stream: where logs go; standard error by default.

    Raises:
        ConfigError: for an unknown level name.
    """
    name = (level or os.environ.get(LOG_LEVEL_ENV_VAR) or "info").lower()
    if name not in LOG_LEVELS:
        raise ConfigError(f"unknown log level {name!r}: use one of {', '.join(LOG_LEVELS)}")
    numeric = logging.getLevelName(name.upper())
    out = stream or sys.stderr
    if json is None:
        json = not out.isatty()
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=out.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Third-party libraries (aiokafka) log through the standard module to the same stream.
    # Their INFO lines (every connection, every rebalance step) are noise unless debugging.
    root = logging.getLogger()
    root.handlers[:] = [logging.StreamHandler(out)]
    root.setLevel(numeric if numeric == logging.DEBUG else max(numeric, logging.WARNING))
