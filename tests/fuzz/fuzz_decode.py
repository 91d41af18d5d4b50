"""Coverage-guided fuzzing (atheris) of every decode path a record goes through.

Targets:
    metadata  the ``dt_meta`` header: the consume path's native parser and the strict
              decoder agree on every input (both accept with the same values, or both
              reject), and reading it raises nothing but ``DecodeError``.
    bodies    every serializer: any bytes decode or raise ``DecodeError``, nothing else.

Run by ``make fuzz`` (``FUZZ_SECONDS`` per target); a finding is written as a crash file
that the target reproduces when given as its argument. The hypothesis tests in
``tests/unit/test_fuzz.py`` and ``tests/unit/test_metadata.py`` run in ``make test``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports():
    import msgspec

    from decaton_aio.errors import DecodeError
    from decaton_aio.metadata import (
        METADATA_HEADER,
        TaskMetadata,
        decode_metadata,
        metadata_from_headers,
        native_parse,
    )
    from decaton_aio.serializers import (
        BytesSerializer,
        JsonSerializer,
        MsgpackSerializer,
        ProtobufSerializer,
    )

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.unit.protobuf_helpers import legacy_task_class, order_task_class


class Order(msgspec.Struct, frozen=True):
    order_id: str
    amount: int


SERIALIZERS: list[Any] = [
    JsonSerializer(Order),
    MsgpackSerializer(Order),
    ProtobufSerializer(order_task_class()),
    ProtobufSerializer(legacy_task_class()),
    BytesSerializer(),
]


def _strict(data: bytes) -> TaskMetadata | None:
    try:
        return decode_metadata(data)
    except DecodeError:
        return None


def _native(data: bytes) -> tuple[int, str, str, int, int] | None:
    assert native_parse is not None, "the protobuf runtime's C implementation is missing"
    try:
        m = native_parse(data)
    except Exception:
        return None
    return (
        m.timestamp_millis,
        m.source_application_id,
        m.source_instance_id,
        m.retry_count,
        m.scheduled_time_millis,
    )


def metadata(data: bytes) -> None:
    strict, native = _strict(data), _native(data)
    if strict is None:
        assert native is None, f"native parser accepts what the strict one rejects: {data!r}"
    else:
        as_tuple = (
            strict.timestamp_ms,
            strict.source_application_id,
            strict.source_instance_id,
            strict.retry_count,
            strict.scheduled_time_ms,
        )
        assert native == as_tuple, f"decoders disagree on {data!r}: {native} != {as_tuple}"
    with contextlib.suppress(DecodeError):
        metadata_from_headers([(METADATA_HEADER, data)], 0)


def bodies(data: bytes) -> None:
    for serializer in SERIALIZERS:
        with contextlib.suppress(DecodeError):
            serializer.decode(data)


TARGETS: dict[str, Callable[[bytes], None]] = {"metadata": metadata, "bodies": bodies}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: fuzz_decode.py {{{','.join(TARGETS)}}} [libFuzzer options]")
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
