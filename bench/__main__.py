"""``python -m bench``: run the benchmark scenarios (see ``bench/run.py``)."""

import sys

from bench.cli import main

sys.exit(main())
