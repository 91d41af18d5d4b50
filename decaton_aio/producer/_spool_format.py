"""The spool's line format: one `SpoolEntry` per line, and reading lines back.

`decaton_aio.producer._spool` keeps these lines in segment files; this module owns what a line
holds, how an entry becomes a line (`encode_line()`, `encode_rejected_line()`), and
how the lines of a file become entries again, setting aside the ones that cannot be read
(`parse_lines()`). It does no I/O.

Line schema: one JSON object per line, UTF-8, ``\\n``-terminated; bytes are standard
base64 with padding; unknown fields are ignored when reading:

```text
{"v": 1,                      format version; other versions are treated as corrupt
 "id": "5f0c...",             unique entry id (uuid4 hex)
 "topic": "orders",
 "partition": null,           the requested partition; null: chosen by key at replay
 "key_b64": "dXNlci0x",       null for a record without a key
 "value_b64": "eyJ...",       null for a tombstone
 "headers": [["dt_meta", "CgQI..."]],   [name, base64 value] pairs, in order
 "timestamp_ms": 1700000000123,         the record's CreateTime (null: replay time)
 "spooled_at_ms": 1700000000456}
```

``*.rejected`` lines use the same schema plus ``"error"``. The Spark backfill job reads
both kinds of file.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

__all__ = [
    "SPOOL_FORMAT_VERSION",
    "CorruptLine",
    "SpoolEntry",
    "encode_line",
    "encode_rejected_line",
    "parse_lines",
]

SPOOL_FORMAT_VERSION: Final = 1
"""The ``v`` written in every spool line."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class SpoolEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One spooled record, exactly as it is written to a spool line.

    Attributes:
        id: unique id of the entry (uuid4 hex).
        topic: the destination topic.
        partition: the requested partition; ``None`` lets the partitioner pick by key.
        key: the record key (``key_b64`` on disk).
        value: the record value (``value_b64`` on disk); ``None`` for a tombstone.
        headers: ``(name, value)`` pairs, in order.
        timestamp_ms: the record timestamp; ``None`` lets the client stamp it at replay.
        spooled_at_ms: when the entry was created, in epoch milliseconds.
        v: the line format version.
    """

    v: int = SPOOL_FORMAT_VERSION
    id: str
    topic: str
    partition: int | None
    key: bytes | None = msgspec.field(name="key_b64")
    value: bytes | None = msgspec.field(name="value_b64")
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int | None
    spooled_at_ms: int

    @classmethod
    def new(
        cls,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> SpoolEntry:
        """Make an entry with a fresh id, stamped with the current time.

        Args:
            topic: the destination topic.
            value: the record value.
            key: the record key.
            headers: the record headers.
            partition: an explicit partition, or ``None``.
            timestamp_ms: the record timestamp, or ``None``.

        Returns:
            The new entry.
        """
        return cls(
            id=uuid.uuid4().hex,
            topic=topic,
            partition=partition,
            key=key,
            value=value,
            headers=tuple((name, bytes(data)) for name, data in headers),
            timestamp_ms=timestamp_ms,
            spooled_at_ms=_now_ms(),
        )


class _RejectedEntry(SpoolEntry, frozen=True, kw_only=True):
    """A spool line moved to ``*.rejected``: the entry plus why the broker refused it."""

    error: str


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SpoolEntry)


def encode_line(entry: SpoolEntry) -> bytes:
    """The spool line of ``entry``, ending in ``\\n``."""
    return _encoder.encode(entry) + b"\n"


def encode_rejected_line(entry: SpoolEntry, error: str) -> bytes:
    """The ``*.rejected`` line of ``entry``: its spool line plus ``"error"``."""
    return _encoder.encode(_RejectedEntry(**msgspec.structs.asdict(entry), error=error)) + b"\n"


@dataclass(frozen=True, slots=True)
class CorruptLine:
    """A line that could not be read: its number in the file, its bytes, and why."""

    number: int
    raw: bytes
    reason: str


def parse_lines(data: bytes) -> tuple[list[SpoolEntry], list[CorruptLine]]:
    """The entries of a file's content, in order, and the lines that could not be read."""
    entries: list[SpoolEntry] = []
    corrupt: list[CorruptLine] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            entry = _decoder.decode(raw)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            corrupt.append(CorruptLine(number, raw, str(exc)))
            continue
        if entry.v != SPOOL_FORMAT_VERSION:
            corrupt.append(CorruptLine(number, raw, f"unsupported format version {entry.v}"))
            continue
        entries.append(entry)
    return entries, corrupt
