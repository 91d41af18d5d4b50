"""Waiting for task topics that do not exist yet.

Deployments often start a service before its topics are provisioned. As Kafka's own
consumers do, a subscription whose task topic is missing waits for it instead of failing:
`TopicWait` asks the cluster's metadata every `WAIT_INTERVAL_S` until every
task topic is listed, and logs once what it waits for. The subscription is not ready
meanwhile (``/readyz`` names the topics it waits for) and starts consuming, side topics
and group membership included, once they all exist.

A topic this client may not describe (no ``DESCRIBE`` permission) looks missing too: the
log line says so. Metadata requests name no topic, so a broker that creates topics on
first use does not create one for the wait.

Caller: the subscription's start, on its event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

import structlog
from aiokafka.errors import KafkaError

from decaton_aio._connect import start_admin
from decaton_aio.errors import BrokerError
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = ["WAIT_INTERVAL_S", "TopicWait"]

log = structlog.get_logger("decaton_aio.consumer")

#: How often a subscription waiting for its task topics asks the cluster for them.
WAIT_INTERVAL_S: Final = 2.0


class TopicWait:
    """Waits until every one of ``topics`` exists on the cluster.

    Args:
        bootstrap_servers: ``host:port[,host:port]`` of the cluster.
        topics: the topics to wait for.
        security: TLS and SASL settings of the admin client it asks through.
        interval_s: how long to wait between two looks.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: Sequence[str],
        *,
        security: SecuritySettings = PLAINTEXT,
        interval_s: float = WAIT_INTERVAL_S,
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._topics = tuple(topics)
        self._security = security
        self._interval_s = interval_s
        self._missing: tuple[str, ...] = ()

    @property
    def missing(self) -> tuple[str, ...]:
        """The topics the last look did not find (none before the first look, and none
        once all exist)."""
        return self._missing

    async def wait(self, stopped: asyncio.Event) -> bool:
        """Return once every topic exists, or once ``stopped`` is set.

        Returns:
            True when every topic exists; False when ``stopped`` was set first.

        Raises:
            SecurityError: TLS or SASL failed.
            BrokerError: the cluster cannot be reached or did not answer.
        """
        admin = await start_admin(self._bootstrap_servers, self._security)
        try:
            while True:
                try:
                    listed = set(await admin.list_topics())
                except KafkaError as exc:
                    raise BrokerError(
                        f"cannot look for the task topics {list(self._topics)} at "
                        f"{self._bootstrap_servers}: {exc!r}"
                    ) from exc
                missing = tuple(t for t in self._topics if t not in listed)
                if not missing:
                    if self._missing:
                        log.info("task topics found: starting", topics=list(self._topics))
                    self._missing = ()
                    return True
                if not self._missing:
                    log.warning(
                        "waiting for task topics to be created",
                        topics=list(missing),
                        why="the cluster does not list them (missing, or not visible to this "
                        "client); not ready until they exist",
                        interval_s=self._interval_s,
                    )
                self._missing = missing
                try:
                    async with asyncio.timeout(self._interval_s):
                        await stopped.wait()
                except TimeoutError:
                    continue
                self._missing = ()
                return False
        finally:
            await admin.close()
