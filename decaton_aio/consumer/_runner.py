"""Running an application as a process: event loop, signals, properties, metrics.

`run_application()` is what ``python -m decaton_aio run`` calls once it has parsed its
arguments: it builds the live properties (code, file, environment, command line, in that
order of precedence), watches the properties file, serves metrics, runs the subscription
until SIGINT or SIGTERM, and shuts down gracefully. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from decaton_aio.app import Application, ConsumerConfig
from decaton_aio.consumer._health import HealthCheck, HealthConfig
from decaton_aio.consumer._subscription import Subscription
from decaton_aio.metrics import DEFAULT_METRICS_ADDR, Metrics
from decaton_aio.producer import ProducerConfig
from decaton_aio.properties import (
    FilePropertySource,
    KafkaPropertySource,
    Properties,
    properties_from_env,
)

__all__ = [
    "RunOptions",
    "freeze_startup_objects",
    "install_event_loop_policy",
    "load_properties",
    "run_application",
    "tune_gc",
]

log = structlog.get_logger("decaton_aio.consumer")

#: Exit code used when a second signal ends the process without draining.
EXIT_ON_SECOND_SIGNAL = 130


@dataclass(frozen=True)
class RunOptions:
    """How to run an application as a process.

    Attributes:
        consumer: the Kafka consumer settings.
        producer: the retry/dead letter producer settings (see
            [`Subscription`][decaton_aio.Subscription]).
        properties: property overrides from the command line (highest precedence).
        properties_file: a watched ``.json`` or ``.properties`` file of properties.
        properties_topic: a Kafka topic of property changes, read by every instance.
        metrics_port: serve Prometheus metrics, and the ``/healthz`` and ``/readyz`` probes,
            on this port (0: a free one; None: off).
        metrics_addr: the address the metrics endpoint listens on.
        metrics_port_file: write the bound metrics port here (how a supervisor finds its
            workers' endpoints).
        health: the probes' thresholds.
        environ: where ``DECATON_*`` property variables are read from.
    """

    consumer: ConsumerConfig
    producer: ProducerConfig | None = None
    properties: Mapping[str, object] = field(default_factory=dict)
    properties_file: Path | None = None
    properties_topic: str | None = None
    metrics_port: int | None = None
    metrics_addr: str = DEFAULT_METRICS_ADDR
    metrics_port_file: Path | None = None
    health: HealthConfig = field(default_factory=HealthConfig)
    environ: Mapping[str, str] | None = None


#: Generation-0 threshold set by `tune_gc()` (CPython's default is 700).
GC_GEN0_THRESHOLD = 50_000


def tune_gc() -> None:
    """Run the cyclic garbage collector less often.

    Every record, task context and future is a container object; with CPython's default
    thresholds the collector runs every 700 allocations and walks tens of thousands of
    live pending records each time (a fifth of the CPU of an I/O-bound run, measured with
    ``bench``). Nothing here builds reference cycles on the hot path, so collecting every
    50,000 allocations costs little memory and gives the CPU back.
    """
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 100)


def freeze_startup_objects() -> None:
    """Put every object alive now out of the cyclic garbage collector's reach.

    Modules, the application, its clients and the runtime's own structures are built once
    at startup and live as long as the process; a full collection would walk all of them
    each time (hundreds of milliseconds with the event loop held, measured under load).
    After ``gc.freeze()`` collections walk only what was made since. Objects frozen are
    never freed, which is what long-lived startup objects need anyway.
    """
    gc.collect()
    gc.freeze()


def install_event_loop_policy() -> bool:
    """Use uvloop when it is installed.

    Returns:
        True when uvloop is in use.
    """
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def _shut_down(app: Application) -> None:
    # Every shutdown hook runs, even after one failed; the first failure is raised.
    failure: Exception | None = None
    for hook in app.shutdown_hooks:
        try:
            await hook()
        except Exception as exc:
            log.error("an on_shutdown hook failed", hook=repr(hook), exc_info=exc)
            failure = failure or exc
    if failure is not None:
        raise failure


_PropertySource = FilePropertySource | KafkaPropertySource


async def load_properties(
    app: Application, options: RunOptions
) -> tuple[Properties, list[tuple[_PropertySource, str]]]:
    """``app``'s properties at start from every layer (the application's, the file, the
    topic, the environment, the command line), checked strictly, and the sources that
    keep changing them (not started).

    Raises:
        ConfigError: a property is unknown or a value not allowed; each problem names
            its layer.
        BrokerError: the properties topic cannot be read.
    """
    environ: Mapping[str, str] = options.environ if options.environ is not None else os.environ
    # Each source with what a start-time problem says of it (the topic's records outlive
    # the instance that applied or ignored them: the fix is a record, not a restart).
    sources: list[tuple[_PropertySource, str]] = []
    if options.properties_file:
        where = f"in the file {options.properties_file}"
        sources.append((FilePropertySource(options.properties_file), where))
    if options.properties_topic:
        topic = options.properties_topic
        from_topic = KafkaPropertySource(
            options.consumer.bootstrap_servers, topic, security=options.consumer.security
        )
        where = (
            f"in the properties topic {topic}: write a valid value for that name there, or "
            "a record with the name as key and no value to remove it"
        )
        sources.append((from_topic, where))
    layers: list[Mapping[str, Any]] = [app.properties]
    names = ["in Application(properties=...)"]
    for source, where in sources:
        layers.append(await source.load())
        names.append(where)
    layers += [properties_from_env(environ), options.properties]
    names += ["from the environment", "from --property"]
    return Properties(*layers, sources=names), sources


async def run_application(
    app: Application,
    options: RunOptions,
    *,
    on_started: Callable[[Subscription], Awaitable[None] | None] | None = None,
    install_signal_handlers: bool = True,
) -> None:
    """Run ``app`` until SIGINT/SIGTERM (or until the subscription stops by itself).

    The application's ``on_startup`` hooks are awaited once before consuming starts, its
    ``on_shutdown`` hooks once after the subscription drained and committed (not when a
    startup hook failed).

    Args:
        app: the application.
        options: consumer settings, property sources and metrics.
        on_started: called with the running subscription (e.g. to print where it runs).
        install_signal_handlers: stop on the first SIGINT/SIGTERM, exit at the second.

    Raises:
        ConfigError: when a property (from any source) is unknown or invalid.
        Exception: what a startup or shutdown hook raised.
    """
    tune_gc()
    properties, sources = await load_properties(app, options)
    metrics = Metrics()
    subscription = Subscription(
        app, options.consumer, producer=options.producer, properties=properties, metrics=metrics
    )
    if options.metrics_port is not None:
        probes = HealthCheck(subscription, options.health)
        port = metrics.start_http_server(options.metrics_port, options.metrics_addr, probes=probes)
        url = f"http://{options.metrics_addr}:{port}"
        log.info(
            "metrics endpoint", url=f"{url}/metrics", probes=[f"{url}/healthz", f"{url}/readyz"]
        )
        if options.metrics_port_file is not None:
            partial = options.metrics_port_file.with_suffix(".partial")
            partial.write_text(str(port))
            partial.replace(options.metrics_port_file)  # never seen half written
    loop = asyncio.get_running_loop()
    signals = 0
    stopping: set[asyncio.Task[None]] = set()

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second signal: exiting without draining")
            sys.stderr.flush()
            os._exit(EXIT_ON_SECOND_SIGNAL)
        log.info("signal received: shutting down", signal=signal.Signals(signum).name)
        stopping.add(loop.create_task(subscription.stop()))

    if install_signal_handlers:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)
    started_up = False
    try:
        for hook in app.startup_hooks:
            await hook()
        started_up = True
        if not signals:  # a signal during the startup hooks: nothing to consume
            await subscription.start()
            freeze_startup_objects()
            for index, (source, _) in enumerate(sources, start=1):  # 0: the application's
                await source.start(properties, layer=index)
            if on_started is not None:
                maybe = on_started(subscription)
                if maybe is not None:
                    await maybe
            await subscription.wait_stopped()
    finally:
        if subscription.state.value != "terminated":
            await subscription.stop()
        for source, _ in sources:
            await source.stop()
        if started_up:
            await _shut_down(app)
        metrics.stop()
        if install_signal_handlers:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
