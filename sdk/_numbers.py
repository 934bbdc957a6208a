"""What counts as a number in a value tracerl reads: a JSON row, a setting, a reward function's return.

``bool`` is an ``int`` in Python, but ``True`` is never a reward, a timeout or a temperature, so neither
predicate takes one; nor a string (``trainers.settings.coerce`` parses ``"0.5"`` from a flag on its own).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["is_finite_number", "is_number"]


def is_number(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or ``float`` and not a ``bool``; NaN and the infinities count.

    Example:
        >>> is_number(1.5), is_number(float("nan")), is_number(False), is_number("1")
        (True, True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a number a float holds finitely (not NaN, an infinity or an int like ``10**400``).

    Example:
        >>> is_finite_number(-3), is_finite_number(float("inf")), is_finite_number(10**400)
        (True, False, False)
    """
    try:
        return is_number(value) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False
