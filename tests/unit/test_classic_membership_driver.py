"""The classic membership's driver around its state machine, without a broker: what a
listener that raises does (the same as on the consumer protocol: the membership's routine
ends with its error, for the subscription's supervisor)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from decaton_aio.app import ConsumerConfig
from decaton_aio.consumer.group._classic import ClassicMembership
from decaton_aio.consumer.group._classic_state import Assign


class FailingListener:
    async def partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        raise AssertionError("not called")

    async def partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        raise RuntimeError("cannot start the partitions")

    async def partitions_lost(self, partitions: frozenset[TopicPartition]) -> None:
        raise AssertionError("not called")


async def test_a_listener_that_raises_ends_the_routine_with_its_error() -> None:
    membership = ClassicMembership(ConsumerConfig("localhost:9092", "g"), ["t"])
    membership._listener = FailingListener()
    membership._routine = asyncio.create_task(membership._member_routine())
    call = Assign(frozenset({TopicPartition("t", 0)}))
    membership.member.busy = call  # as the state machine hands the call out
    membership._spawn(membership._call_listener(call))
    async with asyncio.timeout(10):  # before: the error was logged, the routine went on
        await asyncio.wait({membership.routine})
    with pytest.raises(RuntimeError, match="cannot start the partitions"):
        membership.routine.result()
