"""``python -m bench``: run the benchmark scenarios (see ``bench/run.py``)."""

import sys

from bench.run import main

sys.exit(main())
