"""Where property values come from: environment variables, a watched file, a Kafka topic.

Every source can hand out a snapshot for the strict start (``await source.load()``, used
as a layer of :class:`~decaton_aio.properties.Properties`) and then watch for changes and
apply them leniently (``await source.start(props)`` ... ``await source.stop()``)::

    file = FilePropertySource("processor.properties", interval_s=1.0)
    props = Properties(code_values, await file.load(), properties_from_env())
    await file.start(props)       # edits to the file now change props live
    ...
    await file.stop()

A name removed from a file, a JSON ``null`` or a Kafka tombstone resets the property to
its value at start. When several sources change the same property, the last one wins.

Background work follows the routine vocabulary: ``start()`` spawns ``_x_routine()``,
``stop()`` cancels and awaits it. Expected failures (unreadable file, undecodable record,
rejected value) are logged and skipped; anything else ends the routine, is logged, and is
re-raised by ``stop()`` to whoever supervises the source.
"""

from __future__ import annotations

import asyncio
import difflib
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from decaton_aio.errors import ConfigError
from decaton_aio.properties import (
    BUILTIN_DEFINITIONS,
    RESET,
    Properties,
    PropertyDefinition,
)

__all__ = [
    "FilePropertySource",
    "KafkaPropertySource",
    "PropertySource",
    "apply_record",
    "decode_record",
    "encode_record",
    "env_var_name",
    "parse_assignments",
    "parse_properties_text",
    "properties_from_env",
    "read_property_file",
]

_log = structlog.get_logger(__name__)


class PropertySource(Protocol):
    """Something that supplies property values at start and changes them later."""

    async def load(self) -> dict[str, object]:
        """Return the source's current values, to build :class:`Properties` strictly."""
        ...

    async def start(self, properties: Properties) -> None:
        """Apply the current values to ``properties``, then keep applying changes."""
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
    """Read property values from environment variables named by :func:`env_var_name`.

    ``DECATON_PARTITION_CONCURRENCY=64`` gives ``{"decaton.partition.concurrency": "64"}``.
    Only variables of known definitions are read (other ``DECATON_*`` variables, such as
    ``DECATON_AIO_BOOTSTRAP_SERVERS``, belong to other settings); a variable that looks
    like a misspelt property variable is logged with the closest known one.

    Args:
        environ: the environment; defaults to ``os.environ``.
        definitions: the known definitions.

    Returns:
        Property name to unparsed value, ready to be a :class:`Properties` layer.
    """
    env = os.environ if environ is None else environ
    by_var = {env_var_name(definition): definition.name for definition in definitions}
    result: dict[str, str] = {}
    for var, value in env.items():
        name = by_var.get(var)
        if name is not None:
            result[name] = value
        elif var.startswith("DECATON_") and not var.startswith("DECATON_AIO_"):
            close = difflib.get_close_matches(var, by_var, n=1, cutoff=0.85)
            if close:
                _log.warning("ignoring unknown property variable", variable=var, hint=close[0])
    return result


# --- Files -------------------------------------------------------------------------------


def parse_properties_text(text: str) -> dict[str, str]:
    """Parse Java-style ``.properties`` text: ``name=value`` lines, ``#``/``!`` comments.

    Whitespace around names and values is stripped; a later duplicate wins.

    Args:
        text: the file content.

    Returns:
        Name to unparsed value.

    Raises:
        ConfigError: a line is neither blank, a comment, nor ``name=value``.
    """
    result: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        name, sep, value = stripped.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"line {number}: expected name=value, got {stripped!r}")
        result[name.strip()] = value.strip()
    return result


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

    On a change the file is parsed and applied with :meth:`Properties.update`; names
    removed since the last good read reset to their start value. A file that cannot be
    read or parsed is logged and changes nothing; a deleted file keeps current values.
    Two edits within the file system's mtime granularity that keep the size may be seen
    as one.

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

    @property
    def path(self) -> Path:
        """The watched file."""
        return self._path

    async def load(self) -> dict[str, object]:
        """Read the file strictly, for building :class:`Properties`.

        Returns:
            Name to value.

        Raises:
            ConfigError: missing, unreadable or unparsable file.
        """
        return read_property_file(self._path)

    async def start(self, properties: Properties) -> None:
        """Apply the file now, then watch it in the background.

        Args:
            properties: where changes go.

        Raises:
            RuntimeError: already started.
        """
        if self._task is not None:
            raise RuntimeError("FilePropertySource already started")
        self._properties = properties
        self._maybe_apply()
        self._task = _spawn(self._watch_routine(), f"property-file:{self._path}")

    async def stop(self) -> None:
        """Stop watching; cancel and await the routine (re-raises an unexpected failure)."""
        task, self._task = self._task, None
        if task is not None:
            await _cancel_and_wait(task)

    async def _watch_routine(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self._maybe_apply()

    def _maybe_apply(self) -> None:
        """Apply the file if its signature changed since the last poll.

        Caller: :meth:`start` and :meth:`_watch_routine`.
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
        self._properties.update(batch)


# --- Kafka topic -------------------------------------------------------------------------


def encode_record(name: str, value: object) -> tuple[bytes, bytes | None]:
    """Encode one property change as a Kafka record ``(key, value)`` for the property topic.

    Args:
        name: the property name (the record key).
        value: the new value (encoded as JSON), or :data:`RESET` for a tombstone.

    Returns:
        Key and value bytes; the value is None for a reset.
    """
    if value is RESET:
        return name.encode(), None
    return name.encode(), msgspec.json.encode(value)


def decode_record(key: bytes | None, value: bytes | None) -> dict[str, object]:
    """Decode one property record.

    Two shapes are accepted:

    * keyed: the key is the property name, the value its JSON-encoded value; a tombstone
      (no value) or JSON ``null`` means reset to the start value. Compaction keeps the
      latest per name.
    * key-less: the value is a JSON object ``{name: value, ...}`` applied as one batch.

    Args:
        key: record key bytes.
        value: record value bytes.

    Returns:
        Name to value, :data:`RESET` for a reset.

    Raises:
        ValueError: the record is not one of the shapes above.
    """
    if key is not None:
        name = key.decode("utf-8")
        decoded = None if value is None else msgspec.json.decode(value)
        return {name: RESET if decoded is None else decoded}
    if value is None:
        raise ValueError("a record without key and value means nothing")
    batch = msgspec.json.decode(value)
    if not isinstance(batch, dict):
        raise ValueError(f"a key-less record must hold a JSON object, got {type(batch).__name__}")
    return {name: RESET if item is None else item for name, item in batch.items()}


def apply_record(properties: Properties, key: bytes | None, value: bytes | None) -> dict[str, bool]:
    """Decode one property record and apply it (leniently) to ``properties``.

    Args:
        properties: where the change goes.
        key: record key bytes (see :func:`decode_record`).
        value: record value bytes.

    Returns:
        Name to whether it was accepted; empty when the record cannot be decoded (logged).
    """
    changes = _decode_or_log(key, value)
    return properties.update(changes) if changes else {}


def _decode_or_log(key: bytes | None, value: bytes | None) -> dict[str, object]:
    try:
        return decode_record(key, value)
    except ValueError as exc:  # msgspec.DecodeError and UnicodeDecodeError included
        _log.warning("undecodable property record skipped", key=key, value=value, reason=str(exc))
        return {}


class _Consumer(Protocol):
    """The part of ``aiokafka.AIOKafkaConsumer`` the Kafka source uses."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def assignment(self) -> set[Any]: ...
    async def seek_to_beginning(self, *partitions: Any) -> Any: ...
    async def end_offsets(self, partitions: list[Any]) -> dict[Any, int]: ...
    async def position(self, partition: Any) -> int: ...
    async def getmany(self, *, timeout_ms: int) -> dict[Any, list[Any]]: ...


_FETCH_RETRY_BACKOFF_S: Final = 1.0


class KafkaPropertySource:
    """Property changes read from a Kafka topic, so every instance sees the same change.

    No consumer group: the source is assigned every partition of ``topic`` and reads it
    from the beginning, because the topic may not be compacted on every broker. It folds
    the backlog (latest value per name wins) and applies it once, then applies each new
    batch of records as it arrives. Record shapes: see :func:`decode_record`. Use keyed
    records (or a single partition) so changes to one name keep their order.

    Args:
        bootstrap_servers: Kafka bootstrap servers, e.g. ``"localhost:9092"``.
        topic: the property topic.
        poll_timeout_ms: how long one fetch waits for new records.
        consumer_factory: builds the consumer (for TLS/SASL settings or tests); it must
            be assigned all partitions of ``topic`` without a group once started. Defaults
            to a plain ``AIOKafkaConsumer``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        poll_timeout_ms: int = 500,
        consumer_factory: Callable[[], _Consumer] | None = None,
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._topic = topic
        self._poll_timeout_ms = poll_timeout_ms
        self._consumer_factory = consumer_factory or self._default_consumer
        self._task: asyncio.Task[None] | None = None

    def _default_consumer(self) -> _Consumer:
        consumer: _Consumer = AIOKafkaConsumer(
            self._topic,
            bootstrap_servers=self._bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="decaton-aio-properties",
        )
        return consumer

    async def load(self) -> dict[str, object]:
        """Read the topic to its current end and return the latest value per name.

        Returns:
            Name to value; names whose latest record is a reset are left out.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        consumer = self._consumer_factory()
        await consumer.start()
        try:
            pending = await self._read_backlog(consumer)
        finally:
            await consumer.stop()
        return {name: value for name, value in pending.items() if value is not RESET}

    async def start(self, properties: Properties) -> None:
        """Apply the topic's backlog once, then apply new records in the background.

        Args:
            properties: where changes go.

        Raises:
            RuntimeError: already started.
            aiokafka.errors.KafkaError: the broker cannot be reached.
        """
        if self._task is not None:
            raise RuntimeError("KafkaPropertySource already started")
        consumer = self._consumer_factory()
        await consumer.start()
        try:
            properties.update(await self._read_backlog(consumer))
        except BaseException:
            await consumer.stop()
            raise
        self._task = _spawn(
            self._apply_routine(consumer, properties), f"property-topic:{self._topic}"
        )

    async def stop(self) -> None:
        """Stop applying; cancel and await the routine (re-raises an unexpected failure)."""
        task, self._task = self._task, None
        if task is not None:
            await _cancel_and_wait(task)

    async def _read_backlog(self, consumer: _Consumer) -> dict[str, object]:
        """Read from the beginning up to the end offsets seen now; fold latest per name."""
        partitions = list(consumer.assignment())
        pending: dict[str, object] = {}
        if not partitions:
            return pending
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        while not await self._caught_up(consumer, end):
            batch = await consumer.getmany(timeout_ms=self._poll_timeout_ms)
            _fold(batch, pending)
        return pending

    @staticmethod
    async def _caught_up(consumer: _Consumer, end: Mapping[Any, int]) -> bool:
        for partition, end_offset in end.items():
            if await consumer.position(partition) < end_offset:
                return False
        return True

    async def _apply_routine(self, consumer: _Consumer, properties: Properties) -> None:
        try:
            while True:
                try:
                    batch = await consumer.getmany(timeout_ms=self._poll_timeout_ms)
                except KafkaError as exc:
                    # aiokafka retries what it can itself; what reaches us (authorization,
                    # a deleted topic) may heal, and properties must not stop the processor.
                    _log.warning("property topic fetch failed", topic=self._topic, error=repr(exc))
                    await asyncio.sleep(_FETCH_RETRY_BACKOFF_S)
                    continue
                pending: dict[str, object] = {}
                _fold(batch, pending)
                if pending:
                    properties.update(pending)
        finally:
            await consumer.stop()


def _fold(batch: Mapping[Any, Iterable[Any]], into: dict[str, object]) -> None:
    """Fold fetched records into ``into`` so only the latest value per name remains.

    Applying the fold, not each record, avoids flapping listeners through stale values.
    """
    for records in batch.values():
        for record in records:
            into.update(_decode_or_log(record.key, record.value))


# --- Routine helpers ---------------------------------------------------------------------


def _spawn(routine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    task: asyncio.Task[None] = asyncio.get_running_loop().create_task(routine, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        # Unexpected: expected failures are handled inside the routines. stop() re-raises
        # it to the supervisor; log now so it is seen even before stop() is called.
        _log.error("property source routine failed", routine=task.get_name(), exc_info=exc)


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    task.cancel()
    # asyncio.wait does not raise when the task was cancelled, and still lets a
    # cancellation of stop() itself propagate.
    await asyncio.wait([task])
    if not task.cancelled() and (exc := task.exception()) is not None:
        raise exc
