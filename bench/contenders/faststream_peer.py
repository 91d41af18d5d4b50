"""FastStream: a Kafka subscriber with ``max_workers`` concurrent handlers (option
``workers``, default 100).

With more than one worker FastStream acknowledges a record when it is taken (its
``ACK_FIRST`` default, so at-most-once) and runs the handlers concurrently, unordered.

FastStream's default parser decodes every header as UTF-8 text, so it fails on the binary
``dt_meta`` header of Decaton tasks (``UnicodeDecodeError``, and the record is skipped).
To measure it at all it gets a parser that drops ``dt_meta`` before FastStream's own.
A secured broker's settings become FastStream's ``security`` object.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from bench.body import Body
from bench.workload import RunSpec
from decaton_aio.metadata import METADATA_HEADER
from decaton_aio.security import SecuritySettings

__all__ = ["WORKERS", "main"]

WORKERS = 100


async def main(spec: RunSpec, body: Body) -> None:
    from faststream import Context
    from faststream.kafka import KafkaBroker

    broker = KafkaBroker(spec.bootstrap, logger=None, security=_security(spec.security))
    run_raw = body.run_raw

    async def raw_body(message: Any) -> bytes:
        value: bytes = message.body
        return value

    async def without_dt_meta(record: Any, original: Any) -> Any:
        headers = [(k, v) for k, v in record.headers if k != METADATA_HEADER]
        return await original(dataclasses.replace(record, headers=headers))

    @broker.subscriber(  # type: ignore[misc]
        spec.topic,
        group_id=spec.group,
        auto_offset_reset="earliest",
        session_timeout_ms=spec.session_timeout_ms,
        heartbeat_interval_ms=max(100, spec.session_timeout_ms // 10),
        max_workers=int(spec.options.get("workers", WORKERS)),
        parser=without_dt_meta,
        decoder=raw_body,
    )
    async def handle(value, message=Context("message")):  # type: ignore[no-untyped-def]  # noqa: B008
        record = message.raw_message
        await run_raw(record.partition, record.offset, value)

    await broker.start()
    await asyncio.Event().wait()  # until the harness stops the process


def _security(settings: SecuritySettings) -> Any:
    """``settings`` as FastStream's security object (``None`` for plaintext)."""
    from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512

    if not settings.uses_sasl:
        return BaseSecurity(ssl_context=settings.ssl_context()) if settings.uses_tls else None
    kinds = {"PLAIN": SASLPlaintext, "SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512}
    kind = kinds.get(settings.sasl_mechanism or "")
    if kind is None:
        raise ValueError(f"the FastStream contender takes no {settings.sasl_mechanism}")
    return kind(
        settings.sasl_username or "",
        settings.sasl_password or "",
        ssl_context=settings.ssl_context(),
        use_ssl=settings.uses_tls,
    )
