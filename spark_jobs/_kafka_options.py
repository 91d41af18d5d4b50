"""The read options of the ``decaton_kafka`` source: lookup, offsets, and their parsed form.

Spark hands options over as strings in a case-insensitive mapping. This module owns
reading them (:func:`option_value`, :func:`require_option`, :func:`int_option`; the sink
uses them too), parsing ``startingOffsets``/``endingOffsets`` into bounds
(:func:`parse_offsets`, :data:`EARLIEST`, :data:`LATEST`), and :class:`KafkaReadOptions`,
the validated options of one read. What each option means is documented in
:mod:`spark_jobs.kafka_source`, which re-exports the names used from outside.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from decaton_aio.cli import import_object
from decaton_aio.client_properties import client_property_entries, parse_client_properties
from decaton_aio.errors import ConfigError
from decaton_aio.offsets import ISOLATION_LEVELS
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = [
    "DEFAULT_MAX_POLL_RECORDS",
    "DEFAULT_POLL_TIMEOUT_MS",
    "EARLIEST",
    "FORMAT",
    "LATEST",
    "KafkaReadOptions",
    "int_option",
    "option_value",
    "parse_offsets",
    "require_option",
    "security_from_options",
    "security_to_options",
]

FORMAT: Final = "decaton_kafka"
"""The name to pass to ``spark.read.format()`` and ``df.write.format()``."""

EARLIEST: Final = -2
"""In an offsets option: the first offset still in the log."""

LATEST: Final = -1
"""In an offsets option: the end of the log (the high watermark when the query is planned)."""

DEFAULT_MAX_POLL_RECORDS: Final = 5000
DEFAULT_POLL_TIMEOUT_MS: Final = 30_000

_OFFSET_WORDS: Final = {"earliest": EARLIEST, "latest": LATEST}

#: Options starting with this are Kafka client properties (``kafka.security.protocol``,
#: ``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location``, ...), as in Spark's own
#: Kafka connector.
KAFKA_PREFIX: Final = "kafka."

#: The option naming an OAUTHBEARER token provider, ``MODULE:ATTR`` (importable where
#: Spark tasks run).
TOKEN_PROVIDER_OPTION: Final = "oauthTokenProvider"


def option_value(options: Mapping[str, str], name: str) -> str | None:
    """The stripped value of an option, or ``None`` when absent or blank.

    Spark hands options over in a case-insensitive mapping; a plain dict (in unit tests or
    helpers) is looked up case-insensitively too.
    """
    value = options.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in options.items() if k.lower() == lowered), None)
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def require_option(options: Mapping[str, str], name: str, what: str) -> str:
    """The value of a required option.

    Raises:
        ConfigError: when it is missing; the message shows how to set it.
    """
    value = option_value(options, name)
    if value is None:
        raise ConfigError(f"option {name!r} is required: {what}, e.g. .option({name!r}, ...)")
    return value


def int_option(options: Mapping[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    """An integer option with a default.

    Raises:
        ConfigError: when the value is not an integer or below ``minimum``.
    """
    raw = option_value(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name!r} must be >= {minimum}, got {value}")
    return value


def security_from_options(options: Mapping[str, str]) -> SecuritySettings:
    """The security settings of the ``kafka.*`` options (Kafka's client property names).

    Raises:
        ConfigError: an option is not supported or the settings are not valid; the message
            names the option, never a password.
    """
    entries = {
        k[len(KAFKA_PREFIX) :]: str(v)
        for k, v in options.items()
        if k.lower().startswith(KAFKA_PREFIX) and k.lower() != "kafka.bootstrap.servers"
    }
    props = parse_client_properties(entries, source="options")
    if props.unsupported:
        names = ", ".join(KAFKA_PREFIX + name for name in props.unsupported)
        raise ConfigError(f"options not supported by the {FORMAT} format: {names}")
    provider = option_value(options, TOKEN_PROVIDER_OPTION)
    if provider is None:
        return props.security()
    found = import_object(provider)
    return props.security(sasl_oauth_token_provider=found() if isinstance(found, type) else found)


def security_to_options(
    security: SecuritySettings, *, oauth_token_provider: str | None = None
) -> dict[str, str]:
    """The options that carry ``security`` to Spark's workers (see
    :func:`security_from_options`).

    Args:
        security: the settings.
        oauth_token_provider: ``MODULE:ATTR`` of the OAUTHBEARER token provider (a Python
            object cannot travel as an option).

    Raises:
        ConfigError: OAUTHBEARER without ``oauth_token_provider``.
    """
    if security == PLAINTEXT:
        return {}
    if security.sasl_mechanism == "OAUTHBEARER" and not oauth_token_provider:
        raise ConfigError(
            "OAUTHBEARER in Spark needs the token provider as MODULE:ATTR "
            "(--sasl-oauth-token-provider), importable where Spark tasks run"
        )
    options = {KAFKA_PREFIX + k: v for k, v in client_property_entries(security).items()}
    if oauth_token_provider:
        options[TOKEN_PROVIDER_OPTION] = oauth_token_provider
    return options


def parse_offsets(text: str | None, option: str, *, default: int) -> tuple[int, dict[int, int]]:
    """Parse a ``startingOffsets`` or ``endingOffsets`` value.

    Args:
        text: ``"earliest"``, ``"latest"``, a JSON object ``{"<partition>": offset}`` whose
            offsets are ``>= 0``, ``-2``/``"earliest"`` or ``-1``/``"latest"``; ``None`` for
            the default.
        option: the option's name, for error messages.
        default: :data:`EARLIEST` or :data:`LATEST`, used when ``text`` is ``None``.

    Returns:
        The bound for partitions not named, and the bound of each named partition; bounds
        are offsets or :data:`EARLIEST`/:data:`LATEST`.

    Raises:
        ConfigError: when the text is neither word nor a JSON object of that shape.
    """
    if text is None:
        return default, {}
    word = _OFFSET_WORDS.get(text.lower())
    if word is not None:
        return word, {}
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"option {option!r} must be 'earliest', 'latest' or a JSON object like "
            f'{{"0": 5}}, got {text!r} ({exc.msg})'
        ) from None
    if not isinstance(decoded, dict):
        raise ConfigError(f'option {option!r} must be a JSON object like {{"0": 5}}, got {text!r}')
    bounds: dict[int, int] = {}
    for key, value in decoded.items():
        try:
            partition = int(key)
        except ValueError:
            partition = -1
        if partition < 0:
            raise ConfigError(f"option {option!r}: {key!r} is not a partition number")
        bounds[partition] = _offset_bound(value, option, partition)
    return default, bounds


def _offset_bound(value: Any, option: str, partition: int) -> int:
    if isinstance(value, str) and value.lower() in _OFFSET_WORDS:
        return _OFFSET_WORDS[value.lower()]
    if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
        raise ConfigError(
            f"option {option!r}: partition {partition} has {value!r}; use an offset >= 0, "
            "-2 or 'earliest', -1 or 'latest'"
        )
    return value


@dataclass(frozen=True)
class KafkaReadOptions:
    """The parsed options of a read (see the module docstring for each option).

    Attributes:
        bootstrap_servers: where the cluster is.
        topic: the topic to read.
        starting: the start bound of partitions not named in ``starting_by_partition``.
        starting_by_partition: start bounds of named partitions.
        ending: the end bound of partitions not named in ``ending_by_partition``.
        ending_by_partition: exclusive end bounds of named partitions.
        max_poll_records: records per poll in a Spark task.
        poll_timeout_ms: how long a partition read may stall before failing.
        isolation_level: ``read_uncommitted`` or ``read_committed``.
        security: TLS and SASL settings (the ``kafka.*`` options).
    """

    bootstrap_servers: str
    topic: str
    starting: int = EARLIEST
    starting_by_partition: Mapping[int, int] | None = None
    ending: int = LATEST
    ending_by_partition: Mapping[int, int] | None = None
    max_poll_records: int = DEFAULT_MAX_POLL_RECORDS
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    isolation_level: str = "read_uncommitted"
    security: SecuritySettings = PLAINTEXT

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaReadOptions:
        """Validate and parse the options Spark passes to the source.

        Raises:
            ConfigError: when an option is missing or malformed.
        """
        bootstrap = require_option(options, "bootstrap.servers", "host:port of the cluster")
        topic = require_option(options, "topic", "the topic to read")
        starting, starting_by = parse_offsets(
            option_value(options, "startingOffsets"), "startingOffsets", default=EARLIEST
        )
        ending, ending_by = parse_offsets(
            option_value(options, "endingOffsets"), "endingOffsets", default=LATEST
        )
        if ending == EARLIEST or EARLIEST in ending_by.values():
            raise ConfigError("option 'endingOffsets' cannot be 'earliest' (-2): nothing to read")
        for partition, start in starting_by.items():
            end = ending_by.get(partition, ending)
            if start >= 0 and end >= 0 and start > end:
                raise ConfigError(
                    f"partition {partition}: startingOffsets {start} is after endingOffsets {end}"
                )
        isolation = option_value(options, "isolationLevel") or "read_uncommitted"
        if isolation not in ISOLATION_LEVELS:
            raise ConfigError(
                f"option 'isolationLevel' must be one of {ISOLATION_LEVELS}, got {isolation!r}"
            )
        return cls(
            bootstrap_servers=bootstrap,
            topic=topic,
            starting=starting,
            starting_by_partition=starting_by,
            ending=ending,
            ending_by_partition=ending_by,
            max_poll_records=int_option(options, "maxPollRecords", DEFAULT_MAX_POLL_RECORDS),
            poll_timeout_ms=int_option(options, "pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS),
            isolation_level=isolation,
            security=security_from_options(options),
        )

    def start_bound(self, partition: int) -> int:
        """The start bound asked for ``partition``: an offset, EARLIEST or LATEST."""
        return (self.starting_by_partition or {}).get(partition, self.starting)

    def end_bound(self, partition: int) -> int:
        """The end bound asked for ``partition``: an offset or LATEST."""
        return (self.ending_by_partition or {}).get(partition, self.ending)

    def named_partitions(self) -> set[int]:
        """The partitions named in either offsets option."""
        return set(self.starting_by_partition or {}) | set(self.ending_by_partition or {})
