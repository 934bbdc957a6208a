"""The ``python -m sdk.eval`` entry point (``summarize``, ``compare``): see ``sdk.eval._cli``."""

from __future__ import annotations

import contextlib

from sdk.eval._cli import main

if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
