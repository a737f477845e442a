"""dpsharp._roots.settle: bisection onto the safe side of a boundary, against boundaries known
exactly in floating point."""

from __future__ import annotations

import math

import pytest

from dpsharp._roots import settle


def test_settle_ends_on_adjacent_doubles_on_the_safe_side() -> None:
    boundary = 1e-20  # safe: x >= boundary; the unsafe start is 1e-15 away (about 1e21 doubles)
    calls = []

    def safe(x: float) -> bool:
        calls.append(x)
        return x >= boundary

    result = settle(safe, 0.0, 1.0)
    assert result == boundary
    assert len(calls) < 2200
    # the other direction: safe below a boundary
    assert settle(lambda x: x <= 3.0, 7.5, -2.0) == 3.0
    assert settle(lambda x: x <= math.pi, 4.0, 3.0) == math.pi


def test_settle_refuses_a_safe_point_that_is_not_safe() -> None:
    with pytest.raises(ValueError, match="safe_point"):
        settle(lambda x: x > 2.0, 0.0, 1.0)
