"""Settling a root onto the safe side of a boundary, in floating point.

A root finder (Brent's method) returns a point within its tolerance of the root; a certified
answer needs a point on the safe side (an epsilon whose delta is at most the target, a noise
multiplier that is large enough). Stepping one double at a time from the root to the safe side
takes as many steps as the tolerance holds doubles: about 1e21 where an absolute tolerance of
1e-15 meets a root near 1e-20. Bisection between a point on each side takes about 64 halvings
per factor 2^64 of the gap instead, and ends on two adjacent doubles.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["settle"]


def settle(safe: Callable[[float], bool], unsafe_point: float, safe_point: float) -> float:
    """The safe point nearest ``unsafe_point`` that bisection finds: bisect between a point where
    ``safe`` fails (``unsafe_point``) and one where it holds (``safe_point``) until the two are
    adjacent doubles, and return the safe one. ``safe`` must hold at ``safe_point``; neither
    point may be infinite or NaN. At most about 2,100 evaluations (a double's whole range),
    usually well under 100."""
    if not safe(safe_point):
        raise ValueError(f"safe_point={safe_point!r} does not satisfy the condition")
    bad, good = unsafe_point, safe_point
    while True:
        middle = bad + (good - bad) / 2.0
        if middle in (bad, good):
            return good
        if safe(middle):
            good = middle
        else:
            bad = middle
