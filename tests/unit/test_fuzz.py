"""No input stalls a partition: any bytes, in any header, body or key, are either
processed or dead-lettered with the reason, nothing escapes into the runtime, and the
watermark reaches the end of what was fed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decaton_aio.context import ProcessingContext
from decaton_aio.errors import DecodeError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.serializers import (
    BytesSerializer,
    JsonSerializer,
    MsgpackSerializer,
    ProtobufSerializer,
)
from decaton_aio.typing import Serializer
from tests.unit.protobuf_helpers import legacy_task_class, order_task_class
from tests.unit.test_partition import FakeRecord, FakeSender, make, settle


class Order(msgspec.Struct, frozen=True):
    order_id: str
    amount: int


SERIALIZERS: list[Serializer[Any]] = [
    JsonSerializer(Order),
    MsgpackSerializer(Order),
    ProtobufSerializer(order_task_class()),
    ProtobufSerializer(legacy_task_class()),  # proto2 with a required field
    BytesSerializer(),
]

# Bodies: random bytes, and near misses of valid ones (truncated, with a byte flipped).
_valid = st.sampled_from(
    [
        JsonSerializer(Order).encode(Order("o-1", 5)),
        MsgpackSerializer(Order).encode(Order("o-2", 7)),
        order_task_class()(order_id="o-3").SerializeToString(),
    ]
)
bodies = st.one_of(
    st.binary(max_size=80),
    _valid,
    st.tuples(_valid, st.integers(0, 40)).map(lambda v: v[0][: v[1]]),
    st.tuples(_valid, st.integers(0, 40), st.integers(1, 255)).map(
        lambda v: (
            v[0][: v[1]] + bytes([v[0][v[1]] ^ v[2]]) + v[0][v[1] + 1 :]
            if v[1] < len(v[0])
            else v[0]
        )
    ),
)


@pytest.mark.parametrize("serializer", SERIALIZERS, ids=lambda s: type(s).__name__)
@given(body=bodies)
def test_any_body_decodes_or_raises_decode_error(serializer: Serializer[Any], body: bytes) -> None:
    """A serializer either decodes the bytes or raises DecodeError naming the body; no
    other exception can reach the runtime."""
    try:
        serializer.decode(body)
    except DecodeError as exc:
        if exc.part != "body":
            raise


headers = st.lists(
    st.tuples(
        st.sampled_from([METADATA_HEADER, "x-trace", ""]),
        st.one_of(
            st.binary(max_size=24),
            st.builds(
                lambda t, r, s: encode_metadata(
                    TaskMetadata(t, retry_count=r, scheduled_time_ms=s)
                ),
                st.integers(0, 2**40),
                st.integers(0, 5),
                st.sampled_from([0, 1]),  # scheduled in the past: runs now
            ),
        ),
    ),
    max_size=3,
)
records_ = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(max_size=3)), st.one_of(st.none(), bodies), headers),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(batch=records_)
async def test_any_batch_is_processed_or_dead_lettered_and_the_watermark_reaches_the_end(
    batch: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]],
) -> None:
    """Random keys, bodies and headers (a malformed dt_meta, tombstones, garbage bodies):
    every record either runs or goes to the dead letter topic with the reason, and every
    offset completes."""
    serializer = JsonSerializer(Order)
    ran: list[int] = []

    async def process(ctx: ProcessingContext, task: Order) -> None:
        ran.append(ctx.offset)

    sender = FakeSender()
    proc = make(process, decode=serializer.decode, sender=sender)
    fed = [
        FakeRecord(offset, key, value, headers=list(hdrs))
        for offset, (key, value, hdrs) in enumerate(batch)
    ]
    proc.feed(fed)
    await settle()
    dead = [s for s in sender.sent if s[0] == "tasks-dlq"]
    assert len(ran) + len(dead) == len(fed)
    assert proc.committable() == len(fed)
    for _topic, _key, _value, sent_headers in dead:
        reason = dict(sent_headers)["dt_dlq_error_type"]
        assert reason in (b"DecodeError:body", b"DecodeError:header")


async def test_a_serializer_raising_anything_else_still_dead_letters_the_record() -> None:
    """A user's serializer may raise any exception: the record is a poison pill all the
    same, and the partition goes on."""

    def decode(data: bytes) -> bytes:
        if data == b"bad":
            raise KeyError("field")
        return data

    ran: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        ran.append(ctx.offset)

    sender = FakeSender()
    proc = make(process, decode=decode, sender=sender)
    proc.feed([FakeRecord(0, b"k", b"bad"), FakeRecord(1, b"k", b"good")])
    await settle()
    assert ran == [1]
    ((topic, _key, _value, headers),) = sender.sent
    assert topic == "tasks-dlq"
    assert dict(headers)["dt_dlq_error_message"] == b"the serializer raised KeyError: 'field'"
    assert proc.committable() == 2
