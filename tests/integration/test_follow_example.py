"""The follow example as a process: kill -9 mid-stream, restart, and the counts are right.

The processor runs as ``python -m decaton_aio run examples.follow.processor:app`` with the
database file in ``$FOLLOW_DB``. Killing it loses its uncommitted offsets, so the restart
redelivers events already applied; the ``applied_events`` table makes those no-ops, and
the counts must equal the edges, which must equal the newest event of every pair. The
application's lifespan hooks open the store at startup and close it after the drain.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import JsonSerializer
from decaton_aio.offsets import group_positions
from decaton_aio.testing import BrokerHandle
from examples.follow.producer import expected_edges, generate_events, produce_events
from examples.follow.store import active_edges, find_inconsistencies, open_database
from examples.follow.tasks import FollowEvent

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def start_example(
    broker: BrokerHandle,
    app: str,
    topic: str,
    group: str,
    log: Path,
    env: dict[str, str],
    *extra: str,
    log_level: str = "warning",
) -> asyncio.subprocess.Process:
    """Start an example's ``app`` under ``python -m decaton_aio run`` as its own process,
    with ``env`` added to the environment, logging JSON lines to ``log``."""
    argv = [sys.executable, "-m", "decaton_aio", "--log-format", "json", "--log-level"]
    argv += [log_level, "run", app, "--bootstrap-servers", broker.bootstrap_servers]
    argv += ["--topic", topic, "--group", group]
    argv += ["--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500", *extra]
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out
        )


async def start_processor(
    broker: BrokerHandle, topic: str, group: str, db: Path, log: Path, *extra: str
) -> asyncio.subprocess.Process:
    """Start the follow processor as its own process, logging to ``log``."""
    app = "examples.follow.processor:app"
    return await start_example(broker, app, topic, group, log, {"FOLLOW_DB": str(db)}, *extra)


def applied(db: Path) -> int:
    """Events applied so far (0 before the database exists)."""
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (count,) = conn.execute("SELECT COUNT(*) FROM applied_events").fetchone()
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0
    finally:
        conn.close()
    return int(count)


async def eventually(predicate: Any, what: str, timeout_s: float = 60.0) -> None:
    """Poll ``await predicate()`` until it is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def test_sigkill_and_restart_end_with_correct_counts(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """Given 6,000 events with hot influencers and bursts, when the processor is killed
    with SIGKILL after about a third of them and restarted, then once the group has
    committed everything, the edges are the newest state of every pair and every count
    matches the edges."""
    topic = await topic_factory(partitions=3)
    events = generate_events(6000, users=400, seed=21)
    producer = await task_producer(topic, JsonSerializer(FollowEvent))
    await produce_events(producer, events)
    db, log = tmp_path / "follow.db", tmp_path / "processor.log"
    group = f"follow-{uuid.uuid4().hex[:8]}"
    bootstrap = kafka_broker.bootstrap_servers

    # Throttled, so the kill lands mid-stream.
    slow = ("--property", "decaton.processing.rate.per.partition=300")
    first = await start_processor(kafka_broker, topic, group, db, log, *slow)
    try:
        await eventually(lambda: asyncio.to_thread(lambda: applied(db) >= 2000), "2000 events")
    finally:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    assert first.returncode == -signal.SIGKILL
    at_kill = applied(db)
    committed = sum(p.committed or 0 for p in await group_positions(bootstrap, group, topic))
    assert committed < len(events)  # work was left: the restart redelivers from there

    async def drained() -> bool:
        for name in (topic, f"{topic}-retry"):
            if any(p.lag for p in await group_positions(bootstrap, group, name)):
                return False
        return True

    second = await start_processor(kafka_broker, topic, group, db, log)
    try:
        await eventually(drained, "the group to commit every event")
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.wait(), 30)
    assert second.returncode == 0, log.read_text()[-3000:]
    # The shutdown hook closed the store after the drain: closing the last connection
    # folds the write-ahead log into the database and removes it (SIGKILL leaves it).
    assert not db.with_name(db.name + "-wal").exists()

    assert applied(db) > at_kill
    conn = open_database(db)
    try:
        assert active_edges(conn) == expected_edges(events)
        assert find_inconsistencies(conn) == []
    finally:
        conn.close()
