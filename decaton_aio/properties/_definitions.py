"""Property definitions: what each knob is, the built-in knobs, and their documentation.

This module owns the static side of the property model:

* [`PropertyDefinition`][decaton_aio.properties.PropertyDefinition] - what a knob is: name,
  default, parser, validator, whether it is reloadable, a one-line doc. Immutable.
* `int_property()`, `bool_property()`, `str_list_property()` - build the
  ordinary kinds of definition.
* The built-in definitions, module constants collected in `BUILTIN_DEFINITIONS`
  (names follow Decaton's ``ProcessorProperties`` where one exists).
* `render_markdown_table()` - the documentation's table of definitions.

The live values and their reloads are in `decaton_aio.properties._properties`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar, cast

from decaton_aio.errors import ConfigError

__all__ = [
    "BUILTIN_DEFINITIONS",
    "COMMIT_INTERVAL_MS",
    "DEFERRED_COMPLETE_TIMEOUT_MS",
    "GROUP_REBALANCE_TIMEOUT_MS",
    "IGNORE_KEYS",
    "LEGACY_PARSE_FALLBACK_ENABLED",
    "MAX_PENDING_BYTES",
    "MAX_PENDING_BYTES_TOTAL",
    "MAX_PENDING_RECORDS",
    "PARTITION_CONCURRENCY",
    "PER_KEY_QUOTA_PROCESSING_RATE",
    "PROCESSING_RATE_PER_PARTITION",
    "PROCESSING_SHUTDOWN_TIMEOUT_MS",
    "SHAPING_RATE_PER_PARTITION",
    "PropertyDefinition",
    "bool_property",
    "int_property",
    "render_markdown_table",
    "str_list_property",
]

T = TypeVar("T")

_NAME_PATTERN: Final = re.compile(r"^[a-z][a-z0-9]*(\.[a-z0-9]+)+$")


@dataclass(frozen=True)
class PropertyDefinition(Generic[T]):
    """What one property is: its name, type, default, what is allowed and whether it reloads.

    Build ordinary ones with `int_property()`, `bool_property()` or
    `str_list_property()`.

    Args:
        name: dotted lower-case name, e.g. ``"decaton.partition.concurrency"``.
        default: the value when nothing sets it; must pass ``validator``.
        parser: turns a string (CLI ``--property NAME=VALUE``, env var, file) into a value;
            raises ``ValueError`` when it cannot.
        coerce: turns a non-string value (from code or JSON) into a value; raises
            ``TypeError``/``ValueError`` when it has the wrong type.
        validator: returns ``None`` when a value is allowed, else a message saying why
            not (raising ``ValueError`` works too).
        allowed: what is allowed, in words, e.g. ``"an integer >= 1"``; used in messages
            and docs.
        reloadable: whether the value may change after start.
        doc: one line saying what the property controls.
        formatter: renders a value back into the string form ``parser`` accepts.

    Raises:
        ConfigError: the name is malformed, the doc is not one line, or the default is
            not allowed.
    """

    name: str
    default: T
    parser: Callable[[str], T]
    coerce: Callable[[object], T]
    validator: Callable[[T], str | None]
    allowed: str
    reloadable: bool
    doc: str
    formatter: Callable[[T], str] = field(default=str)

    def __post_init__(self) -> None:
        if not _NAME_PATTERN.match(self.name):
            raise ConfigError(
                f"property name {self.name!r} is malformed: use dotted lower-case words, "
                "e.g. 'myapp.batch.size'"
            )
        if not self.doc or "\n" in self.doc:
            raise ConfigError(f"property {self.name}: doc must be one non-empty line")
        _, problem = self._try_convert(self.default)
        if problem is not None:
            raise ConfigError(f"property {self.name}: default {self.default!r} {problem}")

    def convert(self, raw: object) -> T:
        """Parse (if ``raw`` is a string), type-check and validate a value.

        Args:
            raw: a string to parse, or a value from code or JSON.

        Returns:
            The value, ready to be held by a [`Property`][decaton_aio.properties.Property].

        Raises:
            ConfigError: the value cannot be parsed or is not allowed; the message names
                the property, the value and what is allowed.
        """
        value, problem = self._try_convert(raw)
        if problem is not None:
            raise ConfigError(f"property {self.name}: {raw!r} {problem}")
        return cast(T, value)

    def format(self, value: T) -> str:
        """Render ``value`` in the string form the parser accepts.

        Args:
            value: a value of this property.

        Returns:
            The string form, e.g. ``"a,b"`` for a list of keys.
        """
        return self.formatter(value)

    def _try_convert(self, raw: object) -> tuple[T | None, str | None]:
        """Return ``(value, None)`` or ``(None, problem)``; never raises for bad input."""
        try:
            value = self.parser(raw.strip()) if isinstance(raw, str) else self.coerce(raw)
        except (TypeError, ValueError):
            return None, f"is not allowed: expected {self.allowed}"
        try:
            message = self.validator(value)
        except (TypeError, ValueError) as exc:
            message = str(exc) or "rejected by the validator"
        if message is not None:
            return None, f"is not allowed: {message} (expected {self.allowed})"
        return value, None


def _parse_int(text: str) -> int:
    return int(text, 10)


def _coerce_int(raw: object) -> int:
    # bool is an int subclass; True for a concurrency is a mistake, not 1.
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError(f"expected an int, got {type(raw).__name__}")
    return raw


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "on", "1"):
        return True
    if lowered in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _coerce_bool(raw: object) -> bool:
    if not isinstance(raw, bool):
        raise TypeError(f"expected a bool, got {type(raw).__name__}")
    return raw


def _parse_str_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _coerce_str_list(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list | tuple) or not all(isinstance(item, str) for item in raw):
        raise TypeError("expected a list of strings")
    return tuple(raw)


def _no_check(value: object) -> str | None:
    return None


def int_property(
    name: str, default: int, *, minimum: int, reloadable: bool, doc: str, allowed: str = ""
) -> PropertyDefinition[int]:
    """Define an integer property that must be >= ``minimum``.

    Args:
        minimum: the smallest allowed value.
        allowed: what is allowed, in words; defaults to ``"an integer >= {minimum}"``.
        name, default, reloadable, doc: as for
        [`PropertyDefinition`][decaton_aio.properties.PropertyDefinition].

    Returns:
        The definition.

    Raises:
        ConfigError: the definition is malformed (see
            [`PropertyDefinition`][decaton_aio.properties.PropertyDefinition]).
    """

    def at_least_minimum(value: int) -> str | None:
        return None if value >= minimum else f"{value} is below the minimum {minimum}"

    return PropertyDefinition(
        name=name,
        default=default,
        parser=_parse_int,
        coerce=_coerce_int,
        validator=at_least_minimum,
        allowed=allowed or f"an integer >= {minimum}",
        reloadable=reloadable,
        doc=doc,
    )


def bool_property(
    name: str, default: bool, *, reloadable: bool, doc: str
) -> PropertyDefinition[bool]:
    """Define a boolean property; strings ``true/false/yes/no/on/off/1/0`` parse.

    Args:
        name, default, reloadable, doc: as for
        [`PropertyDefinition`][decaton_aio.properties.PropertyDefinition].

    Returns:
        The definition.

    Raises:
        ConfigError: the definition is malformed (see
            [`PropertyDefinition`][decaton_aio.properties.PropertyDefinition]).
    """
    return PropertyDefinition(
        name=name,
        default=default,
        parser=_parse_bool,
        coerce=_coerce_bool,
        validator=_no_check,
        allowed="true or false",
        reloadable=reloadable,
        doc=doc,
        formatter=lambda value: "true" if value else "false",
    )


def str_list_property(
    name: str, default: tuple[str, ...] = (), *, reloadable: bool, doc: str
) -> PropertyDefinition[tuple[str, ...]]:
    """Define a list-of-strings property, comma separated in string form, held as a tuple.

    Args:
        name, default, reloadable, doc: as for
        [`PropertyDefinition`][decaton_aio.properties.PropertyDefinition].

    Returns:
        The definition.

    Raises:
        ConfigError: the definition is malformed (see
            [`PropertyDefinition`][decaton_aio.properties.PropertyDefinition]).
    """
    return PropertyDefinition(
        name=name,
        default=default,
        parser=_parse_str_list,
        coerce=_coerce_str_list,
        validator=_no_check,
        allowed="a list of strings (comma separated in text)",
        reloadable=reloadable,
        doc=doc,
        formatter=",".join,
    )


# --- Built-in definitions. Names follow Decaton's ProcessorProperties where one exists. ---

PARTITION_CONCURRENCY: Final = int_property(
    "decaton.partition.concurrency",
    384,
    minimum=1,
    reloadable=True,
    doc="Max tasks in flight per partition. Default 384: an in-flight coroutine costs a few "
    "KB, and I/O-bound tasks need hundreds in flight per partition to reach tens of "
    "thousands of tasks/s (with 10 ms of I/O per task, 384 per partition saturated one "
    "core in our benchmark; 256 left a fifth of it idle).",
)
MAX_PENDING_RECORDS: Final = int_property(
    "decaton.max.pending.records",
    10000,
    minimum=1,
    reloadable=True,
    doc="Records read but not completed per partition at which the partition is paused; "
    "it resumes below.",
)
MAX_PENDING_BYTES: Final = int_property(
    "decaton.max.pending.bytes",
    64 * 1024 * 1024,
    minimum=1,
    reloadable=True,
    doc="Bytes of the values of the records read but not completed, per partition, at "
    "which the partition is paused; it resumes below. Its fetches ask for at most this "
    "much per partition (max.partition.fetch.bytes, at start).",
)
MAX_PENDING_BYTES_TOTAL: Final = int_property(
    "decaton.max.pending.bytes.total",
    256 * 1024 * 1024,
    minimum=1,
    reloadable=True,
    doc="The same for all partitions of the subscription together: at this total every "
    "partition is paused until completions free room. Bounds the memory of large "
    "records, which decaton.max.pending.records does not; fetches ask for at most this "
    "much (fetch.max.bytes, at start).",
)
COMMIT_INTERVAL_MS: Final = int_property(
    "decaton.commit.interval.ms",
    1000,
    minimum=1,
    reloadable=True,
    doc="How often watermark offsets are committed; they are also committed on revoke and "
    "shutdown.",
)
GROUP_REBALANCE_TIMEOUT_MS: Final = int_property(
    "decaton.group.rebalance.timeout.ms",
    1000,
    minimum=0,
    reloadable=True,
    doc="On revoke, how long to wait for in-flight tasks of revoked partitions before "
    "committing and dropping the rest (they are redelivered).",
)
PROCESSING_SHUTDOWN_TIMEOUT_MS: Final = int_property(
    "decaton.processing.shutdown.timeout.ms",
    30000,
    minimum=0,
    reloadable=True,
    doc="On shutdown, how long to drain in-flight tasks before the final commit.",
)
IGNORE_KEYS: Final = str_list_property(
    "decaton.ignore.keys",
    (),
    reloadable=True,
    doc="Record keys whose tasks are skipped; their offsets are completed.",
)
PROCESSING_RATE_PER_PARTITION: Final = int_property(
    "decaton.processing.rate.per.partition",
    -1,
    minimum=-1,
    reloadable=True,
    allowed="an integer >= -1 (-1 unlimited, 0 pause)",
    doc="Tasks started per second per partition (token bucket); -1 unlimited, 0 pauses; "
    "excess tasks are delayed, never dropped.",
)
DEFERRED_COMPLETE_TIMEOUT_MS: Final = int_property(
    "decaton.deferred.complete.timeout.ms",
    300_000,
    minimum=-1,
    reloadable=True,
    allowed="an integer >= -1 (-1 no timeout)",
    doc="How long a deferred completion may stay open before its timeout policy applies. "
    "Default 5 minutes, so a leaked completion cannot stall a partition forever; -1 never.",
)
PER_KEY_QUOTA_PROCESSING_RATE: Final = int_property(
    "decaton.per.key.quota.processing.rate",
    -1,
    minimum=-1,
    reloadable=True,
    allowed="an integer >= -1 (-1 off)",
    doc="Tasks per second one key may use before its tasks are shaped to `<topic>-shaping`; "
    "-1 turns per-key quota off.",
)
SHAPING_RATE_PER_PARTITION: Final = int_property(
    "decaton.shaping.rate.per.partition",
    -1,
    minimum=-1,
    reloadable=True,
    allowed="an integer >= -1 (-1 unlimited, 0 pause)",
    doc="Tasks started per second per partition of a `<topic>-shaping` topic, where the tasks "
    "of keys over their quota go; -1 unlimited, 0 pauses.",
)
LEGACY_PARSE_FALLBACK_ENABLED: Final = bool_property(
    "decaton.legacy.parse.fallback.enabled",
    False,
    reloadable=True,
    doc="Read a record without a `dt_meta` header as a pre-Decaton-9 `DecatonTaskRequest` "
    "(metadata and body inside the value); one that is not is dead-lettered. Off: such a "
    "value is the body, as Decaton 9 reads it.",
)

BUILTIN_DEFINITIONS: Final[tuple[PropertyDefinition[Any], ...]] = (
    PARTITION_CONCURRENCY,
    MAX_PENDING_RECORDS,
    MAX_PENDING_BYTES,
    MAX_PENDING_BYTES_TOTAL,
    COMMIT_INTERVAL_MS,
    GROUP_REBALANCE_TIMEOUT_MS,
    PROCESSING_SHUTDOWN_TIMEOUT_MS,
    IGNORE_KEYS,
    PROCESSING_RATE_PER_PARTITION,
    DEFERRED_COMPLETE_TIMEOUT_MS,
    PER_KEY_QUOTA_PROCESSING_RATE,
    SHAPING_RATE_PER_PARTITION,
    LEGACY_PARSE_FALLBACK_ENABLED,
)
"""Every built-in definition, in documentation order."""


def render_markdown_table(
    definitions: Iterable[PropertyDefinition[Any]] = BUILTIN_DEFINITIONS,
) -> str:
    """Render definitions as a Markdown table (the documentation's property reference).

    Args:
        definitions: what to document; defaults to `BUILTIN_DEFINITIONS`.

    Returns:
        The table (header, separator, one row per definition), ending in a newline.
    """
    rows = [
        "| Name | Default | Reloadable | Allowed | Description |",
        "|---|---|---|---|---|",
    ]
    for definition in definitions:
        default = definition.format(definition.default)
        cells = (
            f"`{definition.name}`",
            f"`{default}`" if default else "(empty)",
            "yes" if definition.reloadable else "no",
            definition.allowed,
            definition.doc,
        )
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"
