"""The consumer's group membership: which partitions this member owns, and commits the
coordinator checks against it (see `decaton_aio.consumer.group._contract`); which
protocol a subscription speaks (see `decaton_aio.consumer.group._choose`)."""

from __future__ import annotations

from decaton_aio.consumer.group._choose import Choice, choose_protocol, new_membership
from decaton_aio.consumer.group._classic import ClassicMembership
from decaton_aio.consumer.group._consumer_protocol import (
    ConsumerProtocolMembership,
    offers_consumer_protocol,
)
from decaton_aio.consumer.group._contract import GroupListener, GroupProtocol, Membership

__all__ = [
    "Choice",
    "ClassicMembership",
    "ConsumerProtocolMembership",
    "GroupListener",
    "GroupProtocol",
    "Membership",
    "choose_protocol",
    "new_membership",
    "offers_consumer_protocol",
]
