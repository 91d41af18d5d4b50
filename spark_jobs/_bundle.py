"""What ``spark-submit`` needs to run the jobs from a source tree: ``make spark-dist``.

Writes into a directory (``dist/spark`` by default):

- ``decaton_aio_spark.zip`` for ``--py-files``: the jobs as the package
  ``decaton_aio_spark`` (as the wheel installs them) and ``decaton_aio``'s Python sources
  (no compiled module: the pure-Python package, which behaves the same);
- ``decaton_aio_spark_main.py``, the main file: ``spark-submit ... decaton_aio_spark_main.py
  JOB [ARGS]``.

Executors still need the third-party packages (``pip install 'decaton-aio[spark]'`` on
every node, or a packed environment given with ``--archives``).

    python -m spark_jobs._bundle [DIRECTORY]
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path
from typing import Final

__all__ = ["MAIN_FILE", "PACKAGE", "ZIP_FILE", "build"]

PACKAGE: Final = "decaton_aio_spark"
ZIP_FILE: Final = f"{PACKAGE}.zip"
MAIN_FILE: Final = f"{PACKAGE}_main.py"

_ROOT: Final = Path(__file__).resolve().parent.parent
_MAIN: Final = f'''"""spark-submit's main file for decaton-aio's Spark jobs: JOB [ARGS]."""

import sys

from {PACKAGE}.__main__ import main

sys.exit(main())
'''
# A fixed time, so the same sources give the same zip.
_DATE: Final = (2020, 1, 1, 0, 0, 0)


def _sources(package: Path) -> list[Path]:
    data = [p for p in package.rglob("*.xml") if "__pycache__" not in p.parts]
    return sorted([*package.rglob("*.py"), *data, *package.rglob("py.typed")])


def build(directory: Path) -> list[Path]:
    """Write the zip and the main file into ``directory``; return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    archive = directory / ZIP_FILE
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for name, package in (
            (PACKAGE, _ROOT / "spark_jobs"),
            ("decaton_aio", _ROOT / "decaton_aio"),
        ):
            for path in _sources(package):
                entry = zipfile.ZipInfo(f"{name}/{path.relative_to(package).as_posix()}", _DATE)
                entry.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(entry, path.read_bytes())
    main = directory / MAIN_FILE
    main.write_text(_MAIN)
    return [archive, main]


if __name__ == "__main__":
    for written in build(Path(sys.argv[1] if len(sys.argv) > 1 else "dist/spark")):
        print(written)
