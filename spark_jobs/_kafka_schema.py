"""The rows of a ``decaton_kafka`` read: the fixed schema, and Arrow batches of records.

:data:`SCHEMA_DDL` is the schema Spark sees. :data:`ARROW_SCHEMA` is the same in Arrow
types, in which :func:`to_arrow` builds the batches a Spark task yields; :data:`SPARK_TYPES`
spells each field as Spark's ``simpleString()`` does, to check a schema without a JVM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa

__all__ = ["ARROW_SCHEMA", "SCHEMA_DDL", "SPARK_TYPES", "to_arrow"]

SCHEMA_DDL: Final = (
    "topic string, partition int, offset long, timestamp long, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>"
)
"""The schema of a read, as Spark DDL."""

ARROW_SCHEMA: Final = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers",
            pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
        ),
    ]
)
# The schema as Spark's simpleString() spells each field's type.
SPARK_TYPES: Final = [
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "bigint"),
    ("key", "binary"),
    ("value", "binary"),
    ("headers", "array<struct<key:string,value:binary>>"),
]
_HEADER_TYPE: Final = ARROW_SCHEMA.field("headers").type.value_type


def to_arrow(topic: str, partition: int, records: Sequence[Any]) -> pa.RecordBatch:
    """Build one Arrow batch of rows in :data:`SCHEMA_DDL` order from aiokafka records."""
    n = len(records)
    list_offsets = [0]
    header_keys: list[str] = []
    header_values: list[bytes | None] = []
    for record in records:
        for key, value in record.headers:
            header_keys.append(key)
            header_values.append(value)
        list_offsets.append(len(header_keys))
    headers = pa.ListArray.from_arrays(
        pa.array(list_offsets, pa.int32()),
        pa.StructArray.from_arrays(
            [pa.array(header_keys, pa.string()), pa.array(header_values, pa.binary())],
            fields=list(_HEADER_TYPE),
        ),
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array([r.offset for r in records], pa.int64()),
            pa.array([r.timestamp for r in records], pa.int64()),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            headers,
        ],
        schema=ARROW_SCHEMA,
    )
