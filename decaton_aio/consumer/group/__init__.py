"""The consumer's group membership: which partitions this member owns, and commits the
coordinator checks against it (see `decaton_aio.consumer.group._contract`)."""

from __future__ import annotations

from decaton_aio.consumer.group._classic import ClassicMembership
from decaton_aio.consumer.group._consumer_protocol import (
    ConsumerProtocolMembership,
    offers_consumer_protocol,
)
from decaton_aio.consumer.group._contract import GroupListener, GroupProtocol, Membership

__all__ = [
    "ClassicMembership",
    "ConsumerProtocolMembership",
    "GroupListener",
    "GroupProtocol",
    "Membership",
    "offers_consumer_protocol",
]
