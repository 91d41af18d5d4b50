"""Logging setup: JSON off a terminal, console on one, level from argument or env; the
task fields of log lines inside a task."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading

import pytest
import structlog

from decaton_aio.context import ProcessingContext
from decaton_aio.errors import ConfigError
from decaton_aio.logs import LOG_LEVEL_ENV_VAR, configure_logging, current_task_context


def test_json_lines_when_not_a_terminal() -> None:
    """Off a terminal each event is one JSON object with level and timestamp."""
    out = io.StringIO()
    configure_logging("info", stream=out)
    structlog.get_logger("t").info("task done", offset=7)
    record = json.loads(out.getvalue().strip())
    assert record["event"] == "task done"
    assert record["offset"] == 7
    assert record["level"] == "info"
    assert "timestamp" in record


def test_level_from_environment_filters_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """$DECATON_AIO_LOG_LEVEL sets the level when no argument does."""
    monkeypatch.setenv(LOG_LEVEL_ENV_VAR, "warning")
    out = io.StringIO()
    configure_logging(stream=out, json=True)
    log = structlog.get_logger("t")
    log.info("hidden")
    log.warning("shown")
    lines = out.getvalue().strip().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["shown"]


def test_console_rendering_when_forced() -> None:
    """json=False renders for people: the event text, not a JSON object."""
    out = io.StringIO()
    configure_logging("info", json=False, stream=out)
    structlog.get_logger("t").info("hello", key="k")
    text = out.getvalue()
    assert "hello" in text
    assert not text.lstrip().startswith("{")


def test_the_logging_modules_lines_are_json_objects_when_events_are() -> None:
    """A library's line through the logging module (aiokafka's warnings) is one JSON
    object with its logger, level, timestamp, the bound context (a worker's number) and
    an exception's traceback, so a JSON log pipeline reads every line."""
    out = io.StringIO()
    configure_logging("info", json=True, stream=out)
    structlog.contextvars.bind_contextvars(worker=2)
    try:
        logging.getLogger("library.client").warning("Heartbeat failed for %s", "g")
        logging.getLogger("library.client").info("hidden: below warning")
        try:
            raise ZeroDivisionError("zero")
        except ZeroDivisionError:
            logging.getLogger("user").exception("it broke")
    finally:
        structlog.contextvars.unbind_contextvars("worker")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["event"] == "Heartbeat failed for g"
    assert (first["logger"], first["level"], first["worker"]) == ("library.client", "warning", 2)
    assert "timestamp" in first
    assert second["level"] == "error"
    assert "ZeroDivisionError: zero" in second["exception"]


def test_unknown_level_is_a_config_error() -> None:
    """A level name that does not exist says which ones do."""
    with pytest.raises(ConfigError, match="debug, info, warning, error, critical"):
        configure_logging("loud")


# ------------------------------------------------------------------- task fields


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "console"])
async def test_any_logger_inside_a_task_carries_the_task_fields(as_json: bool) -> None:
    """A log line inside a task, through a plain structlog logger or the logging module,
    before and after the task waited, carries topic, partition, offset, key and
    subscription; a line outside any task carries none. With JSON events the logging
    module's lines are JSON objects too; on a console they end with the fields."""
    from tests.unit.test_partition import make, records, settle

    out = io.StringIO()
    configure_logging("info", json=as_json, stream=out)
    release = asyncio.Event()

    async def process(ctx: ProcessingContext, task: object) -> None:
        structlog.get_logger("user").info("first step")
        logging.getLogger("user.stdlib").warning("stdlib first step")
        if ctx.offset == 1:
            await release.wait()
            structlog.get_logger("user").info("after waiting")
            logging.getLogger("user.stdlib").warning("stdlib after waiting")

    proc = make(process)
    proc.feed(records([b"k0", b"k1"], first=0))
    structlog.get_logger("runtime").info("outside")
    release.set()
    await settle()
    assert proc.committable() == 2
    lines = out.getvalue().splitlines()
    if not as_json:
        stdlib = [line for line in lines if line.startswith("stdlib")]
        assert stdlib == [
            "stdlib first step [subscription=test topic=tasks partition=0 offset=0 key=k0]",
            "stdlib first step [subscription=test topic=tasks partition=0 offset=1 key=k1]",
            "stdlib after waiting [subscription=test topic=tasks partition=0 offset=1 key=k1]",
        ]
        return
    events = [json.loads(line) for line in lines]  # every line, the logging module's too
    by_event = {(e["event"], e.get("offset")): e for e in events}
    for offset, key in ((0, "k0"), (1, "k1")):
        for event in ("first step", "stdlib first step"):
            entry = by_event[(event, offset)]
            assert (entry["topic"], entry["partition"], entry["key"]) == ("tasks", 0, key)
            assert entry["subscription"] == "test"
    for event in ("after waiting", "stdlib after waiting"):
        resumed = by_event[(event, 1)]
        assert (resumed["topic"], resumed["key"]) == ("tasks", "k1")
    assert by_event[("stdlib first step", 0)]["logger"] == "user.stdlib"
    assert by_event[("stdlib first step", 0)]["level"] == "warning"
    outside = by_event[("outside", None)]
    assert "topic" not in outside


@pytest.mark.parametrize("keys", ["one", "distinct"])
async def test_task_fields_in_workers_and_bound_values_win(keys: str) -> None:
    """Tasks that wait run on in workers: a task handed to a worker as it reports the last
    one (one key, so each start follows a completion), and tasks started as new workers
    once most tasks wait (distinct keys: task mode). Their lines still carry the fields;
    a value the caller bound itself is kept."""
    from decaton_aio.consumer._eager import PROBE_EVERY
    from tests.unit.test_partition import make, records, settle

    out = io.StringIO()
    configure_logging("info", json=True, stream=out)

    async def process(ctx: ProcessingContext, task: object) -> None:
        await asyncio.sleep(0)
        structlog.get_logger("user").info("done", key="mine")

    count = 2 * PROBE_EVERY
    if keys == "one":
        proc = make(process, limit=1)
        proc.feed(records([b"a"] * count))
    else:
        proc = make(process)
        proc.feed(records([b"%d" % n for n in range(count)]))
    starter = proc._executor._starter  # type: ignore[attr-defined]
    if keys == "distinct":
        assert starter.task_mode
    while proc.pending:
        await settle()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert sorted(e["offset"] for e in events) == list(range(count))
    assert {e["key"] for e in events} == {"mine"}
    assert all(e["topic"] == "tasks" for e in events)


async def test_lines_while_a_task_starts_carry_its_fields_and_none_after() -> None:
    """A line logged while the runtime starts a task (its serializer decoding the body)
    carries that task's fields, also for a task started by another one's end; once the
    start returns there is no current task."""
    from tests.unit.test_partition import make, records, settle

    out = io.StringIO()
    configure_logging("info", json=True, stream=out)

    def decode(value: bytes | None) -> object:
        structlog.get_logger("user").info("decoding")
        return value

    async def process(ctx: ProcessingContext, task: object) -> None:
        return None

    proc = make(process, limit=1, decode=decode)  # each end starts the next: nested starts
    proc.feed(records([b"a", b"b", b"c"]))
    assert current_task_context() is None
    await settle()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["event"], e["offset"], e["key"]) for e in events] == [
        ("decoding", 0, "a"),
        ("decoding", 1, "b"),
        ("decoding", 2, "c"),
    ]


async def test_a_thread_of_one_task_does_not_log_with_the_fields_of_a_task_starting() -> None:
    """A line logged by a task's worker thread (asyncio.to_thread) while the event loop
    starts another task carries no task's fields: the line was given the starting task's
    topic, partition, offset and key."""
    from tests.unit.test_execution import until
    from tests.unit.test_partition import make, records

    out = io.StringIO()
    configure_logging("info", json=True, stream=out)
    b_starting, logged = threading.Event(), threading.Event()

    def in_a_thread() -> None:
        b_starting.wait(5)
        structlog.get_logger("user").info("from a thread")
        logged.set()

    async def process(ctx: ProcessingContext, task: object) -> None:
        if ctx.offset == 0:
            await asyncio.to_thread(in_a_thread)
        else:  # task b's first step, while the loop is starting it
            b_starting.set()
            assert logged.wait(5)

    proc = make(process)
    proc.feed(records([b"a"]))
    await asyncio.sleep(0)  # task a's thread is waiting
    proc.feed(records([b"b"], first=1))
    await until(lambda: proc.committable() == 2)
    (line,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert line["event"] == "from a thread"
    assert "offset" not in line
    assert "key" not in line


def test_no_task_outside_the_runtime() -> None:
    """Outside the runtime there is no current task."""
    assert current_task_context() is None
