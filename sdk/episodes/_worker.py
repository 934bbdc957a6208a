"""Entry point of a parallel-export worker process: ``python -m sdk.episodes._worker JOB``."""

from __future__ import annotations

import sys

from sdk.episodes._parallel import run_job

if __name__ == "__main__":
    sys.exit(run_job(sys.argv[1]))
