"""Spark test setup: one local SparkSession (``local[2]``) shared by the whole test session,
and a standalone cluster (a master and 2 workers on loopback) for the jobs run against it.

Starting Spark costs about 5 s and 0.7 GB, so every Spark test uses the session-scoped
``spark`` fixture; the cluster, 10-20 s, is session-scoped too and started only by the
tests that ask for it. Without PySpark or Java the Spark tests are skipped with the
reason; ``make install`` provides both.
"""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from spark_jobs._session import find_java, local_session
from spark_jobs.standalone import StandaloneCluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _require_spark() -> None:
    if importlib.util.find_spec("pyspark") is None:
        pytest.skip("PySpark is not installed: pip install -e '.[spark]' (make install does)")
    if find_java() is None:
        pytest.skip(
            "Spark needs Java 17: apt-get install -y openjdk-17-jre-headless (make install "
            "does it when run as root), or set JAVA_HOME"
        )


def _closing_load_from_socket(sock_info: Any, serializer: Any) -> Iterator[Any]:
    """PySpark 4.1's ``_load_from_socket`` leaves its socket to the garbage collector (4.3
    closes it), which the suite's warnings-as-errors turns into a failure of whichever
    test runs then: the same read, closing the socket once read."""
    from pyspark.util import local_connect_and_auth

    sockfile, sock = local_connect_and_auth(sock_info[0], sock_info[1])
    sock.settimeout(None)
    try:
        yield from serializer.load_stream(sockfile)
    finally:
        sockfile.close()
        sock.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The test session's SparkSession, with Spark's Kafka connector."""
    _require_spark()
    import pyspark.core.context
    import pyspark.core.rdd
    import pyspark.sql.classic.dataframe

    patched = (pyspark.sql.classic.dataframe, pyspark.core.rdd, pyspark.core.context)
    with pytest.MonkeyPatch.context() as patch:
        for module in patched:
            patch.setattr(module, "_load_from_socket", _closing_load_from_socket)
        session = local_session("decaton-aio-tests", "local[2]")
        try:
            yield session
        finally:
            session.stop()


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[StandaloneCluster]:
    """A Spark standalone master and 2 workers of 1 core and 1 GB on loopback; stopped
    at the end with every JVM it started (checked)."""
    _require_spark()
    cluster = StandaloneCluster(workers=2, cores=1, memory="1g").start()
    groups = cluster.pids
    try:
        yield cluster
    finally:
        cluster.stop()
        left = _running_in(groups)
        assert not left, f"processes of the Spark cluster outlived it: {left}"


def _running_in(groups: list[int]) -> list[str]:
    """The live (not zombie) processes of the given process groups, as ps lists them."""
    listing = subprocess.run(
        ["ps", "-e", "-o", "pid=,pgid=,stat=,comm="], capture_output=True, text=True, check=True
    ).stdout
    return [
        line.strip()
        for line in listing.splitlines()
        if int(line.split()[1]) in groups and not line.split()[2].startswith("Z")
    ]
