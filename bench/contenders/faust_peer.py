"""faust-streaming: an agent with ``concurrency`` copies (option ``concurrency``, default
100) on one stream; ``max_poll_records`` (option, default faust's) bounds each fetch.

A record is handed to whichever copy is free, so tasks of one key can run concurrently and
out of order. Faust owns the event loop (its worker starts and runs it), so this
contender runs blocking until the harness stops the process. Faust commits the offsets of
acknowledged records on its own interval. A secured broker's settings become faust's
``broker_credentials``.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.body import Body
from bench.workload import RunSpec

__all__ = ["CONCURRENCY", "run_blocking"]

CONCURRENCY = 100


def run_blocking(spec: RunSpec, body: Body) -> None:
    import faust
    from faust.worker import Worker

    extra: dict[str, Any] = {}
    security = spec.security
    if security.uses_sasl:
        extra["broker_credentials"] = faust.SASLCredentials(
            username=security.sasl_username,
            password=security.sasl_password,
            ssl_context=security.ssl_context(),
            mechanism=security.sasl_mechanism,
        )
    elif security.uses_tls:
        extra["broker_credentials"] = faust.SSLCredentials(security.ssl_context())
    if spec.options.get("max_poll_records"):
        extra["broker_max_poll_records"] = int(spec.options["max_poll_records"])
    app = faust.App(
        spec.group,
        broker=f"kafka://{spec.bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        store="memory://",
        web_enabled=False,
        topic_partitions=spec.partitions,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=spec.session_timeout_ms / 1000,
        broker_heartbeat_interval=max(0.1, spec.session_timeout_ms / 10_000),
        **extra,
    )
    topic = app.topic(spec.topic, key_type=bytes, value_type=bytes)
    concurrency = int(spec.options.get("concurrency", CONCURRENCY))
    run_raw = body.run_raw

    @app.agent(topic, concurrency=concurrency)
    async def tasks(stream: Any) -> None:
        async for event in stream.events():
            await run_raw(event.message.partition, event.message.offset, event.value)

    logging.getLogger("faust").setLevel(logging.WARNING)
    Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False).execute_from_commandline()
