"""Which group protocol a subscription speaks, and the membership that speaks it.

`choose_protocol()` decides, in this order:

1. ``group_protocol`` set (`ConsumerConfig`, ``group.protocol``, ``--group-protocol``):
   that one;
2. a state store: ``classic``, whose assignment its own assignor makes (a partition's
   state stays where its restore is cheapest);
3. otherwise ``consumer`` where the broker offers it (``ConsumerGroupHeartbeat``), else
   ``classic`` — while `CONSUMER_BY_DEFAULT` is on; while it is off, ``classic`` (the
   consumer protocol is opt-in).

The choice and its reason are logged once per subscription start. `new_membership()`
makes the membership of the protocol chosen.

The decision itself (`decide()`) is a pure function; the broker is asked only when the
decision depends on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import structlog

from decaton_aio.app import ConsumerConfig
from decaton_aio.consumer.group._classic import ClassicMembership
from decaton_aio.consumer.group._consumer_protocol import ConsumerProtocolMembership
from decaton_aio.consumer.group._contract import GroupProtocol, Membership
from decaton_aio.errors import ConfigError

__all__ = ["CONSUMER_BY_DEFAULT", "Choice", "choose_protocol", "decide", "new_membership"]

log = structlog.get_logger("decaton_aio.group")

#: Whether a subscription without ``group_protocol`` uses the consumer protocol where the
#: broker offers it (off: ``classic`` unless asked for).
CONSUMER_BY_DEFAULT: Final = False


@dataclass(frozen=True, slots=True)
class Choice:
    """A group protocol and why it was chosen (logged)."""

    protocol: GroupProtocol
    reason: str


def decide(
    setting: GroupProtocol | None,
    *,
    state_store: bool,
    broker_offers_consumer: bool | None,
    consumer_by_default: bool = CONSUMER_BY_DEFAULT,
) -> Choice:
    """The protocol for ``setting`` (``None``: not set), a subscription with or without
    a state store, and a broker that offers the consumer protocol or not (``None``: not
    asked, or no answer)."""
    if setting is not None:
        return Choice(setting, f"group.protocol={setting} is set")
    if state_store:
        return Choice("classic", "a state store assigns its partitions with its own assignor")
    if not consumer_by_default:
        return Choice("classic", "the default (group.protocol=consumer is opt-in)")
    if broker_offers_consumer:
        return Choice("consumer", "the broker offers the consumer group protocol")
    if broker_offers_consumer is None:
        return Choice("classic", "the broker did not say whether it offers the consumer protocol")
    return Choice("classic", "the broker does not offer the consumer group protocol")


async def choose_protocol(
    config: ConsumerConfig,
    *,
    state_store: bool,
    offers_consumer: Callable[[], Awaitable[bool]] | None = None,
    consumer_by_default: bool = CONSUMER_BY_DEFAULT,
) -> Choice:
    """Decide (see `decide()`), asking the broker through ``offers_consumer`` only when
    the answer matters; the choice is logged.

    A failing ``offers_consumer`` counts as no answer (the member then joins with the
    classic protocol, which every broker has)."""
    offers: bool | None = None
    needs_broker = config.group_protocol is None and not state_store and consumer_by_default
    if needs_broker and offers_consumer is not None:
        try:
            offers = await offers_consumer()
        except Exception as exc:
            log.warning("cannot ask the broker for its group protocols", error=repr(exc))
    choice = decide(
        config.group_protocol,
        state_store=state_store,
        broker_offers_consumer=offers,
        consumer_by_default=consumer_by_default,
    )
    log.info(
        "group protocol chosen",
        group=config.group_id,
        protocol=choice.protocol,
        reason=choice.reason,
    )
    return choice


def new_membership(
    protocol: GroupProtocol,
    config: ConsumerConfig,
    topics: Sequence[str],
    *,
    assignors: Sequence[Any] | None = None,
) -> Membership:
    """The membership of ``protocol`` for ``config``'s group, subscribed to ``topics``;
    ``assignors`` replace the configured ones (classic only: a state store's own).

    Raises:
        ConfigError: ``consumer`` with ``assignors`` (the coordinator assigns there).
    """
    if protocol == "classic":
        return ClassicMembership(config, topics, assignors=assignors)
    if assignors:
        raise ConfigError(
            f"group {config.group_id!r}: a state store assigns its partitions with its own "
            "assignor, which only the classic group protocol runs: set "
            "group.protocol=classic (or leave it unset)"
        )
    return ConsumerProtocolMembership(
        config.group_id,
        config.bootstrap_servers,
        topics=list(topics),
        security=config.security,
        instance_id=config.group_instance_id,
        # As Kafka's consumers: the longest a member may take to give partitions up.
        rebalance_timeout_ms=config.max_poll_interval_ms,
        client_id=config.client_id,
    )
