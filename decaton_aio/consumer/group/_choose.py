"""Which group protocol a subscription speaks, and the membership that speaks it.

`choose_protocol()` decides, in this order:

1. ``group_protocol`` set (`ConsumerConfig`, ``group.protocol``, ``--group-protocol``):
   that one;
2. a state store: ``classic``, whose assignment its own assignor makes (a partition's
   state stays where its restore is cheapest);
3. ``DECATON_AIO_GROUP_PROTOCOL`` set in the environment: that one (a whole deployment,
   or a test run, on one protocol without touching each application's config);
4. otherwise ``consumer`` where the broker offers it (``ConsumerGroupHeartbeat``, Kafka
   4.0 and later), else ``classic``.

The choice and its reason are logged once per subscription start. `new_membership()`
makes the membership of the protocol chosen.

The decision itself (`decide()`) is a pure function; the broker is asked only when the
decision depends on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from decaton_aio import environment
from decaton_aio.app import GROUP_PROTOCOLS, ConsumerConfig
from decaton_aio.consumer.group._classic import ClassicMembership
from decaton_aio.consumer.group._consumer_protocol import ConsumerProtocolMembership
from decaton_aio.consumer.group._contract import GroupProtocol, Membership
from decaton_aio.errors import ConfigError

__all__ = [
    "Choice",
    "choose_protocol",
    "decide",
    "new_membership",
    "protocol_from_environment",
]

log = structlog.get_logger("decaton_aio.group")


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
    from_environment: GroupProtocol | None = None,
) -> Choice:
    """The protocol for ``setting`` (``None``: not set), a subscription with or without
    a state store, ``DECATON_AIO_GROUP_PROTOCOL``'s value (``from_environment``) and a
    broker that offers the consumer protocol or not (``None``: not asked, or no
    answer)."""
    if setting is not None:
        return Choice(setting, f"group.protocol={setting} is set")
    if state_store:
        return Choice("classic", "a state store assigns its partitions with its own assignor")
    if from_environment is not None:
        return Choice(
            from_environment, f"{environment.GROUP_PROTOCOL.name}={from_environment} is set"
        )
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
    environ: Mapping[str, str] | None = None,
) -> Choice:
    """Decide (see `decide()`), asking the broker through ``offers_consumer`` only when
    the answer matters; the choice is logged.

    ``environ`` is where ``DECATON_AIO_GROUP_PROTOCOL`` is read (``os.environ`` when
    omitted). A failing ``offers_consumer`` counts as no answer (the member then joins
    with the classic protocol, which every broker has).

    Raises:
        ConfigError: ``DECATON_AIO_GROUP_PROTOCOL`` is neither ``consumer`` nor
            ``classic``.
    """
    from_environment = protocol_from_environment(environ)
    offers: bool | None = None
    needs_broker = config.group_protocol is None and not state_store and from_environment is None
    if needs_broker and offers_consumer is not None:
        try:
            offers = await offers_consumer()
        except Exception as exc:
            log.warning("cannot ask the broker for its group protocols", error=repr(exc))
    choice = decide(
        config.group_protocol,
        state_store=state_store,
        broker_offers_consumer=offers,
        from_environment=from_environment,
    )
    log.info(
        "group protocol chosen",
        group=config.group_id,
        protocol=choice.protocol,
        reason=choice.reason,
    )
    return choice


def protocol_from_environment(environ: Mapping[str, str] | None = None) -> GroupProtocol | None:
    """``DECATON_AIO_GROUP_PROTOCOL``'s value in ``environ`` (``os.environ`` when
    omitted), any case; ``None`` when it is unset or blank.

    Raises:
        ConfigError: a value that is not a group protocol (the message names the choices).
    """
    value = environment.GROUP_PROTOCOL.get(environ)
    if value is None or not value.strip():
        return None
    protocol = value.strip().lower()
    if protocol not in GROUP_PROTOCOLS:
        raise ConfigError(
            f"{environment.GROUP_PROTOCOL.name}={value!r}: must be one of {GROUP_PROTOCOLS}"
        )
    return protocol  # type: ignore[return-value]


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
        # The group's session is the broker's; a member silent for its own gives up its
        # partitions, as the coordinator does at the group's (set them alike).
        session_timeout_s=config.session_timeout_ms / 1000,
        client_id=config.client_id,
    )
