"""Serializers for task bodies: msgspec (JSON, MessagePack), raw bytes and protobuf.

This module owns the built-in implementations of
[`decaton_aio.typing.Serializer`][decaton_aio.typing.Serializer]. They share two rules, so
the runtime can treat every serializer the same way:

- ``decode`` raises only [`DecodeError`][decaton_aio.errors.DecodeError] with ``part == "body"``
  and the underlying library's message as the reason, chained to the original exception.
  The runtime sends such a record to the dead letter topic instead of crashing.
- ``encode`` of a task the serializer was not built for raises
  [`ConfigError`][decaton_aio.errors.ConfigError]: it is a programming error in the producing
  code, retrying cannot fix it, and it must not silently write a body that consumers
  would then reject as a poison pill.

Each serializer builds its encoder and decoder once and reuses them for every task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar, get_origin, overload

import msgspec

# protobuf ships no type information; types-protobuf provides it where installed. Either
# way the annotations below hold, hence the ignore that tolerates both setups.
from google.protobuf import message as protobuf_message  # type: ignore[import-untyped,unused-ignore]

from decaton_aio.errors import ConfigError, DecodeError

__all__ = [
    "BytesSerializer",
    "JsonSerializer",
    "MsgpackSerializer",
    "ProtobufSerializer",
]

T = TypeVar("T")
M = TypeVar("M", bound=protobuf_message.Message)

# What msgspec raises when a value cannot be encoded: unsupported types (TypeError), values
# out of range for the format (OverflowError, ValueError) and its own EncodeError.
_MSGSPEC_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, msgspec.EncodeError)


def _type_name(type_: object) -> str:
    """Return a short readable name for a class or a type expression such as ``list[int]``."""
    if isinstance(type_, type) and get_origin(type_) is None:
        return type_.__qualname__
    return repr(type_)


class _MsgspecSerializer(Generic[T]):
    """The shared machinery of the msgspec-backed serializers."""

    __slots__ = ("_decode", "_encode", "_instance_of", "_type")

    # Set by each subclass: the msgspec format's encoder and decoder classes.
    _encoder_class: ClassVar[type[msgspec.json.Encoder] | type[msgspec.msgpack.Encoder]]
    _decoder_class: ClassVar[type[msgspec.json.Decoder[Any]] | type[msgspec.msgpack.Decoder[Any]]]

    # The second overload lets type expressions that are not classes (unions, Literal,
    # Annotated) through, typed as serializers of Any, as msgspec's own Decoder does.
    @overload
    def __init__(self, type_: type[T]) -> None: ...

    @overload
    def __init__(self: _MsgspecSerializer[Any], type_: object) -> None: ...

    def __init__(self, type_: Any) -> None:
        try:
            decoder = self._decoder_class(type_)
        except TypeError as exc:
            raise ConfigError(
                f"{type(self).__name__} cannot handle {_type_name(type_)}: {exc}; "
                "use a msgspec Struct or another msgspec-supported type"
            ) from exc
        self._type: object = type_
        # Bound methods of one encoder and decoder, built once: msgspec caches per-type
        # state in them, and the attribute lookup is saved on every task.
        self._encode: Callable[[Any], bytes] = self._encoder_class().encode
        self._decode: Callable[[bytes], T] = decoder.decode
        # Only a plain class can be checked with isinstance; a type expression such as
        # list[int] or a Union is left to msgspec.
        # (typing.Any is a class on Python 3.11, but it has no instances.)
        plain = isinstance(type_, type) and type_ is not Any and get_origin(type_) is None
        self._instance_of: type[Any] | None = type_ if plain else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_type_name(self._type)})"

    def encode(self, task: T) -> bytes:
        """Serialize a task.

        Args:
            task: an instance of the type the serializer was built for.

        Returns:
            The encoded body.

        Raises:
            ConfigError: the task is not an instance of that type, or holds a value the
                format cannot represent.
        """
        if self._instance_of is not None and not isinstance(task, self._instance_of):
            raise ConfigError(
                f"{self!r} cannot encode {type(task).__qualname__} objects; pass "
                f"{_type_name(self._type)} instances or build a serializer for that type"
            )
        try:
            return self._encode(task)
        except _MSGSPEC_ENCODE_ERRORS as exc:
            raise ConfigError(f"{self!r} cannot encode the task: {exc}") from exc

    def decode(self, data: bytes) -> T:
        """Deserialize a body into the type the serializer was built for.

        Args:
            data: the record body.

        Returns:
            The task.

        Raises:
            DecodeError: with ``part == "body"`` when the body is malformed or does not
                match the type; the reason is msgspec's message, e.g.
                ``Expected `int`, got `str` - at `$.qty```.
        """
        try:
            return self._decode(data)
        except msgspec.DecodeError as exc:  # ValidationError is a subclass
            raise DecodeError("body", str(exc)) from exc
        except UnicodeDecodeError as exc:  # msgspec's own error for a string not in UTF-8
            raise DecodeError("body", f"a string is not valid UTF-8: {exc.reason}") from exc


class JsonSerializer(_MsgspecSerializer[T]):
    """JSON bodies for msgspec Structs or any other msgspec-supported type.

    Args:
        type_: the task type, typically a ``msgspec.Struct`` subclass.

    Raises:
        ConfigError: msgspec does not support ``type_``.
    """

    __slots__ = ()

    _encoder_class = msgspec.json.Encoder
    _decoder_class = msgspec.json.Decoder


class MsgpackSerializer(_MsgspecSerializer[T]):
    """MessagePack bodies for msgspec Structs or any other msgspec-supported type.

    More compact and faster than JSON; prefer it when every consumer is a msgspec or
    MessagePack user.

    Args:
        type_: the task type, typically a ``msgspec.Struct`` subclass.

    Raises:
        ConfigError: msgspec does not support ``type_``.
    """

    __slots__ = ()

    _encoder_class = msgspec.msgpack.Encoder
    _decoder_class = msgspec.msgpack.Decoder


class BytesSerializer:
    """Raw bodies: the task is the body, unchanged.

    Useful for opaque payloads and for relaying records whose format the application does
    not need to understand. ``decode`` never fails.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "BytesSerializer()"

    def encode(self, task: bytes | bytearray | memoryview) -> bytes:
        """Return the task as the body.

        Args:
            task: the body; a ``bytearray`` or ``memoryview`` is copied into ``bytes``.

        Returns:
            The body.

        Raises:
            ConfigError: the task is not bytes-like (a ``str`` must be encoded first).
        """
        if type(task) is bytes:
            return task
        if isinstance(task, bytearray | memoryview):
            return bytes(task)
        raise ConfigError(
            f"BytesSerializer cannot encode {type(task).__qualname__} objects; pass bytes "
            "(encode text first, e.g. task.encode())"
        )

    def decode(self, data: bytes) -> bytes:
        """Return the body as the task.

        Args:
            data: the record body.

        Returns:
            The same bytes.
        """
        return data


class ProtobufSerializer(Generic[M]):
    """Protobuf bodies for one message class (generated or built at run time).

    Args:
        message_class: a ``google.protobuf.message.Message`` subclass.

    Raises:
        ConfigError: ``message_class`` is not a protobuf message class.
    """

    __slots__ = ("_message_class",)

    def __init__(self, message_class: type[M]) -> None:
        if not (
            isinstance(message_class, type)
            and issubclass(message_class, protobuf_message.Message)
            and message_class is not protobuf_message.Message
        ):
            raise ConfigError(
                f"ProtobufSerializer needs a protobuf message class, got {message_class!r}"
            )
        self._message_class = message_class

    def __repr__(self) -> str:
        return f"ProtobufSerializer({self._message_class.DESCRIPTOR.full_name})"

    def encode(self, task: M) -> bytes:
        """Serialize a message.

        Args:
            task: an instance of the message class.

        Returns:
            The serialized message.

        Raises:
            ConfigError: the task is another type, or a proto2 message missing required
                fields.
        """
        if not isinstance(task, self._message_class):
            raise ConfigError(
                f"{self!r} cannot encode {type(task).__qualname__} objects; pass "
                f"{self._message_class.DESCRIPTOR.full_name} messages"
            )
        try:
            body: bytes = task.SerializeToString()
        except protobuf_message.EncodeError as exc:
            raise ConfigError(f"{self!r} cannot encode the task: {exc}") from exc
        return body

    def decode(self, data: bytes) -> M:
        """Parse a body into a message.

        Args:
            data: the record body.

        Returns:
            The parsed message.

        Raises:
            DecodeError: with ``part == "body"`` when protobuf cannot parse the body.
        """
        try:
            task: M = self._message_class.FromString(data)
        except protobuf_message.DecodeError as exc:
            raise DecodeError("body", str(exc) or type(exc).__name__) from exc
        return task


def unchecked_decode(decode: Callable[[bytes], T]) -> Callable[[bytes], T]:
    """The decoding behind a serializer's ``decode``, without its error translation.

    For the runtime's hot path: a msgspec serializer's ``decode`` is its decoder's own
    method behind one Python call that turns errors into
    [`DecodeError`][decaton_aio.errors.DecodeError]. The caller of what this returns calls
    ``decode`` again when it raises, for that error. Any other ``decode`` comes back as it
    is.
    """
    owner = getattr(decode, "__self__", None)
    if isinstance(owner, _MsgspecSerializer) and getattr(decode, "__func__", None) is (
        _MsgspecSerializer.decode
    ):
        return owner._decode
    return decode
