"""A per-user visit counter whose state lives in ``ctx.state``.

Run it (one process per instance; each needs its own state directory)::

    COUNTER_STATE_DIR=/var/lib/counter/a COUNTER_STANDBYS=1 \\
        python -m decaton_aio run examples.counter.processor:app \\
        --bootstrap-servers localhost:9092 --topic page-views --group visits

Each task is a page view keyed by user id. The state of a user is its count and the
offset of the last view counted: a view redelivered after a crash (its offset was not
committed, but its change already reached the changelog) is recognised and not counted
twice, so the counts are exact under at-least-once delivery.
"""

from __future__ import annotations

import os

from decaton_aio import Application, ProcessingContext, StateStoreConfig


async def process(ctx: ProcessingContext, task: bytes) -> None:
    """Count one view of the task's user."""
    state = ctx.state.get({"count": 0, "offset": -1})
    if ctx.offset <= state["offset"]:
        return  # counted before a crash: the changelog has it, the commit did not
    ctx.state.set({"count": state["count"] + 1, "offset": ctx.offset})


app = Application(
    process,
    topics=("page-views",),
    state=StateStoreConfig(
        "visits",
        directory=os.environ.get("COUNTER_STATE_DIR") or None,
        num_standby_replicas=int(os.environ.get("COUNTER_STANDBYS", "0")),
    ),
)
