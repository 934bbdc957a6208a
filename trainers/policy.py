"""Deprecated: the policy handles moved to :mod:`trainers.serve.policy`; this name keeps working.

Example:
    >>> from trainers.serve.policy import make_policy  # the new path
"""

from __future__ import annotations

import warnings

from trainers.serve.policy import *  # noqa: F403
from trainers.serve.policy import __all__  # noqa: F401

warnings.warn(
    "trainers.policy moved to trainers.serve.policy; import it from there", DeprecationWarning, stacklevel=2
)
