"""The shapes users implement, as Protocols.

This module owns the structural types the runtime accepts from applications; it holds no
implementations (those live next to the machinery that uses them, e.g.
`decaton_aio.serializers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["Record", "RecordSender", "Serializer", "TokenProvider"]

T = TypeVar("T")


class Record(Protocol):
    """What the runtime reads of a fetched record."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]:
        """Header keys and values (Kafka allows a null value; ``dt_meta`` is checked)."""


@runtime_checkable
class Serializer(Protocol[T]):
    """Turns a task into a record body and back.

    Implementations must be stateless enough to be called concurrently from one event loop
    and must not block it for long: both methods run inline on the consumer's loop.
    """

    def encode(self, task: T) -> bytes:
        """Serialize a task into a record body.

        Args:
            task: the task to serialize.

        Returns:
            The record body.

        Raises:
            ConfigError: the task is not of the type this serializer handles.
        """
        ...

    def decode(self, data: bytes) -> T:
        """Deserialize a record body into a task.

        Args:
            data: the record body.

        Returns:
            The task.

        Raises:
            DecodeError: with ``part == "body"`` when the body is not a valid task.
        """
        ...


class RecordSender(Protocol):
    """Sends raw records durably: the runtime's way to the retry, dead letter and
    shaping topics.

    ``send`` returns once the record is durable (acknowledged by the broker, or kept
    locally to be delivered later); it raises when it is neither, and the caller must then
    not treat the record as handed off.
    """

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> object:
        """Send one record and wait until it is durable.

        Raises:
            ProducerError: when the record could be neither delivered nor kept.
        """
        ...


@runtime_checkable
class TokenProvider(Protocol):
    """Gives OAUTHBEARER tokens (``sasl_mechanism="OAUTHBEARER"``).

    ``token()`` is awaited on every new connection to the cluster: return a token that is
    valid now (refresh and cache it as your identity provider requires). ``extensions()``
    may be defined too, returning SASL extensions as a ``dict[str, str]``.
    """

    async def token(self) -> str:
        """An access token (a JWT for most clusters)."""
        ...
