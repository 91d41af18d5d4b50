"""The consumer's group membership: which partitions this member owns, and commits the
coordinator checks against it (see `decaton_aio.consumer.group._contract`)."""

from __future__ import annotations

from decaton_aio.consumer.group._classic import ClassicMembership
from decaton_aio.consumer.group._contract import GroupListener, GroupProtocol, Membership

__all__ = ["ClassicMembership", "GroupListener", "GroupProtocol", "Membership"]
