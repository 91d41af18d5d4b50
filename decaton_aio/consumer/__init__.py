"""The consumer runtime: records of a partition processed concurrently, in key order,
committed by watermark.

:class:`Subscription` consumes an application's topics: its fetch routine hands each
partition's records to a ``PartitionProcessor``, which keeps one lane per key and a bound
on tasks in flight, and a ``WatermarkTracker`` over a completion bitmap, so the committed
offset never passes an unfinished task. The ``TaskExecutor`` runs a task and turns its
outcome into a finish, a deferred completion, a retry or a dead letter.
:func:`run_application` is what ``python -m decaton_aio run`` calls.

Inside (private): ``_subscription`` (lifecycle, fetch, rebalance, commit), ``_partition``
(lanes, slots, pause), ``_execution`` (a task's outcome), ``_watermark`` (the commit
point), ``_committer`` (commits, checkpoints at assignment, transactions),
``_checkpoint_codec`` and ``_checkpoints`` (the checkpoint's encoding and store),
``_outputs`` (``ctx.produce`` delivery), ``_transactions`` (exactly-once), ``_state``,
``_store``, ``_changelog``, ``_assignor``, ``_state_txn`` and ``_overlay`` (the state
store; its changes in transactions with exactly-once), ``_records`` (fetched records
without per-record objects), ``_eager`` and ``_steps`` (starting a coroutine inline, its
workers), ``_ratelimit``, ``_hotkeys`` (per-key quota), ``_runner`` (signals, properties,
metrics around a subscription), ``_health`` (the liveness and readiness probes,
:class:`HealthCheck`).
"""

from __future__ import annotations

from decaton_aio.consumer._health import HealthCheck, HealthConfig
from decaton_aio.consumer._runner import RunOptions, install_event_loop_policy, run_application
from decaton_aio.consumer._subscription import Subscription, SubscriptionState

__all__ = [
    "HealthCheck",
    "HealthConfig",
    "RunOptions",
    "Subscription",
    "SubscriptionState",
    "install_event_loop_policy",
    "run_application",
]
