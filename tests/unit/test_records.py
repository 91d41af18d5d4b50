"""The raw-record hook: marked consumers get aiokafka's own records, others ConsumerRecord."""

from __future__ import annotations

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from decaton_aio._aiokafka import DefaultRecordBatchBuilder, MemoryRecords, PartitionRecords
from decaton_aio.consumer._records import RAW_RECORDS, TaskRecord, install_raw_records, task_record
from tests.unit.test_partition import FakeRecord

TP = TopicPartition("tasks", 2)


def _fetched(key_deserializer: object) -> list[object]:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False,
        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(3):
        builder.append(i, timestamp=1_000 + i, key=b"k%d" % i, value=b"v%d" % i,
                       headers=[("dt_meta", b"\x08\x01")])  # fmt: skip
    records = MemoryRecords(bytes(builder.build()))
    fetched = PartitionRecords(
        TP, records, [], 0, key_deserializer, None, check_crcs=True, isolation_level=0
    )
    return list(fetched)


def test_marked_consumers_get_the_batch_records_with_the_fields_the_runtime_reads() -> None:
    assert install_raw_records()
    assert install_raw_records()  # idempotent: one hook, not two
    raw = _fetched(RAW_RECORDS)
    assert not any(isinstance(r, ConsumerRecord) for r in raw)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in raw] == [  # type: ignore[attr-defined]
        (0, 1_000, b"k0", b"v0"),
        (1, 1_001, b"k1", b"v1"),
        (2, 1_002, b"k2", b"v2"),
    ]
    assert [list(r.headers) for r in raw] == [[("dt_meta", b"\x08\x01")]] * 3  # type: ignore[attr-defined]


def test_other_consumers_still_get_consumer_records() -> None:
    install_raw_records()
    plain = _fetched(None)
    assert all(isinstance(r, ConsumerRecord) for r in plain)
    assert [(r.topic, r.partition, r.offset, r.key) for r in plain] == [  # type: ignore[attr-defined]
        ("tasks", 2, 0, b"k0"),
        ("tasks", 2, 1, b"k1"),
        ("tasks", 2, 2, b"k2"),
    ]


def test_the_marker_is_an_identity_key_deserializer() -> None:
    assert RAW_RECORDS(b"key") == b"key"
    assert RAW_RECORDS(None) is None


def test_a_task_record_keeps_every_field_and_packs_a_lone_dt_meta_header() -> None:
    """The partition's form of a record reads the same: a lone dt_meta header is kept as
    its value only, other header lists as they are; its size is its value's length."""
    install_raw_records()
    (raw, *_) = _fetched(RAW_RECORDS)
    packed = task_record(raw)  # type: ignore[arg-type]
    assert isinstance(packed, TaskRecord)
    assert packed.packed_headers == b"\x08\x01"
    assert (packed.offset, packed.timestamp, packed.key, packed.value, packed.headers) == (
        raw.offset, raw.timestamp, raw.key, raw.value, [("dt_meta", b"\x08\x01")],  # type: ignore[attr-defined]
    )  # fmt: skip
    assert packed.size == len(raw.value)  # type: ignore[attr-defined]
    assert task_record(packed) is packed
    other = FakeRecord(7, b"k", headers=[("trace", b"t"), ("dt_meta", b"\x08\x01")])
    assert task_record(other).headers == [("trace", b"t"), ("dt_meta", b"\x08\x01")]
    assert task_record(FakeRecord(8, b"k")).headers == ()
    assert task_record(FakeRecord(9, b"k", headers=[("dt_meta", None)])).headers == [  # type: ignore[list-item]
        ("dt_meta", None)
    ]
    # A tuple of headers (a ConsumerRecord's) packs alike; a lone other header does not.
    consumer_record = FakeRecord(10, b"k", headers=(("dt_meta", b"\x08\x02"),))  # type: ignore[arg-type]
    assert task_record(consumer_record).packed_headers == b"\x08\x02"
    lone_other = task_record(FakeRecord(11, b"k", headers=[("trace", b"\x08\x01")]))
    assert lone_other.headers == [("trace", b"\x08\x01")]
