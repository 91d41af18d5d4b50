"""The network fault suite's application: the soak's tasks (some fail once, retry once,
always fail or are rejected into the dead letter topic, each logged as the soak logs
them), and for each task that succeeds one output record (its task number) to
``$FAULT_OUT`` and, when it succeeded at its first attempt, a count of its key in
``ctx.state`` (with ``FAULT_STATE=0`` the application has no state store, so that
it may speak the consumer group protocol: a state store keeps the classic one). (Only
first attempts count: a retry runs in the retry topic's lane of the
key, which shares the key's state with the task topic's lane, and two lanes' updates
could interleave.) Run with ``--exactly-once`` the outputs, the
state's changelog and the offsets commit in one transaction; a transaction that fails
(a fault that outlasts it) is aborted and its partitions go back to their last commit,
which the task log marks as it marks a rebalance (an ``epoch`` line: a key may start
again at its committed point).

The suite copies this file and ``tests/soak/soak_app.py`` beside the instances.
"""

from __future__ import annotations

import os
from typing import Any

import soak_app  # type: ignore[import-not-found]
import structlog

from decaton_aio import Application, BytesSerializer, ProcessingContext, StateStoreConfig

OUT = os.environ["FAULT_OUT"]
STATE = os.environ.get("FAULT_STATE", "1") == "1"


async def process(ctx: ProcessingContext, task: bytes) -> None:
    await soak_app.process(ctx, task)  # logs it; raises or retries as its fate says
    n = int(task)
    first = ctx.metadata.retry_count == 0
    if soak_app.fate(n) == "retries once" and first:
        return  # sent to the retry topic: its output comes with the retry
    if first and STATE:
        ctx.state.set(ctx.state.get(0) + 1)
    await ctx.produce(OUT, b"%d" % n, key=ctx.key)


#: What the runtime logs when a partition goes back to its last commit after a failed
#: transaction, before it starts a record again (tasks started between the failure and
#: this line belong to the transaction that failed).
REWIND = "partition rewound to its last commit"


def _rewinds(logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
    if soak_app._out is not None and event.get("event") == REWIND:
        soak_app._out.write("epoch\n")
        soak_app._out.flush()
    return event


async def _open_log() -> None:
    await soak_app._open_log()
    structlog.configure(processors=[_rewinds, *structlog.get_config()["processors"]])


app = Application(
    process,
    topics=("unused",),  # named with --topic
    serializer=BytesSerializer(),
    retry=soak_app.app.retry,
    state=StateStoreConfig("counts") if STATE else None,
    on_startup=_open_log,
    on_shutdown=soak_app._close_log,
)
