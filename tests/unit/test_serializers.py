"""Task body serializers: round trips, body DecodeErrors, ConfigError on wrong types."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from google.protobuf import message as protobuf_message
from hypothesis import given
from hypothesis import strategies as st

from decaton_aio.errors import ConfigError, DecodeError
from decaton_aio.serializers import (
    BytesSerializer,
    JsonSerializer,
    MsgpackSerializer,
    ProtobufSerializer,
)
from decaton_aio.typing import Serializer
from tests.unit.protobuf_helpers import legacy_task_class, order_task_class


class Order(msgspec.Struct, frozen=True):
    """A sample task body."""

    order_id: str
    amount: int
    tags: list[str] = []


class Refund(msgspec.Struct, frozen=True):
    """Another task type, to feed a serializer the wrong type."""

    order_id: str


MSGSPEC_SERIALIZERS = [JsonSerializer, MsgpackSerializer]

orders = st.builds(
    Order,
    st.text(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.lists(st.text(), max_size=5),
)


# --------------------------------------------------------------------------- protocol


def test_every_serializer_satisfies_the_protocol() -> None:
    """Each built-in serializer is a Serializer (checked structurally at run time)."""
    candidates: list[object] = [
        JsonSerializer(Order),
        MsgpackSerializer(Order),
        BytesSerializer(),
        ProtobufSerializer(order_task_class()),
    ]
    for serializer in candidates:
        assert isinstance(serializer, Serializer)


def test_repr_names_serializer_and_type() -> None:
    """A serializer's repr says what it handles, for logs and error messages."""
    assert repr(JsonSerializer(Order)) == "JsonSerializer(Order)"
    assert repr(MsgpackSerializer(list[int])) == "MsgpackSerializer(list[int])"
    assert repr(BytesSerializer()) == "BytesSerializer()"
    assert repr(ProtobufSerializer(order_task_class())) == (
        "ProtobufSerializer(decaton_aio.testing.OrderTask)"
    )


# --------------------------------------------------------------------------- msgspec


@pytest.mark.parametrize("serializer_class", MSGSPEC_SERIALIZERS)
@given(order=orders)
def test_msgspec_round_trip(serializer_class: type[JsonSerializer[Order]], order: Order) -> None:
    """A Struct survives encode then decode unchanged, in JSON and MessagePack."""
    serializer = serializer_class(Order)
    assert serializer.decode(serializer.encode(order)) == order


def test_json_body_is_plain_json() -> None:
    """JSON bodies are readable by any JSON consumer, field names as keys."""
    body = JsonSerializer(Order).encode(Order("o-1", 5, ["gift"]))
    assert body == b'{"order_id":"o-1","amount":5,"tags":["gift"]}'


def test_msgpack_body_is_standard_msgpack() -> None:
    """MessagePack bodies decode with a schema-less MessagePack reader."""
    body = MsgpackSerializer(Order).encode(Order("o-1", 5))
    assert msgspec.msgpack.decode(body) == {"order_id": "o-1", "amount": 5, "tags": []}


@pytest.mark.parametrize("serializer_class", MSGSPEC_SERIALIZERS)
def test_msgspec_serializer_handles_non_struct_types(
    serializer_class: type[JsonSerializer[Any]],
) -> None:
    """Any msgspec-supported type works, including generic aliases and unions."""
    as_list = serializer_class(list[int])
    assert as_list.decode(as_list.encode([1, 2, 3])) == [1, 2, 3]
    as_union = serializer_class(int | str)
    assert as_union.decode(as_union.encode("x")) == "x"
    as_dict = serializer_class(dict)
    assert as_dict.decode(as_dict.encode({"a": 1})) == {"a": 1}


@pytest.mark.parametrize(
    ("serializer", "body", "reason"),
    [
        (JsonSerializer(Order), b'{"order_id": "o-1", "amount": ', "Input data was truncated"),
        (JsonSerializer(Order), b"<html>", "JSON is malformed: invalid character (byte 0)"),
        (
            JsonSerializer(Order),
            b'{"order_id": "o-1", "amount": "5"}',
            "Expected `int`, got `str` - at `$.amount`",
        ),
        (JsonSerializer(Order), b'{"amount": 5}', "Object missing required field `order_id`"),
        (
            MsgpackSerializer(Order),
            b"\xc1",
            "MessagePack data is malformed: invalid opcode '\\xc1' (byte 0)",
        ),
        (
            MsgpackSerializer(Order),
            msgspec.msgpack.encode({"order_id": 1, "amount": 5}),
            "Expected `str`, got `int` - at `$.order_id`",
        ),
    ],
    ids=[
        "json-truncated",
        "json-garbage",
        "json-wrong-type",
        "json-missing-field",
        "msgpack-garbage",
        "msgpack-wrong-type",
    ],
)
def test_msgspec_decode_failure_is_body_decode_error(
    serializer: JsonSerializer[Order], body: bytes, reason: str
) -> None:
    """A bad body raises DecodeError("body") carrying msgspec's own message, chained."""
    with pytest.raises(DecodeError) as info:
        serializer.decode(body)
    assert info.value.part == "body"
    assert info.value.reason == reason
    assert isinstance(info.value.__cause__, msgspec.DecodeError)


@pytest.mark.parametrize("serializer_class", MSGSPEC_SERIALIZERS)
def test_msgspec_encode_of_wrong_type_is_config_error(
    serializer_class: type[JsonSerializer[Any]],
) -> None:
    """Encoding another type fails loudly instead of writing a body consumers would reject."""
    serializer = serializer_class(Order)
    with pytest.raises(
        ConfigError, match=r"\(Order\) cannot encode Refund objects; pass Order instances"
    ):
        serializer.encode(Refund("o-1"))
    with pytest.raises(ConfigError, match="cannot encode dict objects"):
        serializer.encode({"order_id": "o-1", "amount": 5})


def test_msgspec_encode_of_unencodable_value_is_config_error() -> None:
    """A value msgspec cannot encode is a ConfigError chained to msgspec's error."""
    with pytest.raises(ConfigError, match="Encoding objects of type object is unsupported") as e:
        JsonSerializer(list[Any]).encode([object()])
    assert isinstance(e.value.__cause__, TypeError)
    with pytest.raises(ConfigError, match="can't serialize ints"):
        MsgpackSerializer(int).encode(2**70)


def test_msgspec_serializer_rejects_unsupported_type() -> None:
    """Building a serializer for a type msgspec cannot handle fails at construction."""
    with pytest.raises(ConfigError, match="JsonSerializer cannot handle"):
        JsonSerializer(object())


# --------------------------------------------------------------------------- bytes


@given(st.binary())
def test_bytes_round_trip(body: bytes) -> None:
    """Raw bodies pass through unchanged both ways."""
    serializer = BytesSerializer()
    assert serializer.encode(body) == body
    assert serializer.decode(body) == body


def test_bytes_serializer_copies_bytes_like_and_rejects_text() -> None:
    """bytearray and memoryview become bytes; a str is refused with a hint."""
    serializer = BytesSerializer()
    assert serializer.encode(bytearray(b"ab")) == b"ab"
    assert type(serializer.encode(memoryview(b"ab"))) is bytes
    with pytest.raises(ConfigError, match=r"cannot encode str objects; pass bytes"):
        serializer.encode("ab")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- protobuf


def test_protobuf_round_trip() -> None:
    """A message built at run time survives encode then decode field by field."""
    order_task = order_task_class()
    serializer = ProtobufSerializer(order_task)
    task = order_task(order_id="o-1", amount=-5, tags=["gift", "주문"])
    decoded = serializer.decode(serializer.encode(task))
    assert decoded == task
    assert (decoded.order_id, decoded.amount, list(decoded.tags)) == ("o-1", -5, ["gift", "주문"])


def test_protobuf_body_is_the_standard_wire_format() -> None:
    """The body is the message's own serialization, readable by any protobuf runtime."""
    order_task = order_task_class()
    body = ProtobufSerializer(order_task).encode(order_task(order_id="a", amount=1))
    assert body == b"\x0a\x01a\x10\x01"


@pytest.mark.parametrize(
    "body",
    [b"\x0a\x05ab", b"\x0a\x02\xc3\x28", b"\x07"],
    ids=["truncated", "invalid-utf8", "invalid-wire-type"],
)
def test_protobuf_decode_failure_is_body_decode_error(body: bytes) -> None:
    """A bad body raises DecodeError("body") with protobuf's message, chained."""
    with pytest.raises(DecodeError) as info:
        ProtobufSerializer(order_task_class()).decode(body)
    assert info.value.part == "body"
    assert "Error parsing message with type 'decaton_aio.testing.OrderTask'" in info.value.reason
    assert isinstance(info.value.__cause__, protobuf_message.DecodeError)


def test_protobuf_encode_of_wrong_type_is_config_error() -> None:
    """Encoding another message type or a non-message fails with ConfigError."""
    serializer = ProtobufSerializer(order_task_class())
    with pytest.raises(ConfigError, match="cannot encode LegacyTask objects"):
        serializer.encode(legacy_task_class()(id="x"))
    with pytest.raises(ConfigError, match=r"pass decaton_aio.testing.OrderTask messages"):
        serializer.encode(b"\x0a\x01a")


def test_protobuf_encode_of_incomplete_proto2_message_is_config_error() -> None:
    """A proto2 message missing a required field cannot be encoded."""
    legacy_task = legacy_task_class()
    serializer = ProtobufSerializer(legacy_task)
    with pytest.raises(ConfigError, match="missing required fields: id") as info:
        serializer.encode(legacy_task())
    assert isinstance(info.value.__cause__, protobuf_message.EncodeError)
    assert serializer.decode(serializer.encode(legacy_task(id="x"))).id == "x"


@pytest.mark.parametrize("not_a_message", [Order, protobuf_message.Message, "OrderTask", None])
def test_protobuf_serializer_needs_a_message_class(not_a_message: Any) -> None:
    """Only a concrete protobuf message class is accepted."""
    with pytest.raises(ConfigError, match="ProtobufSerializer needs a protobuf message class"):
        ProtobufSerializer(not_a_message)
