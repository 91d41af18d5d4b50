"""The checkpoint's wire form: which offsets above the committed one are already done.

A `Checkpoint` is what `WatermarkTracker.export_completed()` returns: a base
offset (the committed watermark) and a bitmap whose bit ``i`` says offset ``base + i``
needs no processing. This module owns its compact encoding and the rule for trusting one
that was read back; it knows nothing about Kafka.

Encoding (all integers unsigned LEB128 varints):

```text
0xDC, version 1, kind, varint(base), varint(bits), payload, crc32 (4 bytes, big endian)
```

``bits`` is the bitmap's length in bits. ``kind`` names the payload, the smallest of:

- ``RUNS``: the lengths of the alternating runs of clear and set bits (the first run is
  of clear bits), each a varint, zlib-compressed: a few bytes for a long window with few
  holes;
- ``BITMAP``: the bitmap, zlib-compressed: about one bit per offset for random holes.

The CRC covers everything before it, so a truncated or altered checkpoint is rejected
instead of skipping the wrong records. `to_text()` / `from_text()` wrap the bytes
in base64 behind a ``dc1:`` prefix, for the commit metadata (a UTF-8 string).

Trust (`usable()`): a checkpoint only says something about the committed offset it was
saved with. One whose base differs from the committed offset read back (a commit that
failed after the checkpoint was written, an offset reset by an operator) or whose first
bit is set (the watermark itself is never done) is ignored, so a checkpoint can never make
the consumer skip a record at or below what the group committed, nor one it did not
finish.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from decaton_aio.errors import DecatonError

__all__ = [
    "MAX_CHECKPOINT_BITS",
    "TEXT_PREFIX",
    "Checkpoint",
    "CorruptCheckpointError",
    "decode",
    "encode",
    "from_text",
    "to_text",
    "untrusted_reason",
    "usable",
]

_MAGIC = 0xDC
_VERSION = 1
_RUNS = 0
_BITMAP = 1
_ZLIB_LEVEL = 6

#: The widest window a checkpoint may describe (a larger claim is corrupt): bounds the
#: memory a decoder spends on untrusted input.
MAX_CHECKPOINT_BITS = 1 << 31

#: What a checkpoint in the commit metadata starts with.
TEXT_PREFIX = "dc1:"


class CorruptCheckpointError(DecatonError):
    """Raised when stored checkpoint bytes cannot be decoded (wrong format, checksum)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Offsets done above a committed offset.

    Attributes:
        base: the committed offset the checkpoint belongs to (its first bit's offset).
        bitmap: packed bits, most significant first; trailing clear bits cut.
    """

    base: int
    bitmap: bytes

    @property
    def empty(self) -> bool:
        """Whether no offset above the base is marked."""
        return not any(self.bitmap)

    def offsets(self) -> npt.NDArray[np.int64]:
        """The marked offsets, increasing."""
        bits = np.unpackbits(np.frombuffer(self.bitmap, dtype=np.uint8))
        return np.flatnonzero(bits).astype(np.int64) + self.base


# ------------------------------------------------------------------------- varints


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise CorruptCheckpointError("a number is cut short")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varints(values: npt.NDArray[np.uint64]) -> bytes:
    # Vectorized LEB128: every value's bytes at once, 7 bits each.
    if values.size == 0:
        return b""
    sizes = np.ones(values.size, dtype=np.int64)
    for k in range(1, 10):
        sizes += values >= np.uint64(1 << (7 * k))
    ends = np.cumsum(sizes)
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    starts = ends - sizes
    for k in range(int(sizes.max())):
        has = sizes > k
        byte = (values[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (sizes[has] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[has] + k] = (byte | more).astype(np.uint8)
    return out.tobytes()


def _read_varints(data: bytes) -> npt.NDArray[np.uint64]:
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size == 0:
        return np.zeros(0, dtype=np.uint64)
    last = raw < 0x80
    if not last[-1]:
        raise CorruptCheckpointError("the run lengths are cut short")
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if int((ends - starts).max()) > 8:
        raise CorruptCheckpointError("a run length is too large")
    group = np.repeat(np.arange(ends.size), ends - starts + 1)
    shift = (np.arange(raw.size) - starts[group]).astype(np.uint64) * np.uint64(7)
    parts = (raw & 0x7F).astype(np.uint64) << shift
    values = np.zeros(ends.size, dtype=np.uint64)
    np.add.at(values, group, parts)
    return values


# ------------------------------------------------------------------------ encoding


def _runs(bits: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
    # Alternating run lengths, clear bits first (a leading run of length 0 if set first).
    changes = np.flatnonzero(np.diff(bits)) + 1
    bounds = np.concatenate(([0], changes, [bits.size]))
    lengths = np.diff(bounds).astype(np.uint64)
    if bits[0]:
        lengths = np.concatenate((np.zeros(1, dtype=np.uint64), lengths))
    return lengths


def encode(checkpoint: Checkpoint) -> bytes:
    """The compact bytes of a checkpoint (see the module docstring).

    Raises:
        ValueError: the base is negative or the bitmap is wider than
            `MAX_CHECKPOINT_BITS`.
    """
    if checkpoint.base < 0:
        raise ValueError(f"offsets are non-negative, got {checkpoint.base}")
    nbits = len(checkpoint.bitmap) * 8
    if nbits > MAX_CHECKPOINT_BITS:
        raise ValueError(f"a checkpoint covers at most {MAX_CHECKPOINT_BITS} offsets")
    kind, payload = _BITMAP, b""
    if nbits:
        bits = np.unpackbits(np.frombuffer(checkpoint.bitmap, dtype=np.uint8))
        kind, payload = _BITMAP, zlib.compress(checkpoint.bitmap, _ZLIB_LEVEL)
        lengths = _runs(bits)
        if lengths.size < len(payload):  # else at least a byte per run: cannot be smaller
            runs = zlib.compress(_varints(lengths), _ZLIB_LEVEL)
            if len(runs) <= len(payload):
                kind, payload = _RUNS, runs
    head = bytes((_MAGIC, _VERSION, kind)) + _varint(checkpoint.base) + _varint(nbits)
    body = head + payload
    return body + zlib.crc32(body).to_bytes(4, "big")


def decode(data: bytes) -> Checkpoint:
    """Read bytes made by `encode()`.

    Raises:
        CorruptCheckpointError: the bytes are not a checkpoint of this version, or were
            altered or cut.
    """
    if len(data) < 9 or data[0] != _MAGIC:
        raise CorruptCheckpointError("not a checkpoint")
    if data[1] != _VERSION:
        raise CorruptCheckpointError(f"unknown checkpoint version {data[1]}")
    body, crc = data[:-4], data[-4:]
    if zlib.crc32(body).to_bytes(4, "big") != crc:
        raise CorruptCheckpointError("checksum mismatch")
    kind = body[2]
    base, pos = _read_varint(body, 3)
    nbits, pos = _read_varint(body, pos)
    if nbits % 8 or nbits > MAX_CHECKPOINT_BITS:
        raise CorruptCheckpointError(f"impossible width {nbits}")
    payload = _inflate(body[pos:], nbits // 8 if kind == _BITMAP else 5 * (nbits + 1))
    if kind == _BITMAP:
        if len(payload) != nbits // 8:
            raise CorruptCheckpointError("the bitmap's length does not match")
        return Checkpoint(base, payload)
    if kind != _RUNS:
        raise CorruptCheckpointError(f"unknown payload kind {kind}")
    lengths = _read_varints(payload)
    if (int(lengths.sum(dtype=np.uint64)) if lengths.size else 0) != nbits:
        raise CorruptCheckpointError("the runs do not cover the width")
    values = np.zeros(lengths.size, dtype=np.uint8)
    values[1::2] = 1
    bits = np.repeat(values, lengths.astype(np.int64))
    return Checkpoint(base, np.packbits(bits).tobytes())


def _inflate(data: bytes, limit: int) -> bytes:
    if not data:
        return b""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise CorruptCheckpointError(f"cannot inflate: {exc}") from None
    if len(out) > limit or not inflater.eof or inflater.unused_data:
        raise CorruptCheckpointError("the payload does not match its width")
    return out


def to_text(data: bytes) -> str:
    """The commit-metadata form of encoded checkpoint bytes."""
    return TEXT_PREFIX + base64.b64encode(data).decode("ascii")


def from_text(text: str) -> Checkpoint:
    """Decode a checkpoint from the commit metadata.

    Raises:
        CorruptCheckpointError: the text is not one made by `to_text()`.
    """
    if not text.startswith(TEXT_PREFIX):
        raise CorruptCheckpointError("not a checkpoint")
    try:
        raw = base64.b64decode(text[len(TEXT_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise CorruptCheckpointError("not base64") from None
    return decode(raw)


# --------------------------------------------------------------------------- trust


def untrusted_reason(checkpoint: Checkpoint, committed: int | None) -> str | None:
    """Why ``checkpoint`` must not be used with the group's ``committed`` offset, or
    ``None`` when it may be."""
    if committed is None:
        return "the group has no committed offset"
    if checkpoint.base != committed:
        return f"it belongs to offset {checkpoint.base}, the group committed {committed}"
    if checkpoint.bitmap and checkpoint.bitmap[0] & 0x80:
        return "it marks the committed offset itself as done"
    return None


def usable(checkpoint: Checkpoint | None, committed: int | None) -> Checkpoint | None:
    """The checkpoint to import for a partition whose group committed ``committed``:
    ``checkpoint`` itself when `untrusted_reason()` finds nothing, else ``None``."""
    if checkpoint is None or untrusted_reason(checkpoint, committed) is not None:
        return None
    return checkpoint
