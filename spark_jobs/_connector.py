"""Spark's Kafka connector (format ``kafka``): which one the jobs need, and its jars.

The connector is a JVM jar, ``org.apache.spark:spark-sql-kafka-0-10_2.13``, of the same
version as PySpark. On a user's cluster it is given the usual way (``spark-submit
--packages`` :func:`package`). For local sessions and the project's own cluster, Maven
resolves it once, through the pom in ``connector-pom/`` beside this module, into the
user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``, then
``decaton-aio/spark-kafka-<version>``); later runs use the cached jars without the
network. The jars are the connector, Spark's Kafka token provider, ``kafka-clients`` and
``commons-pool2``: everything else the connector needs ships with PySpark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from decaton_aio.embedded._maven import cache_root, maven_into_cache
from decaton_aio.errors import ConfigError

__all__ = ["ARTIFACT", "connector_jars", "package", "spark_version"]

ARTIFACT: Final = "org.apache.spark:spark-sql-kafka-0-10_2.13"
"""The connector's Maven group and artifact (Scala 2.13, as PySpark 4 is built)."""

_POM: Final = Path(__file__).parent / "connector-pom" / "pom.xml"


def spark_version() -> str:
    """The installed PySpark's version, which the connector's must equal."""
    import pyspark

    return pyspark.__version__


def package(version: str | None = None) -> str:
    """The connector's Maven coordinates for ``spark-submit --packages``."""
    return f"{ARTIFACT}:{version or spark_version()}"


def connector_jars(version: str | None = None) -> list[str]:
    """The connector's jars for ``spark.jars``, resolved with Maven on first use.

    Args:
        version: the Spark version; the installed PySpark's by default.

    Returns:
        The paths of the cached jars.

    Raises:
        ConfigError: when Maven is missing or cannot resolve the connector (e.g. no
            connector of that version on the Maven repository reached).
    """
    version = version or spark_version()

    def arguments(staging: Path) -> list[str]:
        return [
            "--file",
            str(_POM),
            "dependency:copy-dependencies",
            f"-Dspark.version={version}",
            f"-DoutputDirectory={staging}",
        ]

    def error(message: str) -> ConfigError:
        return ConfigError(f"{message}\n(Spark's Kafka connector {package(version)})")

    cache = maven_into_cache(
        cache_root() / f"spark-kafka-{version}",
        arguments,
        what=f"Spark's Kafka connector {version}",
        error=error,
    )
    return sorted(str(jar) for jar in cache.glob("*.jar"))
