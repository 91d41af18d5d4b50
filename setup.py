"""Build: the package, with the modules of the per-task hot path compiled by mypyc.

The packages are listed here too (the Spark jobs install under a name of their own); every
other setting is in pyproject.toml. ``DECATON_AIO_PURE=1`` at build time skips the
compilation: the same package in pure Python, which passes the same tests. An editable
install (``pip install -e .``, ``make install``) builds the extensions in place, beside
their sources; Python imports an extension module before a ``.py`` file of the same name.
A compiled module must be built again after its source changes (the Makefile does, and
``tests/conftest.py`` refuses to test stale ones).

mypyc type-checks what it compiles without the project's mypy configuration (``make lint``
checks the strict one) and without the dependencies' types, which pip's build environment
does not have: what they give is an ``object`` to compiled code.
"""

from __future__ import annotations

import os

from setuptools import find_packages, setup

#: The compiled modules, by what they cost per task (bench/hotpath.py).
COMPILED = [
    "decaton_aio/consumer/_partition.py",
    "decaton_aio/consumer/_execution.py",
    "decaton_aio/consumer/_records.py",
    "decaton_aio/consumer/_watermark.py",
    "decaton_aio/consumer/_eager.py",
    "decaton_aio/_stats.py",
    "decaton_aio/_histogram.py",
    "decaton_aio/_context.py",
]


def extensions() -> list[object]:
    if os.environ.get("DECATON_AIO_PURE", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    # The dependencies are not installed where pip builds: their types are Any, and the
    # modules not compiled are read for their types only (their errors are silenced).
    options = ["--config-file=", "--ignore-missing-imports", "--follow-imports=silent"]
    options += ["--cache-dir=build/mypy-cache"]  # a fresh build checks everything again
    return list(mypycify([*options, *COMPILED], opt_level="3", group_name="decaton_aio._hot"))


# The Spark jobs live in spark_jobs/ and install as decaton_aio_spark: a name of this
# project's own, which no other distribution's package takes.
SPARK_PACKAGE = "decaton_aio_spark"

setup(
    packages=[*find_packages(include=["decaton_aio", "decaton_aio.*"]), SPARK_PACKAGE],
    package_dir={SPARK_PACKAGE: "spark_jobs"},
    ext_modules=extensions(),
)
