"""The shapes users implement, as Protocols.

This module owns the structural types the runtime accepts from applications; it holds no
implementations (those live next to the machinery that uses them, e.g.
:mod:`decaton_aio.serializers`).
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["Serializer"]

T = TypeVar("T")


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
