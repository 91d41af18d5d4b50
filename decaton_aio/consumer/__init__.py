"""The consumer runtime: records of a partition processed concurrently, in key order,
committed by watermark.

[`Subscription`][decaton_aio.Subscription] consumes an application's topics: its fetch
routine hands each partition's records to a ``PartitionProcessor``, which keeps one lane per
key and a bound on tasks in flight, and a ``WatermarkTracker`` over a completion bitmap, so
the committed offset never passes an unfinished task. The ``TaskExecutor`` runs a task and
turns its outcome into a finish, a deferred completion, a retry or a dead letter.
`run_application()` is what ``python -m decaton_aio run`` calls; `load_properties()` is how
it checks the runtime properties at start (``run --workers`` before any worker).

Inside (private): ``_subscription`` (lifecycle, fetch, rebalance, commit), ``_partition``
(lanes, slots, pause), ``_execution`` (a task's outcome), ``_contract`` (what the
partition and the executor call of each other), ``_watermark`` (the commit point),
``_records`` (fetched records without per-record objects), ``_eager`` and ``_steps``
(starting a coroutine inline, its workers), ``_legacy`` (pre-Decaton-9 records),
``_ratelimit``, ``_hotkeys`` (per-key quota), ``_tracing`` (the traced executor),
``_assignment`` (the partitions' lifecycle and the one decision to fetch each or not),
``_loopwatch`` (event loop lag, GC pauses), ``_runner`` (signals, properties, metrics
around a subscription), ``_health`` (the liveness and readiness probes,
`HealthCheck`).

Wings, each behind its own face: ``commit`` (commits with checkpoints, exactly-once
transactions, ``ctx.produce`` delivery) and ``state`` (the state store behind
``ctx.state``: local copies, changelog, restores, standbys).
"""

from __future__ import annotations

from decaton_aio.consumer._health import HealthCheck, HealthConfig
from decaton_aio.consumer._runner import (
    RunOptions,
    install_event_loop_policy,
    load_properties,
    run_application,
)
from decaton_aio.consumer._subscription import Subscription, SubscriptionState

__all__ = [
    "HealthCheck",
    "HealthConfig",
    "RunOptions",
    "Subscription",
    "SubscriptionState",
    "install_event_loop_policy",
    "load_properties",
    "run_application",
]
