"""Runtime properties: typed, validated knobs whose reloadable ones change while running.

This module owns the property model (F4):

* :class:`PropertyDefinition` - what a knob is: name, default, parser, validator,
  whether it is reloadable, a one-line doc. Immutable; built-in ones are module constants
  collected in :data:`BUILTIN_DEFINITIONS`.
* :class:`Property` - the live value of one definition inside one runtime, with
  listeners that run after each change.
* :class:`Properties` - every live property of one runtime. Building it is *strict*
  (an unknown name or a bad value raises :class:`~decaton_aio.errors.ConfigError`);
  changing it later is *lenient* (a bad value is logged and rejected, the old one kept).

Where new values come from (files, a Kafka topic, environment variables) lives in
:mod:`decaton_aio.property_sources`.

Ownership: properties are read and changed on the event loop that runs the processor.
Nothing here locks; do not call :meth:`Property.set` from another thread.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar, cast, overload

import structlog

from decaton_aio.errors import ConfigError

__all__ = [
    "BUILTIN_DEFINITIONS",
    "COMMIT_INTERVAL_MS",
    "DEFERRED_COMPLETE_TIMEOUT_MS",
    "GROUP_REBALANCE_TIMEOUT_MS",
    "IGNORE_KEYS",
    "MAX_PENDING_RECORDS",
    "PARTITION_CONCURRENCY",
    "PER_KEY_QUOTA_PROCESSING_RATE",
    "PROCESSING_RATE_PER_PARTITION",
    "PROCESSING_SHUTDOWN_TIMEOUT_MS",
    "RESET",
    "SHAPING_RATE_PER_PARTITION",
    "Layer",
    "Listener",
    "Properties",
    "Property",
    "PropertyDefinition",
    "bool_property",
    "int_property",
    "render_markdown_table",
    "str_list_property",
]

T = TypeVar("T")

Listener = Callable[[T, T], None]
"""A change listener: called with ``(old, new)`` right after a property changed."""

_log = structlog.get_logger(__name__)

_NAME_PATTERN: Final = re.compile(r"^[a-z][a-z0-9]*(\.[a-z0-9]+)+$")


class _Reset:
    """Type of :data:`RESET`."""

    def __repr__(self) -> str:
        return "RESET"


RESET: Final = _Reset()
"""A value for :meth:`Properties.update` meaning "back to the value it had at start"."""


@dataclass(frozen=True)
class PropertyDefinition(Generic[T]):
    """What one property is: its name, type, default, what is allowed and whether it reloads.

    Build ordinary ones with :func:`int_property`, :func:`bool_property` or
    :func:`str_list_property`.

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
            The value, ready to be held by a :class:`Property`.

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
        name, default, reloadable, doc: as for :class:`PropertyDefinition`.

    Returns:
        The definition.

    Raises:
        ConfigError: the definition is malformed (see :class:`PropertyDefinition`).
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
        name, default, reloadable, doc: as for :class:`PropertyDefinition`.

    Returns:
        The definition.

    Raises:
        ConfigError: the definition is malformed (see :class:`PropertyDefinition`).
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
        name, default, reloadable, doc: as for :class:`PropertyDefinition`.

    Returns:
        The definition.

    Raises:
        ConfigError: the definition is malformed (see :class:`PropertyDefinition`).
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
    256,
    minimum=1,
    reloadable=True,
    doc="Max tasks in flight per partition. Default 256: an in-flight coroutine costs a few "
    "KB, and I/O-bound tasks need hundreds in flight per partition to reach tens of "
    "thousands of tasks/s.",
)
MAX_PENDING_RECORDS: Final = int_property(
    "decaton.max.pending.records",
    10000,
    minimum=1,
    reloadable=True,
    doc="Records read but not completed per partition at which the partition is paused; "
    "it resumes below.",
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

BUILTIN_DEFINITIONS: Final[tuple[PropertyDefinition[Any], ...]] = (
    PARTITION_CONCURRENCY,
    MAX_PENDING_RECORDS,
    COMMIT_INTERVAL_MS,
    GROUP_REBALANCE_TIMEOUT_MS,
    PROCESSING_SHUTDOWN_TIMEOUT_MS,
    IGNORE_KEYS,
    PROCESSING_RATE_PER_PARTITION,
    DEFERRED_COMPLETE_TIMEOUT_MS,
    PER_KEY_QUOTA_PROCESSING_RATE,
    SHAPING_RATE_PER_PARTITION,
)
"""Every built-in definition, in documentation order."""


class _Unset:
    pass


_UNSET: Final = _Unset()


class Property(Generic[T]):
    """The live value of one property, with listeners called after each change.

    Ownership: read and changed on the processor's event loop only.

    Args:
        definition: what this property is.
        value: the value at start, already converted; defaults to the definition's default.
    """

    __slots__ = ("_definition", "_initial", "_listeners", "_next_token", "_value")

    def __init__(self, definition: PropertyDefinition[T], value: T | _Unset = _UNSET) -> None:
        initial = definition.default if isinstance(value, _Unset) else value
        self._definition = definition
        self._initial: T = initial
        self._value: T = initial
        self._listeners: dict[int, Listener[T]] = {}
        self._next_token = 0

    def __repr__(self) -> str:
        return f"Property({self._definition.name}={self._value!r})"

    @property
    def definition(self) -> PropertyDefinition[T]:
        """What this property is."""
        return self._definition

    @property
    def name(self) -> str:
        """The property's name."""
        return self._definition.name

    @property
    def value(self) -> T:
        """The current value."""
        return self._value

    @property
    def initial(self) -> T:
        """The value at start; :meth:`reset` goes back to it."""
        return self._initial

    def set(self, raw: object) -> bool:
        """Change the value, leniently: a rejected value is logged and the old one kept.

        Caller: a property source or user code, on the event loop.
        Affects: :attr:`value`; then every listener, in subscription order.

        Args:
            raw: a string to parse, or a value from code or JSON.

        Returns:
            True when the value is now ``raw`` (changed, or already equal); False when it
            was rejected (cannot parse, not allowed, or the property is not reloadable).
        """
        definition = self._definition
        value, problem = definition._try_convert(raw)
        if problem is not None:
            _log.warning(
                "property value rejected; keeping the current value",
                property=definition.name,
                value=raw,
                allowed=definition.allowed,
                reason=f"{raw!r} {problem}",
                current=self._value,
            )
            return False
        return self._change(cast(T, value))

    def reset(self) -> bool:
        """Go back to the value at start (what a removed file line or a tombstone means).

        Returns:
            True when the value is now the initial one; False when refused.
        """
        return self._change(self._initial)

    def subscribe(self, listener: Listener[T]) -> Callable[[], None]:
        """Call ``listener(old, new)`` synchronously after every change.

        Listeners run in subscription order on the event loop; one that raises is logged
        and the others still run. A listener needing async work should schedule it
        (e.g. set an ``asyncio.Event`` or resize a limiter) rather than block.

        Args:
            listener: the callback.

        Returns:
            A handle; calling it unsubscribes (calling it again does nothing).
        """
        token = self._next_token
        self._next_token += 1
        self._listeners[token] = listener

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    def _change(self, new: T) -> bool:
        old = self._value
        if new == old:
            return True
        definition = self._definition
        if not definition.reloadable:
            _log.warning(
                "property is not reloadable; restart the processor to change it",
                property=definition.name,
                value=new,
                current=old,
            )
            return False
        self._value = new
        _log.info("property changed", property=definition.name, old=old, new=new)
        # Copy: a listener may unsubscribe itself (or others) while we iterate.
        for listener in list(self._listeners.values()):
            try:
                listener(old, new)
            except Exception:
                _log.exception(
                    "property listener failed", property=definition.name, listener=listener
                )
        return True


Key = str | PropertyDefinition[Any]
Layer = Mapping[Any, object]
"""Name (or definition) to value. ``Any`` keys: a dict mixing both infers ``object`` keys."""


class Properties:
    """Every live property of one runtime.

    Building is strict: each layer maps names (or definitions) to values (strings are
    parsed); later layers override earlier ones, e.g.
    ``Properties(code_values, file_values, env_values, cli_values)``.

    Args:
        *layers: name-to-value mappings, lowest precedence first.
        definitions: the known definitions; defaults to :data:`BUILTIN_DEFINITIONS`.
            Add your own with ``definitions=(*BUILTIN_DEFINITIONS, MY_DEFINITION)``.

    Raises:
        ConfigError: a name is unknown (the message suggests the closest known name),
            a value is not allowed, or two definitions share a name. Every problem is
            listed in one message.
    """

    def __init__(
        self,
        *layers: Layer,
        definitions: Iterable[PropertyDefinition[Any]] = BUILTIN_DEFINITIONS,
    ) -> None:
        self._definitions: dict[str, PropertyDefinition[Any]] = {}
        for definition in definitions:
            if definition.name in self._definitions:
                raise ConfigError(f"property {definition.name} is defined twice")
            self._definitions[definition.name] = definition
        merged: dict[str, object] = {}
        for layer in layers:
            merged.update((_name_of(key), value) for key, value in layer.items())
        problems: list[str] = []
        initial: dict[str, object] = {}
        for name, raw in merged.items():
            found = self._definitions.get(name)
            if found is None:
                problems.append(self._unknown(name))
                continue
            try:
                initial[name] = found.convert(raw)
            except ConfigError as exc:
                problems.append(str(exc))
        if problems:
            raise ConfigError("; ".join(problems))
        self._properties: dict[str, Property[Any]] = {
            name: Property(definition, initial.get(name, definition.default))
            for name, definition in self._definitions.items()
        }

    @overload
    def __getitem__(self, key: PropertyDefinition[T]) -> Property[T]: ...

    @overload
    def __getitem__(self, key: str) -> Property[Any]: ...

    def __getitem__(self, key: Key) -> Property[Any]:
        """Return the live property for a definition (typed result) or a name.

        Raises:
            KeyError: the name is not known here.
        """
        name = _name_of(key)
        try:
            return self._properties[name]
        except KeyError:
            raise KeyError(self._unknown(name)) from None

    get = __getitem__
    """Same as ``props[key]``: the live property for a definition (typed) or a name."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str | PropertyDefinition) and _name_of(key) in self._properties

    def __iter__(self) -> Iterator[Property[Any]]:
        return iter(self._properties.values())

    def __len__(self) -> int:
        return len(self._properties)

    @property
    def definitions(self) -> tuple[PropertyDefinition[Any], ...]:
        """The known definitions."""
        return tuple(self._definitions.values())

    def snapshot(self) -> dict[str, Any]:
        """Return the current value of every property, by name."""
        return {name: prop.value for name, prop in self._properties.items()}

    def update(self, values: Layer) -> dict[str, bool]:
        """Apply a batch of changes (a reload), leniently.

        Each entry is applied on its own: a rejected value or an unknown name is logged
        and skipped, the rest still apply. A value of :data:`RESET` goes back to the
        value at start.

        Caller: property sources and user code, on the event loop.
        Affects: the named properties and their listeners.

        Args:
            values: name (or definition) to new value.

        Returns:
            Name to whether it was accepted.
        """
        results: dict[str, bool] = {}
        for key, raw in values.items():
            name = _name_of(key)
            prop = self._properties.get(name)
            if prop is None:
                _log.warning("unknown property ignored", property=name, hint=self._unknown(name))
                results[name] = False
            elif isinstance(raw, _Reset):
                results[name] = prop.reset()
            else:
                results[name] = prop.set(raw)
        return results

    def _unknown(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._definitions, n=1, cutoff=0.6)
        if close:
            return f"unknown property {name!r}; did you mean {close[0]!r}?"
        return f"unknown property {name!r}; known properties: {', '.join(self._definitions)}"


def _name_of(key: object) -> str:
    if isinstance(key, PropertyDefinition):
        return key.name
    if isinstance(key, str):
        return key
    raise ConfigError(f"property keys are names or definitions, got {key!r}")


def render_markdown_table(
    definitions: Iterable[PropertyDefinition[Any]] = BUILTIN_DEFINITIONS,
) -> str:
    """Render definitions as a Markdown table for the README.

    Args:
        definitions: what to document; defaults to :data:`BUILTIN_DEFINITIONS`.

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
