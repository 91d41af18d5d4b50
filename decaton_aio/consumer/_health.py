"""Liveness and readiness of a running subscription, for ``/healthz`` and ``/readyz``.

Liveness asks one question: does the event loop answer? The endpoint's thread schedules a
no-op on the loop and waits for it; a loop blocked by a processor that never yields (a
synchronous call in an ``async def``) does not answer, and the process should be
restarted.

Readiness is computed on the loop (so it reads the runtime's state without races) and
fails, with every reason, when:

- the subscription is not ``RUNNING`` (starting, rebalancing, shutting down); a start
  that waits for task topics the cluster does not have yet names them;
- it has partitions and the fetch routine has not returned from a fetch call for
  ``fetch_timeout_ms`` (a member the group gave no partition is ready: it takes some at
  the next rebalance), or, with the runtime's own fetch loop, a broker asked for records
  has not answered for as long (its fetch calls return, empty: a broker that cannot be
  reached, requests that keep failing);
- a partition is *stalled*: it has pending records and its watermark (the first offset
  not complete) has not moved for ``stall_timeout_ms``, i.e. a task at the head of the
  partition is not finishing (a stuck processor, a deferred completion never completed, a
  retry record the cluster does not take). A partition paused by a rate of 0 is not
  stalled: nothing may start there. A task scheduled (``dt_meta``) further ahead than the
  threshold also holds the watermark: raise the threshold for such topics.

The watermark's progress is sampled at each readiness check; a partition is stalled once
two checks at least ``stall_timeout_ms`` apart saw the same watermark with records pending.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from decaton_aio.errors import ConfigError

if TYPE_CHECKING:
    from decaton_aio.consumer._partition import PartitionProcessor
    from decaton_aio.consumer._subscription import Subscription

__all__ = ["HealthCheck", "HealthConfig"]


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds of the probes.

    Attributes:
        stall_timeout_ms: a partition with pending records whose watermark has not moved
            for this long makes the instance not ready (default 5 minutes).
        fetch_timeout_ms: the instance is not ready when no fetch call returned for this
            long (default 30 s; an idle fetch returns every 100 ms).
        answer_timeout_ms: how long a probe waits for the event loop to answer before it
            fails (default 2 s; give the Kubernetes probe a ``timeoutSeconds`` above it).
    """

    stall_timeout_ms: int = 300_000
    fetch_timeout_ms: int = 30_000
    answer_timeout_ms: int = 2_000

    def __post_init__(self) -> None:
        for name in ("stall_timeout_ms", "fetch_timeout_ms", "answer_timeout_ms"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class _Progress:
    watermark: int | None
    since: float


class HealthCheck:
    """The probes of one subscription (see the module docstring for what they check).

    ```python
    health = HealthCheck(subscription)
    subscription.metrics.start_http_server(9100, probes=health)  # /healthz, /readyz, ...
    ```

    Args:
        subscription: the subscription to watch.
        config: the thresholds.
        loop: the subscription's event loop; the running loop when omitted (create the
            check on the loop then).
        clock: the monotonic clock the subscription's fetch times are read with (tests
            pass a fake one).
    """

    def __init__(
        self,
        subscription: Subscription,
        config: HealthConfig | None = None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._subscription = subscription
        self.config = config or HealthConfig()
        self._loop = loop or asyncio.get_running_loop()
        self._clock = clock
        self._progress: dict[PartitionProcessor, _Progress] = {}

    # ------------------------------------------------------ endpoint thread side

    def liveness(self) -> tuple[bool, Mapping[str, object]]:
        """Whether the event loop answers (called from the endpoint's thread)."""
        ok, answer = self._ask(lambda: (True, {"status": "alive"}))
        return ok, answer

    def readiness(self) -> tuple[bool, Mapping[str, object]]:
        """`check_readiness()`, run on the event loop (called from the endpoint's
        thread)."""
        return self._ask(self.check_readiness)

    def _ask(
        self, check: Callable[[], tuple[bool, Mapping[str, object]]]
    ) -> tuple[bool, Mapping[str, object]]:
        answer: concurrent.futures.Future[tuple[bool, Mapping[str, object]]]
        answer = concurrent.futures.Future()

        def run() -> None:
            try:
                answer.set_result(check())
            except Exception as exc:  # reported as a failed probe by the endpoint
                answer.set_exception(exc)

        timeout_ms = self.config.answer_timeout_ms
        try:
            self._loop.call_soon_threadsafe(run)
            return answer.result(timeout_ms / 1000)
        except RuntimeError:  # the loop is closed
            return False, {"status": "dead", "reason": "the event loop is closed"}
        except concurrent.futures.TimeoutError:
            reason = f"the event loop did not answer within {timeout_ms} ms (blocked?)"
            return False, {"status": "blocked", "reason": reason}

    # ------------------------------------------------------------- loop side

    def check_readiness(self) -> tuple[bool, Mapping[str, object]]:
        """Whether the subscription is ready, with the reasons when not.

        Caller: the subscription's event loop.

        Returns:
            ``(ready, body)``: the body names the state, the partitions assigned and, when
            not ready, ``reasons`` (one line each) and the ``stalled`` partitions.
        """
        sub = self._subscription
        now = self._clock()
        config = self.config
        reasons: list[str] = []
        state = sub.state.value
        if state != "running":
            reasons.append(f"the subscription is {state.replace('_', ' ')}, not running")
        waiting = sub.waiting_for_topics
        if waiting:
            reasons.append(f"waiting for the task topics {', '.join(waiting)} to be created")
        partitions = sub.partitions
        # A running member the group gave no partition (more members than partitions, a
        # rolling update's extra pod) is ready: it takes partitions at the next rebalance.
        last = sub.last_fetch_at
        fetching = state == "running" and bool(partitions)
        if fetching and (last is None or now - last > config.fetch_timeout_ms / 1000):
            since = "ever" if last is None else f"for {now - last:.1f} s"
            reasons.append(f"no fetch returned {since}")
        unanswered = sub.fetch_unanswered_since
        if (
            fetching
            and unanswered is not None
            and now - unanswered > config.fetch_timeout_ms / 1000
        ):
            reasons.append(f"no fetch answered by a broker for {now - unanswered:.1f} s")
        stalled = self._stalled(partitions.values(), now)
        if stalled:
            reasons.append(
                f"{len(stalled)} partition(s) with pending records whose watermark has not "
                f"moved for over {config.stall_timeout_ms} ms"
            )
        body: dict[str, object] = {
            "status": "not ready" if reasons else "ready",
            "state": state,
            "partitions": len(partitions),
        }
        if reasons:
            body["reasons"] = reasons
        if stalled:
            body["stalled"] = stalled
        return not reasons, body

    def _stalled(
        self, processors: Iterable[PartitionProcessor], now: float
    ) -> list[dict[str, object]]:
        # Sample each partition's watermark; report those stuck past the threshold.
        threshold_s = self.config.stall_timeout_ms / 1000
        seen: dict[PartitionProcessor, _Progress] = {}
        stalled: list[dict[str, object]] = []
        for processor in processors:
            watermark = processor.committable()
            progress = self._progress.get(processor)
            pending = processor.pending
            if progress is None or progress.watermark != watermark or not pending:
                progress = _Progress(watermark, now)
            elif processor.rate_paused:
                progress.since = now  # nothing may start: not stalled
            seen[processor] = progress
            waited = now - progress.since
            if pending and waited >= threshold_s:
                stalled.append(
                    {
                        "topic": processor.tp.topic,
                        "partition": processor.tp.partition,
                        "pending": pending,
                        "watermark": watermark,
                        "stalled_s": round(waited, 3),
                    }
                )
        self._progress = seen  # partitions no longer assigned are forgotten
        return stalled
