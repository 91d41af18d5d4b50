"""Spark test setup: one local SparkSession (``local[2]``) shared by the whole test session.

Starting Spark costs about 5 s and 0.7 GB, so every Spark test uses the session-scoped
``spark`` fixture. Without PySpark or Java the Spark tests are skipped with the reason;
``make install`` provides both.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from spark_jobs._session import find_java, local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The test session's SparkSession, with the ``decaton_kafka`` format registered."""
    if importlib.util.find_spec("pyspark") is None:
        pytest.skip("PySpark is not installed: pip install -e '.[spark]' (make install does)")
    if find_java() is None:
        pytest.skip(
            "Spark needs Java 17: apt-get install -y openjdk-17-jre-headless (make install "
            "does it when run as root), or set JAVA_HOME"
        )
    session = local_session("decaton-aio-tests", "local[2]")
    try:
        yield session
    finally:
        session.stop()
