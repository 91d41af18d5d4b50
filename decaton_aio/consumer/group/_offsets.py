"""Reading a group's committed offsets from its coordinator, for both memberships.

`read_committed()` is what `Membership.committed()` does on either protocol: an
``OffsetFetch`` with ``require_stable`` (a partition whose offsets an open transaction
holds is answered ``UNSTABLE_OFFSET_COMMIT``); what is stable is kept and only the rest is
asked again, after a wait that doubles from `RETRY_S` up to `RETRY_MAX_S`. A coordinator
that moved (``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE``, loading) is forgotten
through the caller's ``coordinator_moved`` and asked again the same way. The loop ends
when every partition is read: the transaction coordinator ends an open transaction at
its timeout, and a failed request raises.

A broker older than ``OffsetFetch`` version 7 (no ``require_stable``) is read without it.

Commits are sent again the same way while their coordinator moves, `COMMIT_ATTEMPTS` times
at most (`retry_wait()`); each membership checks, before each try, that the member still
owns what it commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Final

from aiokafka import TopicPartition
from aiokafka.errors import IncompatibleBrokerVersion, for_code
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import protocol_commit
from decaton_aio.consumer.commit import UNSTABLE_OFFSET_COMMIT, OffsetFetchRequest

__all__ = [
    "COMMIT_ATTEMPTS",
    "NOT_COORDINATOR_CODES",
    "RETRY_MAX_S",
    "RETRY_S",
    "read_committed",
    "retry_wait",
]

#: COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: ask again.
NOT_COORDINATOR_CODES: Final = frozenset({14, 15, 16})
#: The first wait before partitions not read yet are asked again.
RETRY_S: Final = 0.1
#: The longest wait between two reads.
RETRY_MAX_S: Final = 1.0
#: How many times a commit is sent while its coordinator moves (then its error is raised).
COMMIT_ATTEMPTS: Final = 5


def retry_wait(attempt: int) -> float:
    """The wait before try ``attempt + 1`` (``attempt`` from 0): `RETRY_S` doubled each
    time, at most `RETRY_MAX_S`."""
    return float(min(RETRY_MAX_S, RETRY_S * 2**attempt))


async def read_committed(
    send: Callable[[Any], Awaitable[Any]],
    group_id: str,
    partitions: Collection[TopicPartition],
    *,
    coordinator_moved: Callable[[], None],
) -> dict[TopicPartition, OffsetAndMetadata | None]:
    """The committed offsets of ``partitions`` in ``group_id`` once no open transaction
    holds them; ``None`` where the group has none (see the module docstring).

    Args:
        send: sends a request to the group's coordinator (looking it up when it is not
            known) and returns the response.
        coordinator_moved: forgets the coordinator, so that ``send`` looks it up again.

    Raises:
        KafkaError: a request failed, or the coordinator refused the read.
    """
    found: dict[TopicPartition, OffsetAndMetadata | None] = {}
    wanted = sorted(set(partitions))
    attempt = 0
    while wanted:
        try:
            response = await send(OffsetFetchRequest(group_id, wanted))
        except (IncompatibleBrokerVersion, NotImplementedError):
            response = await send(protocol_commit.OffsetFetchRequest(group_id, _by_topic(wanted)))
        pending: list[TopicPartition] = []
        code = getattr(response, "error_code", 0)
        if code in NOT_COORDINATOR_CODES:
            coordinator_moved()
            pending = wanted
        elif code:
            raise for_code(code)(f"cannot read the offsets of group {group_id!r}")
        else:
            for topic, parts, *_ in response.topics:
                for partition, offset, *rest in parts:
                    tp = TopicPartition(topic, partition)
                    if rest and isinstance(rest[-1], dict):
                        rest = rest[:-1]  # a flexible version's tagged fields
                    # [leader epoch (version 5+),] metadata, error code
                    metadata, code = rest[-2], rest[-1]
                    if code == UNSTABLE_OFFSET_COMMIT or code in NOT_COORDINATOR_CODES:
                        pending.append(tp)
                        if code != UNSTABLE_OFFSET_COMMIT:
                            coordinator_moved()
                    elif code:
                        raise for_code(code)(f"cannot read the offset of {topic}-{partition}")
                    elif tp in wanted:
                        found[tp] = (
                            None if offset < 0 else OffsetAndMetadata(offset, metadata or "")
                        )
        wanted = pending
        if wanted:
            await asyncio.sleep(retry_wait(attempt))
            attempt += 1
    return found


def _by_topic(partitions: Collection[TopicPartition]) -> list[tuple[str, list[int]]]:
    topics: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        topics.setdefault(tp.topic, []).append(tp.partition)
    return sorted(topics.items())
