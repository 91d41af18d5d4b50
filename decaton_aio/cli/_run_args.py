"""Flags of ``run`` that map onto config objects: the Kafka consumer settings (one flag,
and an environment variable where a deployment sets it per instance, per
[`ConsumerConfig`][decaton_aio.ConsumerConfig] field) and the probes' thresholds
([`HealthConfig`][decaton_aio.consumer.HealthConfig]).

A flag left out keeps the field's default, so the defaults live in one place: the config
classes.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from decaton_aio import environment
from decaton_aio.app import GROUP_PROTOCOLS, ConsumerConfig
from decaton_aio.consumer import HealthConfig

__all__ = ["add_consumer_arguments", "add_probe_arguments", "consumer_config", "health_config"]

# (flag, ConsumerConfig field, type, environment variable or None, help)
_FLAGS: tuple[tuple[str, str, type, environment.EnvironmentVariable | None, str], ...] = (
    ("--group-instance-id", "group_instance_id", str, environment.GROUP_INSTANCE_ID,
     "static membership (group.instance.id): a stable id per instance, e.g. the pod "
     "name; a restart within the session timeout keeps its partitions without a rebalance; "
     "with --workers N, worker n joins as ID-n"),
    ("--client-id", "client_id", str, environment.CLIENT_ID,
     "the client id the broker sees (client.id; default decaton-aio)"),
    ("--client-rack", "client_rack", str, environment.CLIENT_RACK,
     "this instance's rack or zone (client.rack): fetch from a replica in the same zone"),
    ("--session-timeout-ms", "session_timeout_ms", int, None,
     "a silent member is evicted after this, and a member its coordinator does not "
     "answer gives up its partitions after this (session.timeout.ms; default 10000)"),
    ("--heartbeat-interval-ms", "heartbeat_interval_ms", int, None,
     "heartbeat period (heartbeat.interval.ms; default 3000)"),
    ("--max-poll-interval-ms", "max_poll_interval_ms", int, None,
     "longest time between fetch calls before the member is dropped "
     "(max.poll.interval.ms; default 300000)"),
    ("--fetch-min-bytes", "fetch_min_bytes", int, None,
     "the broker holds a fetch until this much data is there (fetch.min.bytes; default 1)"),
    ("--fetch-max-bytes", "fetch_max_bytes", int, None,
     "bytes per fetch, all partitions (fetch.max.bytes; default 52428800)"),
    ("--fetch-max-wait-ms", "fetch_max_wait_ms", int, None,
     "how long the broker may hold a fetch (fetch.max.wait.ms; default 100)"),
    ("--busy-fetch-min-bytes", "busy_fetch_min_bytes", int, None,
     "while records flow, the broker holds a fetch until this much data is there "
     "(default 16384; 0: as --fetch-min-bytes)"),
    ("--busy-fetch-max-wait-ms", "busy_fetch_max_wait_ms", int, None,
     "while records flow, how long the broker may hold a fetch (default 5)"),
    ("--max-partition-fetch-bytes", "max_partition_fetch_bytes", int, None,
     "bytes per partition per fetch (max.partition.fetch.bytes; default 1048576)"),
    ("--max-poll-records", "max_fetch_records", int, None,
     "records taken per fetch call (max.poll.records; default 2000)"),
    ("--fetch-loop", "fetch_loop", str, None,
     "what fetches the partitions: own (the runtime's fetch loop, with fetch sessions) "
     "or aiokafka (aiokafka's consumer); default own"),
    ("--metadata-max-age-ms", "metadata_max_age_ms", int, None,
     "refresh the cluster's metadata this often: a recreated task topic is noticed "
     "within it (metadata.max.age.ms; default 5 minutes)"),
)  # fmt: skip


def add_consumer_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the consumer flags (and ``--auto-offset-reset``) to ``run``."""
    for flag, field, kind, env, text in _FLAGS:
        default = None
        if env is not None:
            text += f" (env {env.name})"
            default = env.get() or None
        parser.add_argument(
            flag,
            dest=f"consumer_{field}",
            type=kind,
            default=default,
            metavar="N" if kind is int else "TEXT",
            help=text,
        )
    parser.add_argument(
        "--auto-offset-reset",
        dest="consumer_auto_offset_reset",
        choices=("earliest", "latest"),
        default=None,
        help="where a new group starts (auto.offset.reset; default earliest)",
    )
    parser.add_argument(
        "--group-protocol",
        dest="consumer_group_protocol",
        type=str.lower,
        choices=GROUP_PROTOCOLS,
        # Unset, DECATON_AIO_GROUP_PROTOCOL applies where the runtime chooses (after a
        # state store's own rule), as for in-process applications.
        default=None,
        help="the group protocol (group.protocol): consumer (the coordinator assigns and "
        "only moved partitions stop; Kafka 4.0+) or classic; default: the runtime chooses "
        f"(a state store: classic; else env {environment.GROUP_PROTOCOL.name}; else by "
        "the broker) and logs why",
    )


def consumer_config(
    args: argparse.Namespace,
    bootstrap_servers: str,
    group_id: str,
    *,
    defaults: Mapping[str, Any] | None = None,
    **fields: Any,
) -> ConsumerConfig:
    """The consumer settings of the parsed flags over ``defaults`` (a ``client.properties``
    file's); ``fields`` are set as given.

    Raises:
        ConfigError: a value is out of range (the message names the field).
    """
    given = {
        name.removeprefix("consumer_"): value
        for name, value in vars(args).items()
        if name.startswith("consumer_") and value is not None
    }
    return ConsumerConfig(bootstrap_servers, group_id, **{**(defaults or {}), **given, **fields})


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the thresholds of ``/healthz`` and ``/readyz`` to ``run``."""
    for flag, field, text in (
        ("--stall-timeout-ms", "stall_timeout_ms", "not ready when a partition with pending "
         "records has not completed its first one for this long (default 300000)"),
        ("--fetch-timeout-ms", "fetch_timeout_ms", "not ready when no fetch returned for this "
         "long (default 30000)"),
        ("--probe-answer-timeout-ms", "answer_timeout_ms", "a probe fails when the event loop "
         "does not answer within this (default 2000)"),
    ):  # fmt: skip
        parser.add_argument(flag, dest=f"health_{field}", type=int, metavar="MS", help=text)


def health_config(args: argparse.Namespace) -> HealthConfig:
    """The probes' thresholds of the parsed flags.

    Raises:
        ConfigError: a value is out of range.
    """
    given = {
        name.removeprefix("health_"): value
        for name, value in vars(args).items()
        if name.startswith("health_") and value is not None
    }
    return HealthConfig(**given)
