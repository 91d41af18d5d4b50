"""The active SparkSession of a thread, which Spark needs to find a Python data source."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["activate"]


def activate(spark: SparkSession) -> None:
    """Make ``spark`` the active session of the calling thread, on the JVM side too.

    Spark looks up Python data sources for a write in the thread's *active* session, and
    only some PySpark calls set it (``createDataFrame`` does, ``df.write`` does not): a
    write from another thread than the one that built the session (``asyncio.to_thread``,
    a demo) would not find ``decaton_kafka``. :func:`spark_jobs.kafka_sink.write_topic`
    calls this itself.
    """
    from pyspark.sql import SparkSession

    SparkSession._activeSession = spark
    jvm_session_class = SparkSession._get_j_spark_session_class(spark._jvm)
    jvm_session_class.setActiveSession(spark._jsparkSession)
