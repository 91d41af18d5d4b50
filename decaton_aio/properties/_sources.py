"""Where property values come from: environment variables, a watched file, a Kafka topic.

Every source can hand out a snapshot for the strict start (``await source.load()``, used
as a layer of [`Properties`][decaton_aio.properties.Properties]) and then watch for changes and
apply them leniently (``await source.start(props)`` ... ``await source.stop()``):

```python
file = FilePropertySource("processor.properties", interval_s=1.0)
props = Properties(code_values, await file.load(), properties_from_env())
await file.start(props)       # edits to the file now change props live
...
await file.stop()
```

A name removed from a file, a JSON ``null`` or a Kafka tombstone resets the property to
its value at start. When several sources change the same property, the last one wins.

Background work follows the routine vocabulary: ``start()`` spawns ``_x_routine()``,
``stop()`` cancels and awaits it. Expected failures (unreadable file, undecodable record,
rejected value) are logged and skipped; anything else ends the routine, is logged, and is
re-raised by ``stop()`` to whoever supervises the source.

The Kafka topic source lives in `decaton_aio.properties._kafka_source`.
"""

from __future__ import annotations

import asyncio
import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import msgspec
import structlog

from decaton_aio import environment
from decaton_aio._routines import cancel_and_wait, spawn
from decaton_aio.errors import ConfigError
from decaton_aio.properties._definitions import BUILTIN_DEFINITIONS, PropertyDefinition
from decaton_aio.properties._properties import RESET, Properties

__all__ = [
    "FilePropertySource",
    "PropertySource",
    "env_var_name",
    "parse_assignments",
    "parse_properties_text",
    "properties_from_env",
    "read_property_file",
]

_log = structlog.get_logger("decaton_aio.properties")


class PropertySource(Protocol):
    """Something that supplies property values at start and changes them later."""

    async def load(self) -> dict[str, object]:
        """Return the source's current values, to build
        [`Properties`][decaton_aio.properties.Properties] strictly."""
        ...

    async def start(self, properties: Properties, *, layer: int | None = None) -> None:
        """Apply the current values to ``properties`` (replacing layer ``layer`` when
        given), then keep applying changes."""
        ...

    async def stop(self) -> None:
        """Stop applying changes; cancel and await the background routine."""
        ...


# --- Command line and environment variables ----------------------------------------------


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """Parse ``NAME=VALUE`` strings (CLI ``--property`` flags) into a layer.

    Args:
        items: strings like ``"decaton.partition.concurrency=64"``.

    Returns:
        Name to (unparsed) value; a later duplicate wins.

    Raises:
        ConfigError: an item has no ``=`` or an empty name.
    """
    result: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"expected NAME=VALUE, got {item!r}")
        result[name.strip()] = value.strip()
    return result


def env_var_name(key: str | PropertyDefinition[Any]) -> str:
    """Return the environment variable for a property: upper case, dots as underscores.

    Args:
        key: a definition or a property name.

    Returns:
        E.g. ``"DECATON_PARTITION_CONCURRENCY"`` for ``decaton.partition.concurrency``.
    """
    name = key.name if isinstance(key, PropertyDefinition) else key
    return name.upper().replace(".", "_")


def properties_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    definitions: Iterable[PropertyDefinition[Any]] = BUILTIN_DEFINITIONS,
) -> dict[str, str]:
    """Read property values from environment variables named by `env_var_name()`.

    ``DECATON_PARTITION_CONCURRENCY=64`` gives ``{"decaton.partition.concurrency": "64"}``.
    Only variables of known definitions are read (other ``DECATON_*`` variables, such as
    ``DECATON_AIO_BOOTSTRAP_SERVERS``, belong to other settings); a variable that looks
    like a misspelt property variable is logged with the closest known one.

    Args:
        environ: the environment; defaults to ``os.environ``.
        definitions: the known definitions.

    Returns:
        Property name to unparsed value, ready to be a
        [`Properties`][decaton_aio.properties.Properties] layer.
    """
    env = os.environ if environ is None else environ
    by_var = {env_var_name(definition): definition.name for definition in definitions}
    result: dict[str, str] = {}
    for var, value in env.items():
        name = by_var.get(var)
        if name is not None:
            result[name] = value
        elif var.startswith(environment.PROPERTY_PREFIX) and not var.startswith(environment.PREFIX):
            close = difflib.get_close_matches(var, by_var, n=1, cutoff=0.85)
            if close:
                _log.warning("ignoring unknown property variable", variable=var, hint=close[0])
    return result


# --- Files -------------------------------------------------------------------------------


def parse_properties_text(text: str) -> dict[str, str]:
    """Parse Java-style ``.properties`` text: ``name=value`` (or ``name: value``, ``name
    value``) lines, ``#``/``!`` comments.

    Whitespace around names and values is stripped; a later duplicate wins. A line ending
    in a backslash continues on the next line (its leading whitespace dropped), as in
    Java; other backslashes are kept as they are.

    Args:
        text: the file content.

    Returns:
        Name to unparsed value.

    Raises:
        ConfigError: a line has no name (it starts with ``=`` or ``:``).
    """
    result: dict[str, str] = {}
    for number, line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        name, value = _split_entry(stripped)
        if not name:
            # The line is not echoed: it may hold a password.
            raise ConfigError(f"line {number}: expected name=value, got no name")
        result[name] = value
    return result


def _split_entry(line: str) -> tuple[str, str]:
    """A line's name and value, as Java reads them: the name ends at the first ``=``,
    ``:`` or whitespace not escaped by a backslash; one ``=`` or ``:`` (with whitespace
    around it) separates it from the value, which may itself hold ``=`` and ``:``."""
    end = 0
    while end < len(line) and line[end] not in "=: \t\f":
        end += 2 if line[end] == "\\" else 1
    name, rest = line[:end], line[end:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return name, rest


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines joined where a line ends in an odd number of backslashes, with the number of
    the line each starts on."""
    lines: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        if pending is not None:
            start, head = pending
            line = head + raw.lstrip()
        elif raw.lstrip().startswith(("#", "!")):
            lines.append((number, raw))  # a comment never continues
            continue
        else:
            start, line = number, raw
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending = (start, line[:-1])
        else:
            pending = None
            lines.append((start, line))
    if pending is not None:
        lines.append(pending)
    return lines


def _parse_json_object(data: bytes) -> dict[str, object]:
    try:
        decoded = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"invalid JSON: {exc}") from exc
    if not isinstance(decoded, dict):
        raise ConfigError(f"expected a JSON object of name: value, got {type(decoded).__name__}")
    return decoded


_FILE_PARSERS: Final[dict[str, Callable[[bytes], Mapping[str, object]]]] = {
    ".json": _parse_json_object,
    ".properties": lambda data: parse_properties_text(data.decode("utf-8")),
}


def _check_suffix(path: Path) -> None:
    if path.suffix not in _FILE_PARSERS:
        raise ConfigError(
            f"property file {str(path)!r}: unsupported suffix {path.suffix!r}; "
            f"use one of {', '.join(sorted(_FILE_PARSERS))}"
        )


def read_property_file(path: str | os.PathLike[str]) -> dict[str, object]:
    """Read a property file: a JSON object (``.json``) or ``name=value`` lines (``.properties``).

    JSON ``null`` values are dropped (the name counts as absent).

    Args:
        path: the file; its suffix picks the format.

    Returns:
        Name to value (strings are parsed later by each definition).

    Raises:
        ConfigError: unsupported suffix, unreadable file or unparsable content.
    """
    file = Path(path)
    _check_suffix(file)
    try:
        data = file.read_bytes()
        parsed = _FILE_PARSERS[file.suffix](data)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"property file {str(file)!r}: {exc}") from exc
    except ConfigError as exc:
        raise ConfigError(f"property file {str(file)!r}: {exc}") from exc
    return {name: value for name, value in parsed.items() if value is not None}


class FilePropertySource:
    """A property file watched for edits by polling its mtime and size.

    On a change the file is parsed and applied with
    [`Properties.update()`][decaton_aio.properties.Properties.update]; names removed since
    the last good read reset to their start value. A file that cannot be read or parsed is
    logged and changes nothing; a deleted file keeps current values. Two edits within the
    file system's mtime granularity that keep the size may be seen as one.

    Args:
        path: a ``.json`` or ``.properties`` file.
        interval_s: seconds between polls.

    Raises:
        ConfigError: unsupported suffix or a non-positive interval.
    """

    def __init__(self, path: str | os.PathLike[str], *, interval_s: float = 1.0) -> None:
        self._path = Path(path)
        _check_suffix(self._path)
        if interval_s <= 0:
            raise ConfigError(f"interval_s must be > 0, got {interval_s}")
        self._interval_s = interval_s
        self._properties: Properties | None = None
        self._task: asyncio.Task[None] | None = None
        self._signature: tuple[int, int, int] | None = None
        self._names: set[str] = set()
        self._layer: int | None = None

    @property
    def path(self) -> Path:
        """The watched file."""
        return self._path

    async def load(self) -> dict[str, object]:
        """Read the file strictly, for building [`Properties`][decaton_aio.properties.Properties].

        Returns:
            Name to value.

        Raises:
            ConfigError: missing, unreadable or unparsable file.
        """
        values = read_property_file(self._path)
        # The names the layer starts with: one gone from the file by the time the source
        # starts (or later) is reset.
        self._names = set(values)
        return values

    async def start(self, properties: Properties, *, layer: int | None = None) -> None:
        """Apply the file now, then watch it in the background.

        Args:
            properties: where changes go.
            layer: the layer of ``properties`` the file's values replace (higher layers,
                such as the environment and the command line, keep precedence); ``None``
                applies them over every layer.

        Raises:
            RuntimeError: already started.
        """
        if self._task is not None:
            raise RuntimeError("FilePropertySource already started")
        self._properties = properties
        self._layer = layer
        self._maybe_apply()
        self._task = spawn(self._watch_routine(), f"property-file:{self._path}")

    async def stop(self) -> None:
        """Stop watching; cancel and await the routine (re-raises an unexpected failure)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _watch_routine(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self._maybe_apply()

    def _maybe_apply(self) -> None:
        """Apply the file if its signature changed since the last poll.

        Caller: [`start()`][decaton_aio.properties.FilePropertySource.start] and `_watch_routine()`.
        Affects: ``_signature``, ``_names`` and, through ``update``, the properties.
        """
        assert self._properties is not None, "start() sets properties first"
        try:
            stat = self._path.stat()
        except FileNotFoundError:
            if self._signature is not None:
                _log.warning("property file is gone; keeping values", path=str(self._path))
            self._signature = None
            return
        signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if signature == self._signature:
            return
        self._signature = signature
        try:
            values = read_property_file(self._path)
        except ConfigError as exc:
            _log.warning(
                "property file rejected; nothing changed", path=str(self._path), reason=str(exc)
            )
            return
        batch: dict[str, object] = dict(values)
        batch.update((name, RESET) for name in self._names - values.keys())
        self._names = set(values)
        self._properties.update(batch, layer=self._layer)
