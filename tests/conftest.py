"""Shared test setup: each test starts with the logging configuration it found; the
tests run on the modules compiled from the current sources, or on none; tests that kill
nodes share one three-node Apache Kafka (`three_node_cluster`)."""

from __future__ import annotations

import importlib.machinery
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

import decaton_aio
from decaton_aio.embedded import EmbeddedBroker, default_flavor
from decaton_aio.testing import BrokerHandle

#: The brokers' replica selector that has a consumer of a rack fetch from its replica.
RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


def _extensions() -> list[tuple[Path, Path | None]]:
    # (extension, source) of each extension module of the package under test (setup.py
    # builds them in place, beside their sources; mypyc's shared library has no source).
    found = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for extension in Path(decaton_aio.__file__).parent.rglob(f"*{suffix}"):
            source = extension.with_name(extension.name[: -len(suffix)] + ".py")
            found.append((extension, source if source.exists() else None))
    return found


def pytest_report_header() -> str:
    compiled = [source for _, source in _extensions() if source is not None]
    if not compiled:
        return "decaton_aio: pure Python"
    return f"decaton_aio: {len(compiled)} modules compiled (mypyc)"


def pytest_sessionstart(session: pytest.Session) -> None:
    # A compiled module is imported in place of its source: testing one built before its
    # source changed would test the old code. (The code of every compiled module is in one
    # shared library; a module's own extension only forwards to it.)
    extensions = _extensions()
    built = max((e.stat().st_mtime for e, _ in extensions), default=0.0)
    stale = [str(s) for _, s in extensions if s is not None and s.stat().st_mtime > built]
    if stale:
        pytest.exit(
            f"compiled modules older than their sources ({', '.join(stale)}): build them "
            "again with make install (or make test-unit-pure for the pure sources)",
            returncode=4,
        )


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    # The CLI configures logging onto the stream of the moment (a pytest capture that is
    # closed after the test); later tests must not write into it.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    config = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)


@pytest.fixture(scope="session")
def _three_nodes() -> Iterator[EmbeddedBroker]:
    if default_flavor() != "apache":
        pytest.skip("a three-node cluster is the embedded Apache Kafka's")
    broker = EmbeddedBroker(
        flavor="apache",
        nodes=3,
        startup_timeout_s=180,
        # A consumer that names its rack fetches from the replica in it.
        settings={"replica.selector.class": RACK_AWARE_SELECTOR},
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def three_node_cluster(_three_nodes: EmbeddedBroker) -> Iterator[BrokerHandle]:
    """A three-node Apache Kafka shared by the tests that kill a node (topics replicated 3
    times); the nodes a test killed are started again after it."""
    yield BrokerHandle(_three_nodes.bootstrap_servers, _three_nodes, replication_factor=3)
    for node_id in _three_nodes.killed_nodes():
        _three_nodes.restart_node(node_id)
