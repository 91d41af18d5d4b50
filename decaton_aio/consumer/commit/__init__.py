"""Committing: offsets with their checkpoints, at-least-once or in transactions, and the
delivery of tasks' outputs that a commit must cover.

`Committer` is the subscription's commit and assignment machinery: it commits each
partition's watermark with its `Checkpoint` (the completed offsets past it, kept by
a `CheckpointStore` in the commit metadata or a checkpoint topic) and imports the
checkpoint again at assignment, so finished records are not redone. With exactly-once the
subscription has one `Transaction` holding its partitions' outputs, offsets and
checkpoints (and, through its listeners, the state store's changes), committed with the
consumer's group metadata so a member whose generation is over cannot commit
(`group_metadata()`). `deliver_outputs()` hands a task's ``ctx.produce``
records to its partition's sink (`DurableOutputs`, or the transaction) before the
task's offset completes.

Inside (private): ``_committer`` (commit, load at assignment, rewind, fencing),
``_checkpoint_codec`` (the checkpoint's encoding and trust rule), ``_checkpoints`` (where
checkpoints are stored), ``_transactions`` (the transactional producer), ``_group_txn``
(the offset commit and fetch versions that carry and respect the group's metadata),
``_outputs`` (output delivery).
"""

from __future__ import annotations

from decaton_aio.consumer.commit._checkpoint_codec import Checkpoint
from decaton_aio.consumer.commit._checkpoints import CheckpointStore
from decaton_aio.consumer.commit._committer import Committer
from decaton_aio.consumer.commit._group_txn import (
    UNSTABLE_OFFSET_COMMIT,
    GroupMetadata,
    OffsetFetchRequest,
    group_metadata,
)
from decaton_aio.consumer.commit._outputs import DurableOutputs, deliver_outputs
from decaton_aio.consumer.commit._transactions import (
    Transaction,
    TransactionFailedError,
    commit_interval_within,
    transaction_timeout_ms,
)

__all__ = [
    "UNSTABLE_OFFSET_COMMIT",
    "Checkpoint",
    "CheckpointStore",
    "Committer",
    "DurableOutputs",
    "GroupMetadata",
    "OffsetFetchRequest",
    "Transaction",
    "TransactionFailedError",
    "commit_interval_within",
    "deliver_outputs",
    "group_metadata",
    "transaction_timeout_ms",
]
