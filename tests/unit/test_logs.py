"""Logging setup: JSON off a terminal, console on one, level from argument or env."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from decaton_aio.errors import ConfigError
from decaton_aio.logs import LOG_LEVEL_ENV_VAR, configure_logging


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


def test_unknown_level_is_a_config_error() -> None:
    """A level name that does not exist says which ones do."""
    with pytest.raises(ConfigError, match="debug, info, warning, error, critical"):
        configure_logging("loud")
