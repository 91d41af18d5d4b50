"""The product demo (``make run``): the follow service, end to end.

1. Start the embedded broker; produce follow/unfollow events keyed by the followee (a few
   hot influencers get a large share, some in bursts of follow/unfollow taps). Run the
   follow processor (per-key lanes, per-pair compaction, retries while another writer
   locks the SQLite database) with live progress until every event is done; check the
   counts against the edges, and the edges against the events.
2. Break the counts of some users, the way bugs and lost writes do.
3. Run the Spark batch repair job in-process (``local[2]``): it compares the counts with
   the edges and sends one repair task per inconsistent user.
4. Run the repair processor until the repair tasks are done, and check again.

Exit code 0 when every count is right at the end. Takes 30-60 s on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Protocol

if __package__ in (None, ""):  # python examples/follow/demo.py: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from decaton_aio import (
    Application,
    ConsumerConfig,
    EmbeddedBroker,
    JsonSerializer,
    ProducerConfig,
    Subscription,
    TaskProducer,
    configure_logging,
)
from decaton_aio.admin import TopicAdmin
from decaton_aio.errors import ConfigError
from decaton_aio.testing import TEST_CONSUMER_SETTINGS
from examples.follow.processor import FollowProcessor, RepairProcessor, follow_app, repair_app
from examples.follow.producer import HOT_USERS, expected_edges, generate_events, produce_events
from examples.follow.store import (
    FollowStore,
    active_edges,
    corrupt_counts,
    find_inconsistencies,
    open_database,
)
from examples.follow.tasks import FOLLOW_TOPIC, REPAIR_TOPIC, FollowEvent

PARTITIONS = 3
# Fast commits and group joins, so "drained" shows up quickly.
PROPERTIES = {"decaton.commit.interval.ms": 200}


def _say(text: str = "") -> None:
    print(text, flush=True)


class _Progress:
    """One status line, redrawn in a terminal, printed every few seconds otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self._last = 0.0

    def show(self, text: str, *, final: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            print(f"\r  {text}\033[K", end="\n" if final else "", flush=True)
        elif final or now - self._last >= 2.0:
            print(f"  {text}", flush=True)
            self._last = now


def _lag(sub: Subscription) -> tuple[int, int]:
    """(pending records, lag) summed over the subscription's partitions.

    The lag of a partition is its end minus the committed offset (0 before the first
    commit of a new group, which starts at the beginning).
    """
    pending = lag = 0
    for p in sub.partitions.values():
        pending += p.pending
        if p.stats.high_watermark >= 0:
            lag += max(0, p.stats.high_watermark - max(0, p.stats.committed_offset))
    return pending, lag


async def _hold_write_lock(db: Path, seconds: float) -> None:
    """Another writer (say, a backup job) takes the write lock for a while."""

    def hold() -> None:
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            time.sleep(seconds)
            conn.execute("COMMIT")
        finally:
            conn.close()

    await asyncio.to_thread(hold)


class _Status(Protocol):
    """What :func:`_run_until` shows and waits for."""

    def finished(self) -> bool: ...

    def tick(self) -> None: ...

    def line(self, elapsed: float, pending: int, lag: int) -> str: ...


async def _run_until(sub: Subscription, status: _Status) -> float:
    """Show progress until the work is finished and nothing is pending or lagging.

    Returns:
        Seconds from the first fetched record (the group join is not processing time).
    """
    progress = _Progress()
    started: float | None = None
    settled = 0
    while True:
        await asyncio.sleep(0.25)
        status.tick()
        pending, lag = _lag(sub)
        if started is None and (pending or status.finished()):
            started = time.monotonic()
        elapsed = 0.0 if started is None else time.monotonic() - started
        settled = settled + 1 if status.finished() and pending == 0 and lag == 0 else 0
        # Twice in a row: the last commit is in.
        progress.show(status.line(elapsed, pending, lag), final=settled >= 2)
        if settled >= 2:
            return elapsed


class _FollowStatus:
    """Progress of the follow processor; a "backup job" locks the database twice."""

    LOCK_AT = (0.25, 0.6)  # shares of the events done when the lock is taken
    LOCK_S = 0.5

    def __init__(self, processor: FollowProcessor, sub: Subscription, total: int, db: Path) -> None:
        self.processor, self.sub, self.total, self.db = processor, sub, total, db
        self.locks: list[asyncio.Task[None]] = []
        self._compacted = 0

    def compacted(self) -> int:
        # Read while the partitions are assigned; the last value is kept after the stop.
        if self.sub.partitions:
            self._compacted = sum(p.stats.compactions for p in self.sub.partitions.values())
        return self._compacted

    def processed(self) -> int:
        return sum(self.processor.outcomes.values())

    def count(self) -> int:
        # Each event ends as one outcome or one compaction (a retried event only once).
        return self.processed() + self.compacted()

    def finished(self) -> bool:
        return self.count() >= self.total

    def tick(self) -> None:
        taken = len(self.locks)
        if taken < len(self.LOCK_AT) and self.count() >= self.LOCK_AT[taken] * self.total:
            self.locks.append(asyncio.create_task(_hold_write_lock(self.db, self.LOCK_S)))

    def line(self, elapsed: float, pending: int, lag: int) -> str:
        done = min(self.count(), self.total)
        rate = f"{self.processed() / elapsed:>6,.0f}" if elapsed >= 0.5 else "     -"
        return (
            f"events {done:>6,}/{self.total:,}  {rate} tasks/s  pending {pending:>5,}  "
            f"lag {lag:>6,}  compacted {self.compacted():>5,}  db-busy retries "
            f"{self.processor.busy}"
        )


class _RepairStatus:
    def __init__(self, processor: RepairProcessor, total: int) -> None:
        self.processor, self.total = processor, total

    def finished(self) -> bool:
        return self.processor.checked >= self.total

    def tick(self) -> None:
        pass

    def line(self, elapsed: float, pending: int, lag: int) -> str:
        p = self.processor
        return (
            f"repair tasks {p.checked:>3}/{self.total}  users fixed {p.fixed:>3}  "
            f"pending {pending:>3}  lag {lag:>3}"
        )


async def process_events(bootstrap: str, db: Path, events: list[FollowEvent]) -> FollowProcessor:
    """Produce the events, then run the follow processor until all are done."""
    admin = TopicAdmin(bootstrap)
    await admin.create(PARTITIONS, name=FOLLOW_TOPIC)
    await admin.create(PARTITIONS, name=REPAIR_TOPIC)
    await admin.close(delete=False)
    hot = sum(1 for e in events if e.followee in HOT_USERS)
    config = ProducerConfig(bootstrap, application_id="follow-platform")
    started = time.monotonic()
    async with TaskProducer(config, FOLLOW_TOPIC, JsonSerializer(FollowEvent)) as producer:
        await produce_events(producer, events)
    _say(
        f"produced {len(events):,} follow events in {time.monotonic() - started:.1f}s "
        f"({hot:,} of them for the {len(HOT_USERS)} hot influencers)"
    )

    store = FollowStore(db, busy_timeout_s=0.1)
    processor = FollowProcessor(store)
    app = follow_app(processor, properties=PROPERTIES)
    _say(f"processing with compaction (window 0.2 s per influencer) into {db.name}")
    async with _subscription(app, bootstrap) as sub:
        status = _FollowStatus(processor, sub, len(events), db)
        elapsed = await _run_until(sub, status)
        await asyncio.gather(*status.locks)
    await store.close()
    outcomes = processor.outcomes
    _say(
        f"  done in {elapsed:.1f}s: {outcomes['applied']:,} applied, {outcomes['unchanged']} "
        f"repeated taps (no change), {status.compacted():,} compacted away (a newer event of "
        f"the same pair followed)\n  {processor.busy} hit 'database is locked' and went through "
        f"the retry topic; {outcomes['stale']} arrived after a newer event of their pair "
        f"(ignored: newest version wins); {outcomes['duplicate']} redelivered (ignored)"
    )
    return processor


@contextlib.asynccontextmanager
async def _subscription(app: Application, bootstrap: str) -> AsyncIterator[Subscription]:
    consumer = ConsumerConfig(bootstrap, app.group, **TEST_CONSUMER_SETTINGS)
    producer = ProducerConfig(bootstrap, application_id=app.subscription_id)
    async with Subscription(app, consumer, producer=producer) as sub:
        yield sub


async def repair_users(bootstrap: str, db: Path, expected: int) -> RepairProcessor:
    """Run the repair processor until ``expected`` repair tasks are done."""
    store = FollowStore(db)
    processor = RepairProcessor(store)
    app = repair_app(processor, properties=PROPERTIES)
    async with _subscription(app, bootstrap) as sub:
        await _run_until(sub, _RepairStatus(processor, expected))
    await store.close()
    return processor


def check(db: Path, events: list[FollowEvent] | None = None) -> int:
    """Print the consistency of the counts (and of the edges, given the events)."""
    conn = open_database(db)
    try:
        if events is not None:
            edges = active_edges(conn)
            same = edges == expected_edges(events)
            _say(f"  edges match the produced events: {'yes' if same else 'NO'} ({len(edges):,})")
            if not same:
                return -1
        bad = find_inconsistencies(conn)
    finally:
        conn.close()
    _say(f"  users whose counts disagree with the edges: {len(bad)}")
    for m in bad[:3]:
        stored = (
            "no counts row"
            if m.stored_followers is None
            else f"stored {m.stored_followers}/{m.stored_following}"
        )
        _say(
            f"    user {m.user_id}: {stored}, edges say "
            f"{m.expected_followers}/{m.expected_following} (followers/following)"
        )
    return len(bad)


@contextlib.contextmanager
def _jvm_output_to(path: Path) -> Iterator[None]:
    """Send what the JVM writes to stderr to a file (the JVM inherits fd 2 at start)."""
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        sys.stderr.flush()
        os.dup2(log, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


def batch_repair(bootstrap: str, db: Path, work: Path) -> int:
    """Run the Spark batch repair job in-process; return the repair tasks sent."""
    from spark_jobs._session import local_session
    from spark_jobs.batch_repair import RepairOptions, run_repair

    log = work / "spark.log"
    started = time.monotonic()
    with _jvm_output_to(log):
        spark = local_session("follow-demo-batch-repair", "local[2]")
        spark.sparkContext.setLogLevel("ERROR")
    _say(f"  Spark {spark.version} local[2] up in {time.monotonic() - started:.1f}s")
    try:
        options = RepairOptions(bootstrap, REPAIR_TOPIC, sqlite=str(db), show=3)
        report = run_repair(spark, options)
    finally:
        spark.stop()
    for line in report.render().splitlines():
        _say(f"  {line}")
    return report.repair_tasks_sent


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when every count is right at the end."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="follow events to produce")
    parser.add_argument("--users", type=int, default=2_000, help="user ids 1..N")
    parser.add_argument("--corrupt", type=int, default=25, help="users whose counts to break")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the database and Spark log here (default: a temp dir, removed on success)",
    )
    args = parser.parse_args(argv)
    configure_logging("warning")
    started = time.monotonic()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="follow-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "follow.db"
    db.unlink(missing_ok=True)
    events = generate_events(args.events, users=args.users)

    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        _say(f"embedded broker on {bootstrap}; work dir {work}")
        _say("\n== 1. follow events -> follower/following counts in SQLite")
        asyncio.run(process_events(bootstrap, db, events))
        if check(db, events) != 0:
            _say("RESULT: FAILED (the processor left inconsistent counts)")
            return 1

        _say(f"\n== 2. break the counts of {args.corrupt} users")
        conn = open_database(db)
        broken = corrupt_counts(conn, args.corrupt, seed=11)
        conn.close()
        before = check(db)

        _say("\n== 3. Spark batch repair: compare counts with edges, emit repair tasks")
        try:
            sent = batch_repair(bootstrap, db, work)
        except ConfigError as exc:  # no Java: say how to get it
            _say(f"RESULT: FAILED, Spark cannot start: {exc}")
            return 1

        _say("\n== 4. repair processor: recount each reported user from the edges")
        repaired = asyncio.run(repair_users(bootstrap, db, sent))
        after = check(db, events)

    ok = before == len(broken) and sent == len(broken) and after == 0
    _say(
        f"\nbefore repair {before} users inconsistent, repair tasks {sent}, "
        f"fixed {repaired.fixed}, after repair {after}"
    )
    _say(f"RESULT: {'OK' if ok else 'FAILED'} in {time.monotonic() - started:.0f}s")
    if ok and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    elif not ok:
        _say(f"database and Spark log kept in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
