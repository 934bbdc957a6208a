"""``python -m sdk.rollout``: see :mod:`sdk.rollout`."""

import contextlib

from sdk.rollout._cli import main

if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
