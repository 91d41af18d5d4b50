"""Logging setup, and the task fields every log line inside a task carries.

[`configure_logging()`][decaton_aio.logs.configure_logging] sets structlog up with a console
renderer in a terminal, JSON lines otherwise; the level comes from the caller, else
``$DECATON_AIO_LOG_LEVEL``, else ``info``.

Task fields (Decaton's MDC): a log call made while a task runs, through any structlog
logger or the standard ``logging`` module, gets the task's subscription, topic,
partition, offset and key. `add_task_context()` (a structlog processor) and
`TaskContextFilter` (a ``logging`` filter) add them;
[`configure_logging()`][decaton_aio.logs.configure_logging] installs both. An application
that configures structlog itself adds `add_task_context()` to its processors.

How the running task is found, at almost no cost per task: while the executor starts a
task (its first step included) it keeps the task's context where a *task source* reads
it, and a task that waited goes on inside a frame of the runtime that holds its context
in a local variable (the worker that carries it on): `current_task_context()` asks
the task sources, then walks the stack from the log call up to the innermost such frame.
That costs a few microseconds per log line inside a task, where binding context
variables for every task would cost every task, logged or not. (A frame could serve for
the start too, but the executor is compiled, and compiled functions run without one.)
Tasks a processor spawns itself run outside both: bind what they need with
``ctx.logger``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, MutableMapping
from types import CodeType
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from decaton_aio import environment
from decaton_aio.errors import ConfigError

if TYPE_CHECKING:
    from decaton_aio.context import ProcessingContext

__all__ = [
    "LOG_LEVELS",
    "LOG_LEVEL_ENV_VAR",
    "TASK_FIELDS",
    "TaskContextFilter",
    "add_task_context",
    "configure_logging",
    "current_task_context",
    "register_task_frame",
    "register_task_source",
]

LOG_LEVEL_ENV_VAR = environment.LOG_LEVEL.name
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

#: The fields a log line inside a task carries.
TASK_FIELDS = ("subscription", "topic", "partition", "offset", "key")

# Code objects of the runtime's frames that run a task, with the name of the local that
# holds its ProcessingContext.
_TASK_FRAMES: dict[CodeType, str] = {}
# What tells the context of the task being started right now, if any.
_TASK_SOURCES: list[Callable[[], ProcessingContext | None]] = []


def register_task_frame(code: CodeType, local: str) -> None:
    """Declare that frames running ``code`` run a task whose context is in ``local``.

    Caller: the coroutine starter's workers, at import.
    """
    _TASK_FRAMES[code] = local


def register_task_source(source: Callable[[], ProcessingContext | None]) -> None:
    """Declare that ``source()`` is the context of the task being started right now.

    A source is asked before any frame: it must say ``None`` except while it starts a
    task, whose code is then the innermost running (a task that started another one
    synchronously keeps its own context aside until that start returns).

    Caller: the runtime's executor, at import.
    """
    _TASK_SOURCES.append(source)


def current_task_context() -> ProcessingContext | None:
    """The context of the task whose code is running now, or ``None`` outside a task."""
    # The sources tell the task the event loop is starting; a thread without a running
    # loop (a task's asyncio.to_thread work) is not starting one, whatever they say.
    if _TASK_SOURCES and asyncio.events._get_running_loop() is not None:
        for source in _TASK_SOURCES:
            running = source()
            if running is not None:
                return running
    frames = _TASK_FRAMES
    frame = sys._getframe(1)
    while frame is not None:
        local = frames.get(frame.f_code)
        if local is not None:
            ctx: ProcessingContext | None = frame.f_locals.get(local)
            return ctx
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _task_fields(ctx: ProcessingContext) -> dict[str, Any]:
    key = ctx.key
    return {
        "subscription": ctx.subscription_id,
        "topic": ctx.topic,
        "partition": ctx.partition,
        "offset": ctx.offset,
        "key": key.decode(errors="replace") if key is not None else None,
    }


def add_task_context(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: add the running task's fields (values already bound win)."""
    ctx = current_task_context()
    if ctx is not None:
        for name, value in _task_fields(ctx).items():
            event_dict.setdefault(name, value)
    return event_dict


class TaskContextFilter(logging.Filter):
    """A ``logging`` filter that sets the running task's fields as record attributes
    (``%(topic)s`` and so on in a format string), ``None`` outside a task."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = current_task_context()
        fields = _task_fields(ctx) if ctx is not None else dict.fromkeys(TASK_FIELDS)
        for name, value in fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class _TaskFormatter(logging.Formatter):
    # The message, then the task's fields when the line was logged inside a task.
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if getattr(record, "topic", None) is None:
            return text
        fields = " ".join(f"{name}={getattr(record, name)}" for name in TASK_FIELDS)
        return f"{text} [{fields}]"


def configure_logging(
    level: str | None = None, *, json: bool | None = None, stream: TextIO | None = None
) -> None:
    """Configure structlog (and the standard ``logging`` module it forwards to).

    Args:
        level: one of `LOG_LEVELS`; ``$DECATON_AIO_LOG_LEVEL`` or ``info`` if omitted.
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
    fields: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_task_context,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    render: list[structlog.typing.Processor] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if json
        else [structlog.dev.ConsoleRenderer(colors=out.isatty())]
    )
    processors: list[structlog.typing.Processor] = [
        *fields,
        structlog.processors.StackInfoRenderer(),
        *render,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Third-party libraries (aiokafka) log through the standard module to the same stream,
    # as JSON objects with the same fields (and the logger's name) when the events are
    # JSON. Their INFO lines (every connection, every rebalance step) are noise unless
    # debugging.
    handler = logging.StreamHandler(out)
    handler.addFilter(TaskContextFilter())
    if json:
        handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=[structlog.stdlib.add_logger_name, *fields],
                processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
            )
        )
    else:
        handler.setFormatter(_TaskFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric if numeric == logging.DEBUG else max(numeric, logging.WARNING))
