"""Building SparkSessions for the jobs and the tests, with Spark's Kafka connector.

This module owns the settings a Spark started from Python needs on these machines: the
Python workers must run this interpreter (they import aiokafka and this project), the
driver stays on loopback, the web UI is off, shuffles are small, and the Kafka connector's
jars (:mod:`spark_jobs._connector`) are on the classpath. :func:`local_session` builds
such a session, in local mode or against a standalone master (``spark://...``);
:func:`job_session` is what a job's ``main`` calls, so one job runs both under
``spark-submit`` (the session spark-submit configured, with the connector from its
``--packages``) and as ``python -m`` (a session of its own).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from decaton_aio.errors import ConfigError

from ._connector import connector_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "LOCAL_CONFIG",
    "REDACTION",
    "configure_environment",
    "find_java",
    "job_session",
    "local_session",
]

LOCAL_CONFIG: Final[Mapping[str, str]] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    # Python workers are reused across tasks, so the aiokafka import is paid once each.
    "spark.python.worker.reuse": "true",
}
"""Settings of a local session; ``config`` arguments override them."""

REDACTION: Final = ("spark.sql.redaction.options.regex", "(?i)url|jaas|password")
"""The kafka.sasl.jaas.config option holds a password: Spark redacts it wherever it shows
data source options (its default pattern only knows "url")."""

_PROJECT_ROOT: Final = str(Path(__file__).resolve().parent.parent)

_JAVA_HINT: Final = (
    "Spark needs Java 17 and none was found (no $JAVA_HOME/bin/java, no java on PATH). "
    "On Debian/Ubuntu, as root: apt-get update && apt-get install -y openjdk-17-jre-headless"
)


def find_java() -> str | None:
    """The java executable Spark will start, or ``None`` when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home, "bin", "java")
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("java")


def configure_environment() -> None:
    """Set the environment a local Spark must start with (before its JVM starts).

    ``PYSPARK_PYTHON`` becomes this interpreter, so the workers import the same packages;
    the project root joins ``PYTHONPATH``, so workers import ``spark_jobs`` and
    ``decaton_aio`` even without an installed package; ``SPARK_LOCAL_IP`` defaults to
    loopback.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PROJECT_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([_PROJECT_ROOT, *paths])


def local_session(
    app_name: str,
    master: str = "local[2]",
    *,
    config: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or join) a SparkSession with Spark's Kafka connector on its classpath.

    Takes about 5 s and 0.7 GB the first time in a process; later calls return the running
    session (settings of the first call win, as with ``getOrCreate``). The connector's jars
    are resolved with Maven on the first call ever (:func:`connector_jars`).

    Args:
        app_name: the application name Spark shows.
        master: ``local[2]`` for tests, ``local[*]`` for local job runs, or a standalone
            master ``spark://host:port`` (its executors run this interpreter).
        config: Spark settings on top of :data:`LOCAL_CONFIG`.

    Raises:
        ConfigError: when no Java is installed (the message says how to install it), or
            the connector cannot be resolved.
    """
    if find_java() is None:
        raise ConfigError(_JAVA_HINT)
    configure_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        **LOCAL_CONFIG,
        "spark.jars": ",".join(connector_jars()),
        # Executors of a cluster import this project as the driver does.
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
        REDACTION[0]: REDACTION[1],
        **(config or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def job_session(app_name: str, master: str | None = None) -> SparkSession:
    """The session of a job: spark-submit's when launched by it, else a local one.

    Args:
        app_name: the application name Spark shows.
        master: force a local master (e.g. ``local[2]``); ``None`` means the cluster under
            spark-submit and ``local[*]`` otherwise.
    """
    # spark-submit starts the JVM first and hands the Python driver its gateway port.
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName(app_name).getOrCreate()
        spark.conf.set(*REDACTION)
        return spark
    return local_session(app_name, master or "local[*]")
