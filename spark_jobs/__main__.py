"""Run a job: ``decaton-aio-spark JOB [ARGS]`` or ``python -m decaton_aio_spark JOB [ARGS]``.

``JOB`` is ``batch_repair`` or ``retry_backfill`` (``-`` may stand for ``_``); ``JOB
--help`` lists its options. Under ``spark-submit``, the main file built by ``make
spark-dist`` calls :func:`main` with the job and its arguments.
"""

from __future__ import annotations

import importlib
import sys
from typing import Final

__all__ = ["JOBS", "main"]

JOBS: Final = ("batch_repair", "retry_backfill")

_USAGE: Final = f"usage: decaton-aio-spark {{{','.join(JOBS)}}} [--help | JOB OPTIONS]"


def main(argv: list[str] | None = None) -> int:
    """Run the job named by the first argument with the rest; returns its exit code (2,
    after one line, for a missing or unknown job)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0
    job = argv[0].replace("-", "_") if argv else None
    if job not in JOBS:
        named = f"unknown job {argv[0]!r}" if argv else "no job named"
        print(f"decaton-aio-spark: {named}; {_USAGE}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__package__}.{job}")
    code: int = module.main(argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
