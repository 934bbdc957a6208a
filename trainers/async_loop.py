"""Deprecated: the asynchronous loop moved to :mod:`trainers.loop.continuous`; this name keeps working.

Example:
    >>> from trainers.loop.continuous import run_async  # the new path
"""

from __future__ import annotations

import warnings

from trainers.loop.continuous import run_async

__all__ = ["run_async"]

warnings.warn(
    "trainers.async_loop moved to trainers.loop.continuous; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
