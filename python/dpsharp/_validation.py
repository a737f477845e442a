"""Argument checks shared by every public entry point.

Each check raises :class:`ValueError` (or :class:`TypeError` for the wrong kind of object)
with a message that names the argument and states the valid range. Nothing is clamped: a
value outside the range is an error, never silently moved inside it. NaN and infinities are
rejected before any numerical routine sees them, so no routine can loop forever on them.
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "require_count",
    "require_delta",
    "require_epsilon",
    "require_positive_finite",
    "require_probability",
    "require_real",
]


def require_real(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite real number (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be a finite number, got {result!r}")
    return result


def require_positive_finite(name: str, value: object) -> float:
    """``value`` in (0, inf)."""
    result = require_real(name, value)
    if result <= 0.0:
        raise ValueError(f"{name} must be in (0, inf), got {result!r}")
    return result


def require_probability(name: str, value: object, *, allow_zero: bool = False) -> float:
    """``value`` in (0, 1], or [0, 1] with ``allow_zero``."""
    result = require_real(name, value)
    low_ok = result >= 0.0 if allow_zero else result > 0.0
    if not (low_ok and result <= 1.0):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {interval}, got {result!r}")
    return result


def require_delta(value: object, name: str = "delta") -> float:
    """A target delta: in the open interval (0, 1)."""
    result = require_real(name, value)
    if not 0.0 < result < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {result!r}")
    return result


def require_epsilon(value: object, name: str = "epsilon") -> float:
    """A target epsilon: in [0, inf)."""
    result = require_real(name, value)
    if result < 0.0:
        raise ValueError(f"{name} must be in [0, inf), got {result!r}")
    return result


def require_count(name: str, value: object, *, minimum: int = 0) -> int:
    """An integer count >= ``minimum`` (bools and floats such as 3.0 are refused)."""
    if type(value) is int:  # the common case, without the abstract-class check below
        if value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    result = int(value)
    if result < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {result}")
    return result
