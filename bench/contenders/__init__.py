"""The contenders: our runtime and the peers it is measured against.

Each module has ``main(spec, recorder)``, run in a fresh process by ``bench.child``; it
consumes ``spec.topic``, awaits ``recorder.processor()`` for each task, and returns once
the recorder's window closed (the child then emits the result and exits). Imports are
lazy so a peer that is not installed only fails its own run.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CONTENDERS", "Contender"]


class Contender(NamedTuple):
    """A contender: where it lives and what it is, for the tables."""

    module: str
    label: str
    ordered: bool  # keeps per-key order by design


CONTENDERS: dict[str, Contender] = {
    "ours": Contender(
        "bench.contenders.ours", "decaton-aio (per-key lanes, watermark commits)", True
    ),
    "sequential": Contender("bench.contenders.plain", "aiokafka, sequential, auto-commit", True),
    "gather": Contender(
        "bench.contenders.plain", "aiokafka, gather per batch of 500 + commit", False
    ),
    "keyed": Contender(
        "bench.contenders.plain", "aiokafka, per-key groups per batch of 500 + commit", True
    ),
    "faust": Contender("bench.contenders.faust_peer", "faust-streaming, concurrency 100", False),
    "faststream": Contender(
        "bench.contenders.faststream_peer", "FastStream, max_workers=100", False
    ),
}
