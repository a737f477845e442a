"""Incremental accounting (a query after every step): the work of one more step of an event
already composed, and its answer against a fresh accountant's."""

from __future__ import annotations

import pytest

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp.accountants import pld


def test_incremental_step_discretises_nothing_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """One more step of an event already composed (same grid, same truncation bucket): no leaf
    is discretised again (the short-composition check reuses its leaf sizes), and the answer
    is the fresh accountant's, bit for bit."""
    event = PoissonSampled(Gaussian(1.0), 0.01)
    accountant = PLDAccountant().compose(event, 1800)
    accountant.epsilon(1e-5)
    calls: list[int] = []
    real = pld._discretize

    def counting(keys, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(keys))
        return real(keys, *args, **kwargs)

    monkeypatch.setattr(pld, "_discretize", counting)
    accountant.compose(event)
    incremental = accountant.epsilon(1e-5)
    assert sum(calls) == 0
    monkeypatch.setattr(pld, "_discretize", real)
    assert incremental == PLDAccountant().compose(event, 1801).epsilon(1e-5)
