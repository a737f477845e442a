"""The epsilon search of a query after every step: a composition held as a band looks for its
crossing next to the previous query's (``BandSpectrum.crossing`` with a hint) and must return
the bisection's answer, bit for bit, which a brute-force scan of the whole curve checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp._native import core as _core
from dpsharp.accountants import _pld_band

DELTA = 1e-5


def _gaussian_band(size: int = 2048, width: float = 40.0, centre: float = 600.0,
                   step: float = 0.01) -> _pld_band.BandSpectrum:
    """A band of the discretised Gaussian masses m_k ~ exp(-(k - centre)^2 / (2 width^2)) on a
    circle of ``size`` points (their real FFT, cut where it is below 1e-300)."""
    index = np.arange(size)
    masses = np.exp(-0.5 * ((index - centre) / width) ** 2)
    masses /= masses.sum()
    spectrum = np.fft.rfft(masses)
    band = int(np.flatnonzero(np.abs(spectrum) > 1e-300)[-1]) + 1
    return _pld_band.BandSpectrum(spectrum[: min(band, size // 4)], size, step)


def _brute_force_first(spectrum: _pld_band.BandSpectrum, first: int, constant: float,
                       delta: float) -> int | None:
    """The first index j >= first with A_j + constant - W_j <= delta, by evaluating the curve at
    every index (the definition)."""
    for index in range(first, spectrum.size):
        mass, weighted = _core.pld_band_suffix_sums(*spectrum._terms, index)
        if mass + constant - weighted <= delta:
            return index
    return None


@pytest.mark.parametrize("delta", [0.3, 1e-2, 1e-4, 1e-7])
def test_hinted_crossing_is_the_first_crossing_from_any_hint(delta: float) -> None:
    """From hints anywhere in the circle (at the crossing, next to it, far from it, at both
    ends), with the margin of an exactly evaluated curve (the masses are non-negative), the
    hinted search returns the bisection's answer, which is the first index at which the curve
    is at most delta (brute-force scan)."""
    spectrum = _gaussian_band()
    expected = _brute_force_first(spectrum, 1, 0.0, delta)
    assert expected is not None
    bisection = spectrum.crossing(1, 0.0, delta)
    assert bisection is not None and bisection[0] == expected
    margin = 10.0 * spectrum.error
    hints = {0, 1, 2, expected - 20, expected - 3, expected - 1, expected, expected + 1,
             expected + 5, expected + 200, spectrum.size - 1, spectrum.size + 50}
    for hint in hints:
        found = spectrum.crossing(1, 0.0, delta, hint=hint, margin=margin)
        assert found is not None
        assert found[0] == bisection[0]
        assert found[1:] == bisection[1:]  # the same (A, W) at j - 1, bit for bit


def test_hinted_crossing_bisects_where_the_margin_does_not_separate() -> None:
    """A margin wider than the curve's steps near the crossing (the curve is then not known to
    cross only once): the walk gives up and the bisection answers."""
    spectrum = _gaussian_band()
    calls: list[int] = []
    real = _core.pld_band_crossing

    def counting(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args)

    bisection = spectrum.crossing(1, 0.0, 1e-3)
    assert bisection is not None
    try:
        _pld_band._core.pld_band_crossing = counting  # type: ignore[attr-defined]
        wide = spectrum.crossing(1, 0.0, 1e-3, hint=bisection[0], margin=0.5)
        assert calls == [1] and wide == bisection
        near = spectrum.crossing(1, 0.0, 1e-3, hint=bisection[0], margin=10.0 * spectrum.error)
        assert calls == [1] and near == bisection  # separated: no bisection
    finally:
        _pld_band._core.pld_band_crossing = real  # type: ignore[attr-defined]


def test_query_after_every_step_walks_instead_of_bisecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps 1500 to 1600 of q = 0.01, sigma = 1 (held as a band): a query after each step
    finds its crossing next to the previous one, without the bisection over the circle (about
    15 evaluations of the band's closed forms, where the walk takes 2 to 4), and every answer
    checked is the fresh accountant's, bit for bit."""
    event = PoissonSampled(Gaussian(1.0), 0.01)
    accountant = PLDAccountant().compose(event, 1499)
    accountant.epsilon(DELTA)
    bisections: list[int] = []
    real = _core.pld_band_crossing

    def counting(*args):  # type: ignore[no-untyped-def]
        bisections.append(1)
        return real(*args)

    monkeypatch.setattr(_pld_band._core, "pld_band_crossing", counting)
    answers = {}
    for steps in range(1500, 1601):
        accountant.compose(event)
        answers[steps] = accountant.epsilon(DELTA)
    assert len(bisections) <= 5  # (a new circle or block may bisect once)
    monkeypatch.undo()
    for steps in (1500, 1537, 1600):
        assert answers[steps] == PLDAccountant().compose(event, steps).epsilon(DELTA)
    assert all(b >= a for a, b in zip(list(answers.values()), list(answers.values())[1:]))
    assert math.isfinite(answers[1600])
