"""The on-disk spool: append with a shared fsync, read back in order, remove, move aside."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from decaton_aio.errors import ConfigError, ProducerError
from decaton_aio.producer import _spool as spool_module
from decaton_aio.producer._spool import Spool, SpoolEntry
from decaton_aio.producer._spool_files import (
    SpoolSummary,
    gather_for_workers,
    summarize,
    worker_spool,
)


def entry(n: int, *, key: bytes | None = b"k", topic: str = "orders") -> SpoolEntry:
    return SpoolEntry.new(
        topic,
        f"value-{n}".encode(),
        key=key,
        headers=[("dt_meta", bytes([n % 256, 0, 255])), ("dup", b"a"), ("dup", b"b")],
        timestamp_ms=1_700_000_000_000 + n,
    )


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("spool-*.jsonl"))


@pytest.fixture
async def spool(tmp_path: Path):
    opened = Spool(tmp_path / "spool")
    await opened.open()
    yield opened
    await opened.close()


async def test_append_pending_remove(spool: Spool) -> None:
    """Entries come back in append order, unchanged, until they are removed; a fully
    delivered segment is deleted."""
    written = [entry(n) for n in range(3)]
    for item in written:
        path = await spool.append(item)
        assert path.parent == spool.directory
    assert spool.size == 3

    first = await spool.pending(10)
    assert first == written
    assert await spool.pending(2) == written[:2]

    await spool.remove(first[:2])
    assert await spool.pending(10) == written[2:]
    assert not spool.is_empty()

    await spool.remove(written[2:])
    assert spool.is_empty()
    assert await spool.pending(10) == []
    assert segments(spool.directory) == []


async def test_line_schema_is_the_documented_one(spool: Spool) -> None:
    """Each line is a JSON object with the documented fields; bytes are base64."""
    item = SpoolEntry.new(
        "orders", b"\x00body", key=b"user-1", headers=[("dt_meta", b"\x01\x02")], partition=2
    )
    tombstone = SpoolEntry.new("orders", None, key=b"user-2")
    path = await spool.append(item)
    await spool.append(tombstone)

    lines = path.read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert set(first) == {
        "v",
        "id",
        "topic",
        "partition",
        "key_b64",
        "value_b64",
        "headers",
        "timestamp_ms",
        "spooled_at_ms",
    }
    assert first["v"] == 1
    assert first["id"] == item.id
    assert first["partition"] == 2
    assert base64.b64decode(first["key_b64"]) == b"user-1"
    assert base64.b64decode(first["value_b64"]) == b"\x00body"
    assert first["headers"] == [["dt_meta", base64.b64encode(b"\x01\x02").decode()]]
    assert first["timestamp_ms"] is None
    assert isinstance(first["spooled_at_ms"], int)
    assert second["value_b64"] is None
    assert item.id != tombstone.id


async def test_restart_replays_what_was_left(tmp_path: Path) -> None:
    """A spool closed (or abandoned) with undelivered entries gives them back after a
    restart, before anything appended by the new run."""
    directory = tmp_path / "spool"
    old = Spool(directory)
    await old.open()
    left = [entry(n) for n in range(5)]
    for item in left:
        await old.append(item)
    # Delivered in part before the "crash": the removal is only in memory, so a restart
    # replays the whole segment (at-least-once).
    await old.remove(await old.pending(2))
    await old.close()

    new = Spool(directory)
    await new.open()
    try:
        assert new.size == 5
        later = entry(99)
        later_path = await new.append(later)
        assert later_path not in segments(directory)[:1]
        assert await new.pending(10) == left
        await new.remove(left)
        assert await new.pending(10) == [later]
        await new.remove([later])
        assert new.is_empty()
    finally:
        await new.close()
    assert segments(directory) == []


async def test_corrupt_lines_are_moved_aside_and_the_rest_replayed(tmp_path: Path) -> None:
    """A garbled line, a line of an unknown format version and a torn last line are each
    reported with file and line, copied to the .corrupt file, and skipped."""
    directory = tmp_path / "spool"
    writer = Spool(directory)
    await writer.open()
    good = [entry(n) for n in range(4)]
    for item in good:
        path = await writer.append(item)
    await writer.close()

    lines = path.read_bytes().splitlines(keepends=True)
    future = json.loads(lines[3])
    future["v"] = 2
    garbage = b'{"v": 1, "id": "x", "topic": 5}\n'
    path.write_bytes(
        lines[0]
        + b"not json at all\n"
        + lines[1]
        + garbage
        + lines[2]
        + json.dumps(future).encode()
        + b"\n"
        + b'{"v": 1, "id": "torn'
    )

    reader = Spool(directory)
    await reader.open()
    try:
        with capture_logs() as logs:
            replayed = await reader.pending(10)
        assert replayed == good[:3]
        warnings = [log for log in logs if log["event"] == "corrupt spool line moved aside"]
        assert [w["line"] for w in warnings] == [2, 4, 6, 7]
        assert {w["file"] for w in warnings} == {str(path)}
        assert all(w["log_level"] == "warning" for w in warnings)
        aside = path.with_suffix(".corrupt").read_bytes().splitlines()
        assert aside[0] == b"not json at all"
        assert aside[1] == garbage.strip()
        assert aside[3] == b'{"v": 1, "id": "torn'

        await reader.remove(replayed)
        assert reader.is_empty()
        assert not path.exists()
        assert path.with_suffix(".corrupt").exists()
    finally:
        await reader.close()


async def test_concurrent_appends_share_one_write_and_all_land(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of appends made in the same loop turn are written and fsynced together,
    and every one of them is on disk, in call order, when its caller is answered."""
    writes: list[int] = []
    real = spool_module._write_durably

    def counting(handle, path, data):  # type: ignore[no-untyped-def]
        writes.append(data.count(b"\n"))
        return real(handle, path, data)

    monkeypatch.setattr(spool_module, "_write_durably", counting)
    items = [entry(n, key=f"k{n % 7}".encode()) for n in range(500)]
    paths = await asyncio.gather(*(spool.append(item) for item in items))

    assert writes == [500]
    assert len(set(paths)) == 1
    on_disk = paths[0].read_bytes().splitlines()
    assert [json.loads(line)["id"] for line in on_disk] == [item.id for item in items]
    assert await spool.pending(1000) == items


async def test_appends_during_a_write_join_the_next_one(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends arriving while a write runs wait for it and then share the next write."""
    writes: list[int] = []
    real = spool_module._write_durably

    def slow(handle, path, data):  # type: ignore[no-untyped-def]
        writes.append(data.count(b"\n"))
        import time

        time.sleep(0.05)
        return real(handle, path, data)

    monkeypatch.setattr(spool_module, "_write_durably", slow)
    first = asyncio.ensure_future(spool.append(entry(0)))
    await asyncio.sleep(0.01)  # the first write is running in its thread now
    rest = [spool.append_nowait(entry(n)) for n in range(1, 101)]
    await asyncio.gather(first, *rest)
    assert writes == [1, 100]
    assert len(await spool.pending(1000)) == 101


async def test_segments_rotate_and_are_deleted_once_delivered(tmp_path: Path) -> None:
    """Small segments: several files, read oldest first; each is deleted when delivered."""
    small = Spool(tmp_path / "spool", segment_bytes=600)
    await small.open()
    try:
        items = []
        for n in range(12):
            items.append(entry(n))
            await small.append(items[-1])
        assert len(segments(small.directory)) > 2

        replayed: list[SpoolEntry] = []
        while batch := await small.pending(5):
            replayed += batch
            await small.remove(batch)
        assert replayed == items
        assert segments(small.directory) == []
        assert small.is_empty()
    finally:
        await small.close()


async def test_appends_after_reading_started_go_to_a_new_segment(spool: Spool) -> None:
    """Reading closes the segment being written; later appends are read after it."""
    await spool.append(entry(0))
    assert [e.value for e in await spool.pending(10)] == [b"value-0"]
    await spool.append(entry(1))
    assert [e.value for e in await spool.pending(10)] == [b"value-0"]
    await spool.remove(await spool.pending(10))
    assert [e.value for e in await spool.pending(10)] == [b"value-1"]
    assert len(segments(spool.directory)) == 1


async def test_rejected_entries_are_moved_aside_with_the_error(spool: Spool) -> None:
    """An entry the broker refuses for good goes to .rejected, with the reason."""
    items = [entry(n) for n in range(3)]
    for item in items:
        path = await spool.append(item)
    await spool.pending(10)
    await spool.reject([items[1]], "MessageSizeTooLargeError()")
    assert await spool.pending(10) == [items[0], items[2]]
    (line,) = path.with_suffix(".rejected").read_text().splitlines()
    rejected = json.loads(line)
    assert rejected["id"] == items[1].id
    assert rejected["error"] == "MessageSizeTooLargeError()"


async def test_a_rejected_file_renamed_to_a_segment_is_delivered_by_the_next_start(
    tmp_path: Path,
) -> None:
    """What the producer docs tell an operator once a missing topic exists: the
    .rejected file, renamed to an unused segment name, is replayed (its error field
    ignored)."""
    directory = tmp_path / "spool"
    spool = Spool(directory)
    await spool.open()
    items = [entry(n) for n in range(2)]
    for item in items:
        path = await spool.append(item)
    await spool.reject(await spool.pending(10), "MissingTopicError('no topic')")
    await spool.close()
    assert segments(directory) == []
    path.with_suffix(".rejected").rename(directory / "spool-000000000900.jsonl")

    again = Spool(directory)
    await again.open()
    try:
        assert await delivered(again) == items
    finally:
        await again.close()


async def test_a_failed_write_fails_its_callers_and_starts_a_new_segment(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write error answers the waiting appends with ProducerError; the next append goes
    to a fresh segment, so it can never be glued to a torn line."""
    real = spool_module._write_durably
    before = await spool.append(entry(0))

    def torn(handle, path, data):  # type: ignore[no-untyped-def]
        handle.write(data[:10])
        handle.flush()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool_module, "_write_durably", torn)
    with pytest.raises(ProducerError, match="No space left"):
        await spool.append(entry(1))
    monkeypatch.setattr(spool_module, "_write_durably", real)
    after = await spool.append(entry(2))
    assert after != before

    with capture_logs():
        replayed = await spool.pending(10)
    assert [e.value for e in replayed] == [b"value-0"]
    await spool.remove(replayed)
    assert [e.value for e in await spool.pending(10)] == [b"value-2"]


async def test_one_spool_per_directory(spool: Spool) -> None:
    """A second spool on a directory in use is refused with a clear message."""
    other = Spool(spool.directory)
    with pytest.raises(ConfigError, match="in use by another producer"):
        await other.open()


async def test_append_needs_an_open_spool(tmp_path: Path) -> None:
    """Appending to a spool that is not open says so."""
    with pytest.raises(ProducerError, match="not open"):
        await Spool(tmp_path).append(entry(0))


async def test_a_summary_counts_the_entries_and_dates_the_oldest(tmp_path: Path) -> None:
    """summarize reads a spool without its lock: entries of every segment, and when the
    first readable one was spooled; a missing or empty directory holds nothing."""
    directory = tmp_path / "spool"
    assert summarize(directory) == SpoolSummary(0, None)
    opened = Spool(directory)
    await opened.open()
    try:
        assert summarize(directory) == SpoolSummary(0, None)
        items = [entry(n) for n in range(3)]
        for item in items:
            await opened.append(item)
        assert summarize(directory) == SpoolSummary(3, items[0].spooled_at_ms)
    finally:
        await opened.close()
    (first,) = segments(directory)
    first.write_bytes(b"not json\n" + first.read_bytes())  # a corrupt first line
    assert summarize(directory) == SpoolSummary(4, items[0].spooled_at_ms)


async def delivered(spool: Spool) -> list[SpoolEntry]:
    """Every entry of ``spool``, in the order a replay delivers them (each removed)."""
    found: list[SpoolEntry] = []
    while batch := await spool.pending(100):
        found += batch
        await spool.remove(batch)
    return found


async def left_in(directory: Path, items: list[SpoolEntry]) -> None:
    """A spool on ``directory`` closed with ``items`` undelivered (a run that ended)."""
    spool = Spool(directory)
    await spool.open()
    for item in items:
        await spool.append(item)
    await spool.close()


async def test_a_spool_takes_over_the_spools_its_workers_left(tmp_path: Path) -> None:
    """A run of one process on D delivers what ``run --workers`` left in D/worker-<n>:
    after its own entries, worker by worker; a worker spool another process holds stays
    with it, and the summary counts what would be taken over."""
    directory = tmp_path / "spool"
    own, second, tenth, held = (
        [entry(n, topic=t) for n in range(first, first + 2)]
        for first, t in ((0, "own"), (10, "second"), (20, "tenth"), (30, "held"))
    )
    await left_in(directory, own)
    await left_in(directory / "worker-10", tenth)
    await left_in(directory / "worker-2", second)
    running = Spool(directory / "worker-3")
    await running.open()
    for item in held:
        await running.append(item)
    assert summarize(directory) == SpoolSummary(6, own[0].spooled_at_ms)

    opened = Spool(directory)
    await opened.open()
    try:
        assert opened.size == 6
        assert segments(directory / "worker-2") == segments(directory / "worker-10") == []
        assert await delivered(opened) == [*own, *second, *tenth]
        assert opened.is_empty()
    finally:
        await opened.close()
        await running.close()
    assert summarize(directory) == SpoolSummary(2, held[0].spooled_at_ms)
    assert summarize(directory / "worker-3") == SpoolSummary(2, held[0].spooled_at_ms)


async def test_worker_1_takes_over_what_no_worker_of_the_run_would_deliver(
    tmp_path: Path,
) -> None:
    """Before ``run --workers 2`` starts, worker 1's spool takes D's own segments (a run of
    one process) and those of D/worker-3 (a run of more workers), after what it had;
    worker 2's spool is its own."""
    directory = tmp_path / "spool"
    mine, own, third, second = (
        [entry(n) for n in range(first, first + 2)] for first in (0, 10, 20, 30)
    )
    await left_in(directory, own)  # first: a spool on D would take over D/worker-1's
    await left_in(directory / "worker-1", mine)
    await left_in(directory / "worker-3", third)
    await left_in(directory / "worker-2", second)

    assert gather_for_workers(directory, 2) == (4, [])
    assert segments(directory) == segments(directory / "worker-3") == []
    first = Spool(worker_spool(directory, 1))
    await first.open()
    try:
        assert await delivered(first) == [*mine, *own, *third]
    finally:
        await first.close()
    assert summarize(directory / "worker-2") == SpoolSummary(2, second[0].spooled_at_ms)
    # Nothing left to hand over: a second start moves nothing.
    assert gather_for_workers(directory, 2) == (0, [])
