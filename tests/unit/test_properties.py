"""Unit tests of runtime properties: definitions, live values, reloads and sources."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from decaton_aio.errors import ConfigError
from decaton_aio.properties import (
    BUILTIN_DEFINITIONS,
    COMMIT_INTERVAL_MS,
    IGNORE_KEYS,
    MAX_PENDING_RECORDS,
    PARTITION_CONCURRENCY,
    PROCESSING_RATE_PER_PARTITION,
    RESET,
    FilePropertySource,
    KafkaPropertySource,
    Properties,
    Property,
    PropertyDefinition,
    apply_record,
    bool_property,
    decode_record,
    encode_record,
    env_var_name,
    int_property,
    parse_assignments,
    parse_properties_text,
    properties_from_env,
    read_property_file,
    render_markdown_table,
    str_list_property,
)
from decaton_aio.properties import _kafka_source as kafka_property_source

STATIC_FLAG = bool_property(
    "test.static.flag", False, reloadable=False, doc="A flag fixed at start."
)
CUSTOM_DEFINITIONS = (*BUILTIN_DEFINITIONS, STATIC_FLAG)


async def _until(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    """Wait until ``condition()`` holds, failing the test after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        # Polling is the point: file edits and log lines have no event to wait on.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


# --- Definitions and defaults -------------------------------------------------------------


def test_defaults_are_the_documented_values() -> None:
    """With no layers, every property holds its definition's default."""
    props = Properties()
    assert props.snapshot() == {d.name: d.default for d in BUILTIN_DEFINITIONS}
    assert props[PARTITION_CONCURRENCY].value == 384
    assert props[MAX_PENDING_RECORDS].value == 10000
    assert props[COMMIT_INTERVAL_MS].value == 1000
    assert props["decaton.group.rebalance.timeout.ms"].value == 1000
    assert props["decaton.processing.shutdown.timeout.ms"].value == 30000
    assert props[IGNORE_KEYS].value == ()
    assert props[PROCESSING_RATE_PER_PARTITION].value == -1
    assert props["decaton.deferred.complete.timeout.ms"].value == 300_000
    assert props["decaton.per.key.quota.processing.rate"].value == -1


def test_builtin_names_are_unique_and_reloadable() -> None:
    """Built-in names are unique, and every built-in knob can change live."""
    names = [d.name for d in BUILTIN_DEFINITIONS]
    assert len(names) == len(set(names))
    assert all(d.reloadable for d in BUILTIN_DEFINITIONS)


def test_definition_rejects_a_malformed_name() -> None:
    """A definition name must be dotted lower-case words."""
    with pytest.raises(ConfigError, match="malformed"):
        int_property("Bad Name", 1, minimum=0, reloadable=True, doc="x")


def test_definition_rejects_a_default_it_does_not_allow() -> None:
    """A definition whose default fails its own validator cannot be built."""
    with pytest.raises(ConfigError, match="default 0"):
        int_property("my.knob", 0, minimum=1, reloadable=True, doc="x")


def test_definition_requires_a_one_line_doc() -> None:
    """The doc is one line, so it fits a table cell."""
    with pytest.raises(ConfigError, match="one non-empty line"):
        int_property("my.knob", 1, minimum=1, reloadable=True, doc="two\nlines")


def test_validator_may_raise_instead_of_returning_a_message() -> None:
    """A validator that raises ValueError rejects the value with its message."""

    def even(value: int) -> str | None:
        if value % 2:
            raise ValueError(f"{value} is odd")
        return None

    definition = PropertyDefinition(
        name="my.even",
        default=2,
        parser=int,
        coerce=lambda raw: int(str(raw)),
        validator=even,
        allowed="an even integer",
        reloadable=True,
        doc="An even number.",
    )
    assert definition.convert("4") == 4
    with pytest.raises(ConfigError, match="3 is odd"):
        definition.convert(3)


# --- Parsing ------------------------------------------------------------------------------


def test_strings_are_parsed_and_values_from_code_kept() -> None:
    """Strings (CLI, env, files) are parsed; typed values from code are taken as is."""
    props = Properties(
        {PARTITION_CONCURRENCY: 64, "decaton.ignore.keys": " a, b,,c "},
        {"decaton.commit.interval.ms": " 500 "},
    )
    assert props[PARTITION_CONCURRENCY].value == 64
    assert props[IGNORE_KEYS].value == ("a", "b", "c")
    assert props[COMMIT_INTERVAL_MS].value == 500


def test_later_layers_override_earlier_ones() -> None:
    """Layers are given lowest precedence first."""
    props = Properties({PARTITION_CONCURRENCY: 8}, {"decaton.partition.concurrency": "16"})
    assert props[PARTITION_CONCURRENCY].value == 16


def test_list_values_from_code_and_json_become_tuples() -> None:
    """A list of strings is accepted and stored immutably."""
    props = Properties({IGNORE_KEYS: ["k1", "k2"]})
    assert props[IGNORE_KEYS].value == ("k1", "k2")


def test_bool_property_parses_common_spellings() -> None:
    """Boolean strings parse case-insensitively; other strings are rejected."""
    flag = bool_property("my.flag", False, reloadable=True, doc="A flag.")
    assert [flag.convert(s) for s in ("true", "YES", "on", "1")] == [True] * 4
    assert [flag.convert(s) for s in ("false", "No", "off", "0")] == [False] * 4
    with pytest.raises(ConfigError, match="true or false"):
        flag.convert("maybe")


def test_parse_assignments_reads_name_equals_value() -> None:
    """CLI ``--property NAME=VALUE`` items become a layer; a missing ``=`` is an error."""
    assert parse_assignments(["decaton.partition.concurrency=64", "decaton.ignore.keys=a=b"]) == {
        "decaton.partition.concurrency": "64",
        "decaton.ignore.keys": "a=b",
    }
    with pytest.raises(ConfigError, match="expected NAME=VALUE"):
        parse_assignments(["decaton.partition.concurrency"])


@given(st.integers(min_value=1, max_value=2**62))
def test_int_values_round_trip_through_their_string_form(value: int) -> None:
    """Every allowed integer survives format then parse."""
    assert PARTITION_CONCURRENCY.convert(PARTITION_CONCURRENCY.format(value)) == value


@given(st.integers(max_value=0))
def test_int_values_below_the_minimum_are_rejected(value: int) -> None:
    """Every integer below the minimum is rejected, as value and as string."""
    with pytest.raises(ConfigError):
        PARTITION_CONCURRENCY.convert(value)
    with pytest.raises(ConfigError):
        PARTITION_CONCURRENCY.convert(str(value))


@given(st.lists(st.text(alphabet="abcXYZ019_-:", min_size=1), max_size=5))
def test_key_lists_round_trip_through_their_string_form(keys: list[str]) -> None:
    """Lists of keys without commas or edge spaces survive format then parse."""
    assert IGNORE_KEYS.convert(IGNORE_KEYS.format(tuple(keys))) == tuple(keys)


# --- Strict start -------------------------------------------------------------------------


def test_bad_value_at_start_raises_config_error_naming_what_is_allowed() -> None:
    """Start is strict: a value that is not allowed raises with name, value and rule."""
    with pytest.raises(ConfigError) as info:
        Properties({"decaton.partition.concurrency": "0"})
    message = str(info.value)
    assert "decaton.partition.concurrency" in message
    assert "'0'" in message
    assert "an integer >= 1" in message


@pytest.mark.parametrize("raw", ["abc", "1.5", 1.5, True, None, [1]])
def test_wrongly_typed_values_at_start_are_rejected(raw: object) -> None:
    """Unparsable strings and wrong types (including bool for int) are rejected."""
    with pytest.raises(ConfigError, match="expected an integer >= 1"):
        Properties({PARTITION_CONCURRENCY: raw})


def test_unknown_name_at_start_suggests_the_closest_known_name() -> None:
    """A misspelt name raises ConfigError with a did-you-mean suggestion."""
    with pytest.raises(
        ConfigError, match=re.escape("did you mean 'decaton.partition.concurrency'")
    ):
        Properties({"decaton.partition.concurency": 4})


def test_unknown_name_without_a_close_match_lists_known_names() -> None:
    """A name like nothing known lists the known names instead."""
    with pytest.raises(
        ConfigError, match=re.escape("known properties: decaton.partition.concurrency")
    ):
        Properties({"zzz.qqq": 4})


def test_all_start_problems_are_reported_together() -> None:
    """Every problem at start appears in the one error, so one run shows them all."""
    with pytest.raises(ConfigError) as info:
        Properties({"decaton.max.pending.record": 1, COMMIT_INTERVAL_MS: "-5"})
    assert "decaton.max.pending.records" in str(info.value)
    assert "decaton.commit.interval.ms" in str(info.value)


def test_a_start_problem_names_the_layer_it_is_in() -> None:
    """With the layers' sources given, each problem says which layer holds it."""
    with pytest.raises(ConfigError) as info:
        Properties(
            {COMMIT_INTERVAL_MS: 100},
            {"decaton.max.pending.record": 1},
            {COMMIT_INTERVAL_MS: "-5"},
            sources=["in the code", "in the topic t", "from the environment"],
        )
    message = str(info.value)
    assert "'decaton.max.pending.records'? (in the topic t)" in message
    assert "(from the environment)" in message
    assert "in the code" not in message


def test_duplicate_definitions_are_refused() -> None:
    """Two definitions with one name are a programming error caught at start."""
    with pytest.raises(ConfigError, match="defined twice"):
        Properties(definitions=(*BUILTIN_DEFINITIONS, PARTITION_CONCURRENCY))


def test_lookup_of_unknown_name_raises_key_error_with_suggestion() -> None:
    """``props[name]`` for an unknown name raises KeyError suggesting the closest name."""
    props = Properties()
    with pytest.raises(KeyError, match="did you mean"):
        props["decaton.ignore.key"]
    assert "decaton.ignore.keys" in props
    assert PARTITION_CONCURRENCY in props
    assert len(props) == len(list(props)) == len(BUILTIN_DEFINITIONS)
    assert props.get(PARTITION_CONCURRENCY) is props[PARTITION_CONCURRENCY]


# --- Lenient reload -----------------------------------------------------------------------


def test_rejected_reload_keeps_old_value_and_logs_one_clear_warning() -> None:
    """set() with a bad value returns False, keeps the old value and logs one warning."""
    prop = Properties({PARTITION_CONCURRENCY: 32})[PARTITION_CONCURRENCY]
    with capture_logs() as logs:
        assert prop.set("0") is False
    assert prop.value == 32
    assert len(logs) == 1
    entry = logs[0]
    assert entry["log_level"] == "warning"
    assert entry["property"] == "decaton.partition.concurrency"
    assert entry["value"] == "0"
    assert entry["allowed"] == "an integer >= 1"


def test_accepted_reload_changes_the_value() -> None:
    """set() with a good string or typed value changes the value and returns True."""
    prop = Properties()[PARTITION_CONCURRENCY]
    assert prop.set("12") is True
    assert prop.value == 12
    assert prop.set(13) is True
    assert prop.value == 13


def test_update_applies_a_batch_and_reports_what_was_accepted() -> None:
    """update() applies each entry on its own; bad and unknown ones are skipped."""
    props = Properties()
    with capture_logs() as logs:
        results = props.update(
            {
                "decaton.partition.concurrency": "10",
                "decaton.max.pending.records": "-3",
                "decaton.comit.interval.ms": "5",
            }
        )
    assert results == {
        "decaton.partition.concurrency": True,
        "decaton.max.pending.records": False,
        "decaton.comit.interval.ms": False,
    }
    assert props[PARTITION_CONCURRENCY].value == 10
    assert props[MAX_PENDING_RECORDS].value == 10000
    unknown = [e for e in logs if e["event"] == "unknown property ignored"]
    assert "did you mean 'decaton.commit.interval.ms'" in unknown[0]["hint"]


def test_reset_returns_to_the_value_at_start() -> None:
    """RESET in a batch (a removed line, a tombstone) restores the start value."""
    props = Properties({PARTITION_CONCURRENCY: 20})
    props.update({PARTITION_CONCURRENCY: 99})
    assert props.update({PARTITION_CONCURRENCY: RESET}) == {"decaton.partition.concurrency": True}
    assert props[PARTITION_CONCURRENCY].value == 20


def test_non_reloadable_property_refuses_a_change_after_start() -> None:
    """A non-reloadable property keeps its start value; setting the same value is fine."""
    props = Properties({STATIC_FLAG: "true"}, definitions=CUSTOM_DEFINITIONS)
    prop = props[STATIC_FLAG]
    seen: list[tuple[bool, bool]] = []
    prop.subscribe(lambda old, new: seen.append((old, new)))
    with capture_logs() as logs:
        assert prop.set(False) is False
        assert prop.set("yes") is True
    assert prop.value is True
    assert seen == []
    assert len(logs) == 1
    assert "not reloadable" in logs[0]["event"]
    assert logs[0]["property"] == "test.static.flag"


# --- Listeners ----------------------------------------------------------------------------


def test_listeners_get_old_and_new_after_a_change() -> None:
    """Listeners run synchronously after a change with (old, new), not on no-ops."""
    prop = Properties()[PARTITION_CONCURRENCY]
    seen: list[tuple[int, int]] = []
    prop.subscribe(lambda old, new: seen.append((old, new)))
    prop.set(10)
    assert seen == [(384, 10)]
    prop.set(10)
    prop.set("nope")
    assert seen == [(384, 10)]


def test_a_failing_listener_is_logged_and_others_still_run() -> None:
    """An exception in one listener is logged; later listeners and the change stand."""
    prop = Property(PARTITION_CONCURRENCY)
    seen: list[int] = []

    def broken(old: int, new: int) -> None:
        raise RuntimeError("listener bug")

    prop.subscribe(broken)
    prop.subscribe(lambda old, new: seen.append(new))
    with capture_logs() as logs:
        assert prop.set(7) is True
    assert seen == [7]
    assert prop.value == 7
    errors = [e for e in logs if e["log_level"] == "error"]
    assert errors[0]["event"] == "property listener failed"
    assert errors[0]["property"] == "decaton.partition.concurrency"


def test_unsubscribe_stops_notifications_and_is_idempotent() -> None:
    """The handle from subscribe() removes only that subscription."""
    prop = Property(PARTITION_CONCURRENCY)
    first: list[int] = []
    second: list[int] = []
    unsubscribe = prop.subscribe(lambda old, new: first.append(new))
    prop.subscribe(lambda old, new: second.append(new))
    unsubscribe()
    unsubscribe()
    prop.set(3)
    assert first == []
    assert second == [3]


def test_a_listener_may_unsubscribe_itself_while_notified() -> None:
    """Unsubscribing during notification does not skip other listeners."""
    prop = Property(PARTITION_CONCURRENCY)
    seen: list[str] = []
    handle: list[Callable[[], None]] = []

    def once(old: int, new: int) -> None:
        seen.append("once")
        handle[0]()

    handle.append(prop.subscribe(once))
    prop.subscribe(lambda old, new: seen.append("always"))
    prop.set(4)
    prop.set(5)
    assert seen == ["once", "always", "always"]


# --- Docs ---------------------------------------------------------------------------------


def test_markdown_table_has_a_row_for_every_definition() -> None:
    """The docs table has a header and one row per definition with default and flag."""
    table = render_markdown_table()
    lines = table.splitlines()
    assert lines[0] == "| Name | Default | Reloadable | Allowed | Description |"
    assert len(lines) == 2 + len(BUILTIN_DEFINITIONS)
    for definition in BUILTIN_DEFINITIONS:
        assert f"| `{definition.name}` |" in table
    assert "| `decaton.partition.concurrency` | `384` | yes |" in table
    assert "| `decaton.ignore.keys` | (empty) | yes |" in table
    assert "a few KB" in table


def test_markdown_table_escapes_pipes() -> None:
    """A pipe in a doc does not break the table."""
    odd = int_property("my.knob", 1, minimum=1, reloadable=False, doc="a | b")
    assert "a \\| b" in render_markdown_table([odd])
    assert "| no |" in render_markdown_table([odd])


# --- Environment --------------------------------------------------------------------------


def test_env_vars_map_to_property_names() -> None:
    """DECATON_PARTITION_CONCURRENCY=64 sets decaton.partition.concurrency; others ignored."""
    env = {
        "DECATON_PARTITION_CONCURRENCY": "64",
        "DECATON_IGNORE_KEYS": "a,b",
        "DECATON_AIO_BOOTSTRAP_SERVERS": "localhost:9092",
        "PATH": "/bin",
    }
    layer = properties_from_env(env)
    assert layer == {"decaton.partition.concurrency": "64", "decaton.ignore.keys": "a,b"}
    assert Properties(layer)[PARTITION_CONCURRENCY].value == 64
    assert env_var_name(MAX_PENDING_RECORDS) == "DECATON_MAX_PENDING_RECORDS"


def test_misspelt_env_var_is_logged_with_the_closest_name() -> None:
    """A DECATON_ variable close to a property variable is reported, not silently used."""
    with capture_logs() as logs:
        assert properties_from_env({"DECATON_PARTITION_CONCURENCY": "2"}) == {}
    assert logs[0]["hint"] == "DECATON_PARTITION_CONCURRENCY"


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit mapping the process environment is read."""
    monkeypatch.setenv("DECATON_COMMIT_INTERVAL_MS", "250")
    assert properties_from_env()["decaton.commit.interval.ms"] == "250"


# --- Files --------------------------------------------------------------------------------


def test_properties_text_parses_lines_and_skips_comments() -> None:
    """``name=value`` lines are read, and as in Java ``name: value`` and ``name value``
    (the name ends at the first ``=``, ``:`` or blank; the value keeps any later ones);
    ``#``/``!`` comments and blank lines skipped. A line with no name is refused without
    being echoed (it may hold a password)."""
    text = "# comment\n! also comment\n\n decaton.partition.concurrency = 8 \nx.y=a=b\n"
    text += "ssl.key.password: c2VjcmV0=\nsasl.mechanism   PLAIN\nflag\n"
    assert parse_properties_text(text) == {
        "decaton.partition.concurrency": "8",
        "x.y": "a=b",
        "ssl.key.password": "c2VjcmV0=",
        "sasl.mechanism": "PLAIN",
        "flag": "",
    }
    with pytest.raises(ConfigError, match="line 2: expected name=value") as raised:
        parse_properties_text("a.b=1\n: PW-SECRET\n")
    assert "PW-SECRET" not in str(raised.value)


def test_read_property_file_by_suffix(tmp_path: Path) -> None:
    """The suffix picks JSON or .properties; JSON nulls count as absent."""
    json_file = tmp_path / "p.json"
    json_file.write_text('{"decaton.partition.concurrency": 8, "decaton.ignore.keys": null}')
    assert read_property_file(json_file) == {"decaton.partition.concurrency": 8}
    props_file = tmp_path / "p.properties"
    props_file.write_text("decaton.partition.concurrency=9\n")
    assert read_property_file(props_file) == {"decaton.partition.concurrency": "9"}


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("p.json", "{not json", "invalid JSON"),
        ("p.json", "[1, 2]", "JSON object"),
        ("p.properties", "= no name", "line 1"),
        ("p.yaml", "a: 1", "unsupported suffix"),
    ],
)
def test_read_property_file_errors_are_config_errors(
    tmp_path: Path, name: str, content: str, match: str
) -> None:
    """Unparsable files and unsupported suffixes raise ConfigError naming the file."""
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        read_property_file(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A missing file at start is an error (start is strict)."""
    with pytest.raises(ConfigError, match=re.escape("missing.json")):
        read_property_file(tmp_path / "missing.json")


def test_file_source_rejects_unsupported_suffix_and_bad_interval(tmp_path: Path) -> None:
    """Constructor arguments are validated up front."""
    with pytest.raises(ConfigError, match="unsupported suffix"):
        FilePropertySource(tmp_path / "p.txt")
    with pytest.raises(ConfigError, match="interval_s"):
        FilePropertySource(tmp_path / "p.json", interval_s=0)


def _rewrite(path: Path, content: str) -> None:
    """Write ``content`` and bump the mtime so the change is seen even on coarse clocks."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(content)
    os.utime(path, ns=(before + 10_000_000, before + 10_000_000))


async def test_json_file_source_picks_up_an_edit(tmp_path: Path) -> None:
    """Editing a watched JSON file changes the live property and notifies listeners."""
    path = tmp_path / "props.json"
    path.write_text(json.dumps({"decaton.partition.concurrency": 16}))
    source = FilePropertySource(path, interval_s=0.01)
    props = Properties(await source.load())
    assert props[PARTITION_CONCURRENCY].value == 16
    seen: list[tuple[int, int]] = []
    props[PARTITION_CONCURRENCY].subscribe(lambda old, new: seen.append((old, new)))
    await source.start(props)
    try:
        _rewrite(path, json.dumps({"decaton.partition.concurrency": 48}))
        await _until(lambda: props[PARTITION_CONCURRENCY].value == 48)
    finally:
        await source.stop()
    assert seen == [(16, 48)]


async def test_properties_file_source_picks_up_an_edit_and_resets_removed_names(
    tmp_path: Path,
) -> None:
    """A .properties edit applies; a name removed from the file returns to its start value."""
    path = tmp_path / "props.properties"
    path.write_text("# tuning\ndecaton.max.pending.records=500\n")
    source = FilePropertySource(path, interval_s=0.01)
    props = Properties()
    await source.start(props)
    try:
        assert props[MAX_PENDING_RECORDS].value == 500
        _rewrite(path, "decaton.ignore.keys=k1,k2\n")
        await _until(lambda: props[IGNORE_KEYS].value == ("k1", "k2"))
        assert props[MAX_PENDING_RECORDS].value == 10000
    finally:
        await source.stop()


async def test_broken_file_changes_nothing_until_fixed(tmp_path: Path) -> None:
    """A file that fails to parse is logged and changes nothing; fixing it applies."""
    path = tmp_path / "props.json"
    path.write_text(json.dumps({"decaton.partition.concurrency": 16}))
    source = FilePropertySource(path, interval_s=0.01)
    props = Properties()
    await source.start(props)
    try:
        with capture_logs() as logs:
            _rewrite(path, '{"decaton.partition.concurrency": 3')
            await _until(lambda: any(e["event"].startswith("property file rejected") for e in logs))
        assert props[PARTITION_CONCURRENCY].value == 16
        _rewrite(path, json.dumps({"decaton.partition.concurrency": 3}))
        await _until(lambda: props[PARTITION_CONCURRENCY].value == 3)
    finally:
        await source.stop()


async def test_a_line_removed_between_load_and_start_is_reset(tmp_path: Path) -> None:
    """The layer a file source loaded at start loses a line removed before the source
    starts watching: the property goes back to the layers below (it kept the loaded value
    until the line came and went again)."""
    path = tmp_path / "props.json"
    path.write_text(json.dumps({"decaton.partition.concurrency": 16}))
    source = FilePropertySource(path, interval_s=0.01)
    props = Properties({}, await source.load())
    assert props[PARTITION_CONCURRENCY].value == 16
    _rewrite(path, "{}")
    await source.start(props, layer=1)
    try:
        assert props[PARTITION_CONCURRENCY].value == 384
    finally:
        await source.stop()


async def test_file_source_keeps_values_when_the_file_is_deleted(tmp_path: Path) -> None:
    """Deleting the file keeps the current values; recreating it applies again."""
    path = tmp_path / "props.json"
    path.write_text(json.dumps({"decaton.partition.concurrency": 16}))
    source = FilePropertySource(path, interval_s=0.01)
    props = Properties()
    await source.start(props)
    try:
        with capture_logs() as logs:
            path.unlink()
            await _until(lambda: any("gone" in e["event"] for e in logs))
        assert props[PARTITION_CONCURRENCY].value == 16
        path.write_text(json.dumps({"decaton.partition.concurrency": 17}))
        await _until(lambda: props[PARTITION_CONCURRENCY].value == 17)
    finally:
        await source.stop()


async def test_file_source_stop_cancels_the_routine_and_start_twice_fails(tmp_path: Path) -> None:
    """stop() ends watching (later edits are ignored); starting twice is an error."""
    path = tmp_path / "props.json"
    path.write_text("{}")
    source = FilePropertySource(path, interval_s=0.01)
    props = Properties()
    await source.start(props)
    with pytest.raises(RuntimeError, match="already started"):
        await source.start(props)
    await source.stop()
    await source.stop()
    _rewrite(path, json.dumps({"decaton.partition.concurrency": 5}))
    await asyncio.sleep(0.05)
    assert props[PARTITION_CONCURRENCY].value == 384


# --- Kafka records ------------------------------------------------------------------------


def test_apply_record_sets_the_named_property() -> None:
    """A keyed record sets the property named by its key to its JSON value."""
    props = Properties()
    assert apply_record(props, b"decaton.partition.concurrency", b"64") == {
        "decaton.partition.concurrency": True
    }
    assert apply_record(props, b"decaton.ignore.keys", b'["a","b"]')
    assert props[PARTITION_CONCURRENCY].value == 64
    assert props[IGNORE_KEYS].value == ("a", "b")


def test_apply_record_tombstone_or_null_resets() -> None:
    """A tombstone or JSON null resets the property to its start value."""
    props = Properties({PARTITION_CONCURRENCY: 8})
    apply_record(props, b"decaton.partition.concurrency", b'"30"')
    assert props[PARTITION_CONCURRENCY].value == 30
    apply_record(props, b"decaton.partition.concurrency", None)
    assert props[PARTITION_CONCURRENCY].value == 8
    apply_record(props, b"decaton.partition.concurrency", b"31")
    apply_record(props, b"decaton.partition.concurrency", b"null")
    assert props[PARTITION_CONCURRENCY].value == 8


def test_apply_keyless_record_applies_a_batch() -> None:
    """A key-less record holding a JSON object applies every entry."""
    props = Properties()
    results = apply_record(
        props, None, b'{"decaton.partition.concurrency": 5, "decaton.max.pending.records": 0}'
    )
    assert results == {"decaton.partition.concurrency": True, "decaton.max.pending.records": False}
    assert props[PARTITION_CONCURRENCY].value == 5


@pytest.mark.parametrize(
    ("key", "value"),
    [(b"decaton.partition.concurrency", b"{oops"), (None, b"[1]"), (None, None), (b"\xff", b"1")],
)
def test_undecodable_record_is_logged_and_changes_nothing(
    key: bytes | None, value: bytes | None
) -> None:
    """Records that are not valid property records are logged and skipped."""
    props = Properties()
    with capture_logs() as logs:
        assert apply_record(props, key, value) == {}
    assert props.snapshot() == Properties().snapshot()
    assert logs[0]["event"] == "undecodable property record skipped"


def test_encode_record_round_trips_through_decode() -> None:
    """encode_record builds what decode_record reads, including tombstones."""
    assert decode_record(*encode_record("a.b", ["x"])) == {"a.b": ["x"]}
    assert encode_record("a.b", RESET) == (b"a.b", None)
    assert decode_record(*encode_record("a.b", RESET)) == {"a.b": RESET}


@dataclass
class _Record:
    key: bytes | None
    value: bytes | None


@dataclass
class _FakeConsumer:
    """A one-partition stand-in for AIOKafkaConsumer: a log, a position, live appends."""

    log: list[_Record]
    position_: int = 0
    started: bool = False
    stopped: bool = False
    arrivals: asyncio.Queue[_Record] = field(default_factory=asyncio.Queue)
    failures: list[Exception] = field(default_factory=list)

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def assignment(self) -> set[Any]:
        return {"tp0"}

    async def seek_to_beginning(self, *partitions: Any) -> None:
        self.position_ = 0

    async def end_offsets(self, partitions: list[Any]) -> dict[Any, int]:
        return {"tp0": len(self.log)}

    async def position(self, partition: Any) -> int:
        return self.position_

    async def getmany(self, *, timeout_ms: int) -> dict[Any, list[Any]]:
        if self.position_ < len(self.log):
            # Two records per fetch, so the backlog needs several fetches.
            batch = self.log[self.position_ : self.position_ + 2]
            self.position_ += len(batch)
            return {"tp0": batch}
        if self.failures:
            raise self.failures.pop(0)
        try:
            record = await asyncio.wait_for(self.arrivals.get(), timeout_ms / 1000)
        except TimeoutError:
            return {}
        self.log.append(record)
        self.position_ += 1
        return {"tp0": [record]}


def _record(name: str, value: object) -> _Record:
    return _Record(*encode_record(name, value))


async def test_kafka_source_applies_latest_backlog_once_then_live_changes() -> None:
    """The backlog is folded (latest per name) and applied once; new records apply live."""
    consumer = _FakeConsumer(
        [
            _record("decaton.partition.concurrency", 10),
            _record("decaton.partition.concurrency", 20),
            _record("decaton.max.pending.records", 50),
            _record("decaton.max.pending.records", RESET),
            _Record(None, b"not json"),
            _record("decaton.partition.concurrency", 30),
        ]
    )
    source = KafkaPropertySource("unused:9092", "props", consumer_factory=lambda: consumer)
    props = Properties()
    seen: list[tuple[int, int]] = []
    props[PARTITION_CONCURRENCY].subscribe(lambda old, new: seen.append((old, new)))
    await source.start(props)
    try:
        assert seen == [(384, 30)]
        assert props[MAX_PENDING_RECORDS].value == 10000
        consumer.arrivals.put_nowait(_record("decaton.partition.concurrency", 40))
        await _until(lambda: props[PARTITION_CONCURRENCY].value == 40)
    finally:
        await source.stop()
    assert consumer.stopped
    assert seen == [(384, 30), (30, 40)]


async def test_kafka_source_load_returns_latest_values_without_resets() -> None:
    """load() reads to the current end and returns the latest value per name."""
    consumer = _FakeConsumer(
        [
            _record("decaton.partition.concurrency", 10),
            _record("decaton.ignore.keys", "a"),
            _record("decaton.ignore.keys", RESET),
            _record("decaton.partition.concurrency", 12),
        ]
    )
    source = KafkaPropertySource("unused:9092", "props", consumer_factory=lambda: consumer)
    assert await source.load() == {"decaton.partition.concurrency": 12}
    assert consumer.started
    assert consumer.stopped


async def test_kafka_source_survives_a_fetch_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Kafka error while fetching is logged and retried; later records still apply."""
    monkeypatch.setattr(kafka_property_source, "_FETCH_RETRY_BACKOFF_S", 0.001)
    consumer = _FakeConsumer([], failures=[KafkaError("broker gone")])
    source = KafkaPropertySource("unused:9092", "props", consumer_factory=lambda: consumer)
    props = Properties()
    with capture_logs() as logs:
        await source.start(props)
        try:
            consumer.arrivals.put_nowait(_record("decaton.partition.concurrency", 9))
            await _until(lambda: props[PARTITION_CONCURRENCY].value == 9)
        finally:
            await source.stop()
    assert any(e["event"] == "property topic fetch failed" for e in logs)


async def test_unexpected_routine_failure_is_logged_and_reraised_by_stop() -> None:
    """A bug that ends the routine is logged at once and re-raised to the supervisor."""
    consumer = _FakeConsumer([], failures=[RuntimeError("bug")])
    source = KafkaPropertySource("unused:9092", "props", consumer_factory=lambda: consumer)
    with capture_logs() as logs:
        await source.start(Properties())
        await _until(lambda: consumer.stopped)
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="bug"):
            await source.stop()
    assert any(e["event"] == "property source routine failed" for e in logs)


async def test_kafka_source_with_an_empty_topic_changes_nothing() -> None:
    """An empty property topic leaves every default in place."""
    consumer = _FakeConsumer([])
    source = KafkaPropertySource("unused:9092", "props", consumer_factory=lambda: consumer)
    props = Properties()
    await source.start(props)
    await source.stop()
    assert props.snapshot() == Properties().snapshot()


def test_str_list_property_is_usable_for_custom_definitions() -> None:
    """Applications can define their own list property and use it with Properties."""
    topics = str_list_property("myapp.extra.topics", ("t1",), reloadable=True, doc="Topics.")
    props = Properties({"myapp.extra.topics": "t2, t3"}, definitions=[topics])
    assert props[topics].value == ("t2", "t3")


def test_keys_must_be_names_or_definitions() -> None:
    """A key that is neither a name nor a definition is a programming error."""
    with pytest.raises(ConfigError, match="names or definitions"):
        Properties({42: 1})


# ------------------------------------------------------------------ precedence of layers


def test_a_layer_update_changes_only_what_no_higher_layer_sets() -> None:
    """Layers (application, file, environment, command line): a change to the file's
    layer takes effect where no higher layer sets the property; removing it falls back
    to the layer below, not to the value at start."""
    props = Properties(
        {"decaton.max.pending.records": 100},
        {"decaton.max.pending.records": 500, "decaton.partition.concurrency": 10},
        {},
        {"decaton.partition.concurrency": 99},
    )
    assert (props[PARTITION_CONCURRENCY].value, props[MAX_PENDING_RECORDS].value) == (99, 500)
    assert props.update({"decaton.partition.concurrency": 11}, layer=1) == {
        "decaton.partition.concurrency": True
    }
    assert props[PARTITION_CONCURRENCY].value == 99  # the command line still wins
    props.update({"decaton.max.pending.records": RESET}, layer=1)
    assert props[MAX_PENDING_RECORDS].value == 100  # the application's value
    assert props.update({"decaton.max.pending.records": "x"}, layer=1) == {
        "decaton.max.pending.records": False
    }
    assert props[MAX_PENDING_RECORDS].value == 100
    with pytest.raises(ConfigError, match="layer 7 does not exist"):
        props.update({}, layer=7)


async def test_a_file_never_overrides_the_command_line(tmp_path: Path) -> None:
    """What ``run`` builds: the file's values apply at start and at each reload, below the
    environment and ``--property``."""
    path = tmp_path / "props.json"
    path.write_text(json.dumps({"decaton.partition.concurrency": 10}))
    source = FilePropertySource(path, interval_s=0.01)
    props = Properties({}, await source.load(), {}, {"decaton.partition.concurrency": 99})
    reloaded = asyncio.Event()
    props[MAX_PENDING_RECORDS].subscribe(lambda old, new: reloaded.set())
    await source.start(props, layer=1)
    try:
        assert props[PARTITION_CONCURRENCY].value == 99
        path.write_text(
            json.dumps({"decaton.partition.concurrency": 12, "decaton.max.pending.records": 7})
        )
        await asyncio.wait_for(reloaded.wait(), 10)
        assert (props[PARTITION_CONCURRENCY].value, props[MAX_PENDING_RECORDS].value) == (99, 7)
    finally:
        await source.stop()
