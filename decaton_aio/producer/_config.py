"""The producer's settings: [`ProducerConfig`][decaton_aio.ProducerConfig], validated when
it is made."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Literal

from decaton_aio.errors import ConfigError
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = [
    "COMPRESSION_TYPES",
    "DEFAULT_LINGER_MS",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "Idempotence",
    "ProducerConfig",
]

#: ``"auto"``: idempotent where the cluster grants it; ``True``: required; ``False``: off.
Idempotence = bool | Literal["auto"]

#: Codecs a producer can compress batches with (every one is installed with the package).
COMPRESSION_TYPES = ("gzip", "snappy", "lz4", "zstd")

DEFAULT_LINGER_MS = 5
DEFAULT_MAX_BATCH_BYTES = 256 * 1024
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
DEFAULT_REPLAY_BACKOFF_MS = 500
DEFAULT_REPLAY_BACKOFF_MAX_MS = 30_000


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ProducerConfig:
    """Settings of a [`TaskProducer`][decaton_aio.TaskProducer] and its sender.

    Attributes:
        bootstrap_servers: ``host:port[,host:port]`` of the cluster.
        idempotence: use the idempotent producer (no duplicates from client retries):
            ``"auto"`` (the default) where the cluster grants it, else a plain producer
            and one warning; ``True`` requires it (the start fails where the cluster
            refuses); ``False`` never.
        compression_type: the codec of produced batches: ``None`` (uncompressed),
            ``"gzip"``, ``"snappy"``, ``"lz4"`` or ``"zstd"``.
        application_id: written to ``dt_meta`` as the source application id.
        instance_id: written to ``dt_meta`` as the source instance id (host-pid default).
        linger_ms: how long the client waits to fill a batch.
        max_batch_bytes: the largest batch the client sends per partition.
        request_timeout_ms: how long a produce request may take before it is retried; a
            non-idempotent client also gives up on a batch this long after creating it.
        delivery_timeout_ms: how long a record may wait for its acknowledgement before the
            producer gives up on it (spools it, or fails the put without a spool); the
            client may still deliver it later (a duplicate). ``None``: twice
            ``request_timeout_ms`` plus ``linger_ms``, so a non-idempotent client reports
            its own error first; an idempotent client never gives up by itself.
        spool_dir: the local spool directory of the durable producer; ``None``: no spool,
            an undeliverable put raises [`ProducerError`][decaton_aio.errors.ProducerError].
            One producer (one [`DurableSender`][decaton_aio.DurableSender]) per directory.
        replay_backoff_ms: the wait after the first failed replay of the spool; it doubles
            (with jitter) after each further failure.
        replay_backoff_max_ms: the longest wait between replay attempts.
        security: TLS and SASL settings of the producer's client.
    """

    bootstrap_servers: str
    idempotence: Idempotence = "auto"
    compression_type: str | None = None
    application_id: str = "decaton-aio"
    instance_id: str = field(default_factory=_default_instance_id)
    linger_ms: int = DEFAULT_LINGER_MS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    delivery_timeout_ms: int | None = None
    spool_dir: str | os.PathLike[str] | None = None
    replay_backoff_ms: int = DEFAULT_REPLAY_BACKOFF_MS
    replay_backoff_max_ms: int = DEFAULT_REPLAY_BACKOFF_MAX_MS
    security: SecuritySettings = PLAINTEXT

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers is empty: give host:port of the cluster")
        if self.idempotence not in (True, False, "auto"):
            raise ConfigError(
                f"idempotence must be 'auto', True or False, got {self.idempotence!r}"
            )
        if self.compression_type is not None and self.compression_type not in COMPRESSION_TYPES:
            raise ConfigError(
                f"compression_type must be None or one of {COMPRESSION_TYPES}, "
                f"got {self.compression_type!r}"
            )
        if self.linger_ms < 0:
            raise ConfigError(f"linger_ms must be >= 0, got {self.linger_ms}")
        if self.max_batch_bytes < 1024:
            raise ConfigError(f"max_batch_bytes must be >= 1024, got {self.max_batch_bytes}")
        if self.request_timeout_ms < 1:
            raise ConfigError(f"request_timeout_ms must be >= 1, got {self.request_timeout_ms}")
        if self.delivery_timeout_ms is not None and self.delivery_timeout_ms < 1:
            raise ConfigError(
                f"delivery_timeout_ms must be >= 1 (or None for the default), "
                f"got {self.delivery_timeout_ms}"
            )
        if self.spool_dir is not None and not os.fspath(self.spool_dir):
            raise ConfigError("spool_dir is empty: name a directory, or None for no spool")
        if self.replay_backoff_ms < 1:
            raise ConfigError(f"replay_backoff_ms must be >= 1, got {self.replay_backoff_ms}")
        if self.replay_backoff_max_ms < self.replay_backoff_ms:
            raise ConfigError(
                f"replay_backoff_max_ms ({self.replay_backoff_max_ms}) must be >= "
                f"replay_backoff_ms ({self.replay_backoff_ms})"
            )

    @property
    def effective_delivery_timeout_ms(self) -> int:
        """``delivery_timeout_ms``, or its default when it is ``None``."""
        if self.delivery_timeout_ms is not None:
            return self.delivery_timeout_ms
        return 2 * self.request_timeout_ms + self.linger_ms
