"""Argument checks shared by every public entry point.

Each check raises :class:`ValueError` (or :class:`TypeError` for the wrong kind of object)
with a message that names the argument and states the valid range. Nothing is clamped: a
value outside the range is an error, never silently moved inside it. NaN and infinities are
rejected before any numerical routine sees them, so no routine can loop forever on them.

What counts as a number. A real number is an instance of :class:`numbers.Real` (Python ``int``
and ``float``, :class:`fractions.Fraction`, NumPy's integer and floating scalars) that is not a
boolean: ``True`` is an ``int`` to Python but never a noise multiplier or a probability, so a
bool is refused, as are strings ("0.5" is not parsed), ``None``, complex numbers and
:class:`decimal.Decimal`. An array of real numbers is an array of integer or floating dtype,
or a (nested) list or tuple of real numbers; arrays of bool, string, complex or object dtype
are refused, and so is a bool inside a list (NumPy would silently turn ``[True, 0.5]`` into
``[1.0, 0.5]``).
"""

from __future__ import annotations

import math
import numbers
import reprlib
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "is_real_number",
    "require_count",
    "require_delta",
    "require_epsilon",
    "require_positive_finite",
    "require_probability",
    "require_real",
    "require_real_array",
]

_REPR = reprlib.Repr()
_REPR.maxstring = 40
_REPR.maxother = 60
_REAL_DTYPE_KINDS = frozenset("iuf")  # signed and unsigned integers, floating point


def _show(value: object) -> str:
    """A short repr of ``value`` for an error message (long lists and arrays are elided)."""
    if isinstance(value, np.ndarray):
        return np.array2string(value, threshold=6, edgeitems=2)
    return _REPR.repr(value)


def is_real_number(value: object) -> bool:
    """Whether ``value`` is a real number scalar: a :class:`numbers.Real` that is not a bool
    (``numpy.bool_`` is not a :class:`numbers.Real` either)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def require_real(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite real number (see the module docstring:
    bools, strings, None and complex numbers are refused with a TypeError)."""
    if type(value) is not float and not is_real_number(value):
        raise TypeError(
            f"{name} must be a real number, got {_show(value)} ({type(value).__name__})"
        )
    try:
        result = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int or Fraction beyond the double range
        raise ValueError(f"{name} must be a finite number, got {_show(value)}") from None
    if not math.isfinite(result):
        raise ValueError(f"{name} must be a finite number, got {result!r}")
    return result


def _has_non_real_leaf(value: object) -> bool:
    """Whether a (nested) list or tuple holds anything but real numbers and real arrays."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, np.ndarray):
            if item.dtype.kind not in _REAL_DTYPE_KINDS:
                return True
        elif type(item) is not float and not is_real_number(item):
            return True
    return False


def require_real_array(
    name: str, value: Any, *, allow_infinite: bool = False
) -> npt.NDArray[np.float64]:
    """``value`` (a real number, an array or a nested sequence of real numbers) as a float64
    array of the same shape.

    TypeError for anything that is not real (module docstring); ValueError for NaN, and for
    +-inf unless ``allow_infinite``. The range of the values is for the caller to check.
    """
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (list, tuple)):
        if _has_non_real_leaf(value):
            raise TypeError(
                f"{name} must be a real number or an array of real numbers (no bool, str, "
                f"None or complex), got {_show(value)}"
            )
        try:
            array = np.asarray(value)
        except ValueError as exc:  # a ragged nesting
            raise TypeError(
                f"{name} must be a real number or a rectangular array of real numbers, got "
                f"{_show(value)}"
            ) from exc
    elif type(value) is float or is_real_number(value):
        array = np.asarray(value)
    else:
        raise TypeError(
            f"{name} must be a real number or an array of real numbers, got {_show(value)} "
            f"({type(value).__name__})"
        )
    if array.dtype.kind not in _REAL_DTYPE_KINDS:
        if array.dtype.kind != "O" or _has_non_real_leaf(array.tolist()):
            raise TypeError(
                f"{name} must be a real number or an array of real numbers, got an array of "
                f"dtype {array.dtype} ({_show(value)})"
            )
    try:
        result = np.asarray(array, dtype=np.float64)
    except OverflowError:
        raise ValueError(f"{name} must be finite, got {_show(value)}") from None
    if allow_infinite:
        if np.isnan(result).any():
            raise ValueError(f"{name} must not be NaN, got {_show(value)}")
    elif not np.isfinite(result).all():
        raise ValueError(f"{name} must be finite (no NaN or inf), got {_show(value)}")
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
