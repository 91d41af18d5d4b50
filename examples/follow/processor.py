"""The follow service's processors: follow counts with compaction and retries, and repairs.

This module owns the two processors of the example and the applications that run them:

- :class:`FollowProcessor` applies follow/unfollow events to SQLite (one transaction per
  event, see :mod:`examples.follow.store`). It runs behind a
  :class:`~decaton_aio.compaction.CompactingProcessor`: within a short window, events of
  one influencer (one key) that set the *same* follower/followee pair are compacted to the
  newest one. A compactor keeps one of two tasks and completes the other unprocessed, so
  it is only correct when the kept task makes the dropped one redundant: the newest event
  of a pair does (it alone decides the pair's edge), an event of another pair does not.
  Summing +1/-1 across events would need a merged task carrying several event ids;
  a crash after the dropped offsets were committed would then lose their effect.
- :class:`RepairProcessor` recounts one user from the edge table when a repair task
  arrives (written by ``spark_jobs.batch_repair``).

A busy or locked database (``sqlite3.OperationalError: database is locked``) is not a
failure: the processor asks for a retry (``ctx.retry()``), the task goes to the retry
topic with backoff, and after ``max_attempts`` to the dead letter topic, from which the
retry backfill job can send it again.

Run them as processes (the database file comes from ``$FOLLOW_DB``, ``follow.db`` by
default); ``run`` opens the database before consuming and closes it after the last task
drained (the applications' ``on_startup`` and ``on_shutdown`` hooks)::

    FOLLOW_DB=/tmp/follow.db python -m decaton_aio run examples.follow.processor:app \\
        --bootstrap-servers localhost:9092
    FOLLOW_DB=/tmp/follow.db python -m decaton_aio run examples.follow.processor:repair \\
        --bootstrap-servers localhost:9092
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Final

from decaton_aio import Application, JsonSerializer, ProcessingContext
from decaton_aio.app import LifespanHook
from decaton_aio.backoff import RetryPolicy
from decaton_aio.compaction import CompactedTask, CompactingProcessor, CompactionChoice
from decaton_aio.retry import RetryConfig
from examples.follow.store import FollowStore, TransientStoreError
from examples.follow.tasks import FOLLOW_TOPIC, REPAIR_TOPIC, FollowEvent, RepairTask

__all__ = [
    "DB_ENV_VAR",
    "DEFAULT_RETRY",
    "DEFAULT_WINDOW_S",
    "FollowProcessor",
    "RepairProcessor",
    "follow_app",
    "repair_app",
    "same_pair_latest",
]

DB_ENV_VAR: Final = "FOLLOW_DB"
"""Names the database file of the module-level ``app`` and ``repair``."""

DEFAULT_WINDOW_S: Final = 0.2
"""How long an influencer's event waits for newer events of the same pair."""

DEFAULT_RETRY: Final = RetryConfig(
    RetryPolicy(max_attempts=10, backoff_base_ms=100, backoff_max_ms=2000, jitter=0.5),
    mode="queue",  # compaction completes tasks later; only queue retries can follow them
)
"""Retries for a busy database: ten attempts over a few seconds, then the dead letters."""


def same_pair_latest(
    left: CompactedTask[FollowEvent], right: CompactedTask[FollowEvent]
) -> CompactionChoice:
    """The compactor: of two events of the same pair keep the newer; others both run."""
    if left.task.pair != right.task.pair:
        return CompactionChoice.NO_COMPACTION
    if right.task.order >= left.task.order:
        return CompactionChoice.PICK_RIGHT
    return CompactionChoice.PICK_LEFT


class FollowProcessor:
    """Applies follow events to the store; counts what happened to each.

    Attributes:
        store: the database.
        outcomes: events per :class:`~examples.follow.store.ApplyOutcome` value.
        busy: events sent to the retry topic because the database was busy.
    """

    def __init__(self, store: FollowStore) -> None:
        self.store = store
        self.outcomes: Counter[str] = Counter()
        self.busy = 0

    async def __call__(self, ctx: ProcessingContext, event: FollowEvent) -> None:
        """Apply one event; a busy database asks for a retry instead of failing."""
        try:
            outcome = await self.store.apply(event)
        except TransientStoreError as exc:
            self.busy += 1
            ctx.logger.info("database busy: retrying the event", error=str(exc))
            ctx.retry()
            return
        self.outcomes[outcome.value] += 1


class RepairProcessor:
    """Recounts a user from the edges when a repair task arrives.

    Attributes:
        store: the database.
        checked: repair tasks processed.
        fixed: users whose stored counts were wrong when their task ran.
        busy: tasks sent to the retry topic because the database was busy.
    """

    def __init__(self, store: FollowStore) -> None:
        self.store = store
        self.checked = 0
        self.fixed = 0
        self.busy = 0

    async def __call__(self, ctx: ProcessingContext, task: RepairTask) -> None:
        """Recount ``task.user_id``; a busy database asks for a retry."""
        try:
            result = await self.store.recount(task.user_id)
        except TransientStoreError as exc:
            self.busy += 1
            ctx.logger.info("database busy: retrying the repair", error=str(exc))
            ctx.retry()
            return
        self.checked += 1
        if result.changed:
            self.fixed += 1
            ctx.logger.info("counts repaired", before=result.before, after=result.after)


def follow_app(
    processor: FollowProcessor,
    *,
    topic: str = FOLLOW_TOPIC,
    window_s: float = DEFAULT_WINDOW_S,
    retry: RetryConfig = DEFAULT_RETRY,
    properties: dict[str, Any] | None = None,
    manage_store: bool = False,
) -> Application:
    """The follow-count application: compaction in front of ``processor``.

    Args:
        processor: applies the events.
        topic: the event topic.
        window_s: the compaction window per key.
        retry: how events hit by a busy database are retried.
        properties: runtime properties (e.g. ``decaton.partition.concurrency``).
        manage_store: ``run`` opens the processor's store before consuming and closes it
            after draining (its lifespan hooks); otherwise the caller does.
    """
    return Application(
        CompactingProcessor(processor, same_pair_latest, window_s=window_s),
        topics=(topic,),
        group_id="follow-counter",
        subscription_id="follow-counter",
        serializer=JsonSerializer(FollowEvent),
        retry=retry,
        properties=properties or {},
        **_lifespan(processor.store, manage_store),
    )


def repair_app(
    processor: RepairProcessor,
    *,
    topic: str = REPAIR_TOPIC,
    retry: RetryConfig = DEFAULT_RETRY,
    properties: dict[str, Any] | None = None,
    manage_store: bool = False,
) -> Application:
    """The repair application: one recount per repair task (arguments as :func:`follow_app`)."""
    return Application(
        processor,
        topics=(topic,),
        group_id="follow-repair",
        subscription_id="follow-repair",
        serializer=JsonSerializer(RepairTask),
        retry=retry,
        properties=properties or {},
        **_lifespan(processor.store, manage_store),
    )


def _lifespan(store: FollowStore, manage: bool) -> dict[str, LifespanHook]:
    return {"on_startup": store.open, "on_shutdown": store.close} if manage else {}


_apps: dict[str, Application] = {}


def __getattr__(name: str) -> Application:
    # `python -m decaton_aio run examples.follow.processor:app` (or `:repair`): built on
    # first access, so importing this module opens no database.
    if name not in ("app", "repair"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _apps:
        store = FollowStore(os.environ.get(DB_ENV_VAR, "follow.db"))
        _apps["app"] = follow_app(FollowProcessor(store), manage_store=True)
        _apps["repair"] = repair_app(RepairProcessor(store), manage_store=True)
    return _apps[name]
