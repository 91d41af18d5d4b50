"""The producer: tasks onto a topic, never lost.

[`TaskProducer`][decaton_aio.TaskProducer] puts tasks with their ``dt_meta`` header through a
[`DurableSender`][decaton_aio.DurableSender], which owns the ``acks=all`` client and, with a
spool directory, keeps what the cluster does not take in a local spool (fsynced before the
put returns) and replays it in the background. The runtime sends its retry, dead letter and
shaping records through the same sender.

Inside (private): ``_config`` ([`ProducerConfig`][decaton_aio.ProducerConfig]),
    ``_task_producer``, ``_sender``
(direct and spooling modes), ``_inflight`` (records awaiting acknowledgement and their
settlement), ``_client`` (starting the client, sorting its errors), ``_replay`` (the
spool's delivery), ``_spool``, ``_spool_files`` and ``_spool_format`` (the spool on disk).
"""

from __future__ import annotations

from decaton_aio.producer._client import MAX_REQUEST_SIZE, oversized, start_client, stop_client
from decaton_aio.producer._config import COMPRESSION_TYPES, Idempotence, ProducerConfig
from decaton_aio.producer._inflight import RecordLocation
from decaton_aio.producer._sender import DurableSender, SenderMode
from decaton_aio.producer._spool_files import SpoolSummary, gather_for_workers, worker_spool
from decaton_aio.producer._spool_files import summarize as summarize_spool
from decaton_aio.producer._spool_format import SPOOL_FORMAT_VERSION, SpoolEntry
from decaton_aio.producer._task_producer import TaskProducer

__all__ = [
    "COMPRESSION_TYPES",
    "MAX_REQUEST_SIZE",
    "SPOOL_FORMAT_VERSION",
    "DurableSender",
    "Idempotence",
    "ProducerConfig",
    "RecordLocation",
    "SenderMode",
    "SpoolEntry",
    "SpoolSummary",
    "TaskProducer",
    "gather_for_workers",
    "oversized",
    "start_client",
    "stop_client",
    "summarize_spool",
    "worker_spool",
]
