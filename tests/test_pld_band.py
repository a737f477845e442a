"""Compositions held as a band of low frequencies (``_pld_band.BandSpectrum``).

The closed-form suffix sums are checked against the masses of the trigonometric polynomial
summed directly in extended precision (an independent evaluation of the same definition); the
spectral queries of a long composition against the same composition held dense (one inverse
FFT), within the stated evaluation-error bound; and the certified bracket against the exact
Gaussian curve (mpmath)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.fft

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp._native import core as _core
from dpsharp.accountants import _pld_numerics, pld
from dpsharp.accountants._pld_band import BandSpectrum

from _gaussian_reference import exact_delta


def reference_masses(coefficients: np.ndarray, size: int) -> np.ndarray:
    """m_k = (1/n) [D_0 + 2 Re sum_f D_f e^{2 pi i f k / n}] in long double, term by term."""
    k = np.arange(size, dtype=np.longdouble)
    total = np.full(size, np.longdouble(coefficients[0].real))
    for f in range(1, coefficients.size):
        angle = (2 * np.pi * f / np.longdouble(size)) * k
        d = coefficients[f]
        total += 2 * (np.longdouble(d.real) * np.cos(angle) - np.longdouble(d.imag) * np.sin(angle))
    return total / size


def band_of_a_smooth_distribution(size: int, band: int, centre: float) -> np.ndarray:
    """The first ``band`` DFT coefficients of a discretised Gaussian bump on the circle (its
    spectrum decays like e^{-f^2 ...}, so the band holds it to double precision)."""
    k = np.arange(size)
    width = size / (2.0 * band) * 3.0
    mass = np.exp(-0.5 * ((k - centre) / width) ** 2)
    mass /= mass.sum()
    return np.fft.rfft(mass)[:band]


@pytest.mark.parametrize(
    ("size", "band", "grid_step"), [(512, 8, 0.01), (4096, 40, 1e-3), (30720, 100, 2e-4)]
)
def test_suffix_sums_match_the_masses_summed_directly(
    size: int, band: int, grid_step: float
) -> None:
    coefficients = band_of_a_smooth_distribution(size, band, centre=0.37 * size)
    spectrum = BandSpectrum(coefficients, size, grid_step)
    masses = reference_masses(coefficients, size)
    decay = np.exp(-np.longdouble(grid_step))
    for index in [-1, 0, 1, size // 3, size // 2, size - 2, size - 1]:
        above = masses[index + 1 :]
        expected_mass = float(np.sum(above))
        expected_weighted = float(
            np.sum(above * decay ** np.arange(1, above.size + 1, dtype=np.longdouble))
        )
        mass, weighted = spectrum.suffix_sums(index)
        assert abs(mass - expected_mass) <= spectrum.error + 1e-17
        assert abs(weighted - expected_weighted) <= spectrum.error + 1e-17
    # The error bound is small (a few hundred ulps of the total mass), not vacuous.
    assert spectrum.error < 1e-13


def test_masses_are_the_inverse_transform_of_the_band() -> None:
    size, band = 4096, 40
    coefficients = band_of_a_smooth_distribution(size, band, centre=1000.0)
    spectrum = BandSpectrum(coefficients, size, 1e-3)
    masses = scipy.fft.irfft(spectrum.full_spectrum(), size)
    np.testing.assert_allclose(
        masses, reference_masses(coefficients, size).astype(float), atol=1e-17
    )


def test_crossing_is_the_first_grid_point_at_or_below_delta() -> None:
    size, band, step = 4096, 40, 1e-3
    spectrum = BandSpectrum(
        band_of_a_smooth_distribution(size, band, centre=2000.0), size, step
    )
    masses = reference_masses(spectrum.coefficients, size).astype(float)
    tail_mass = np.concatenate((np.cumsum(masses[::-1])[::-1][1:], [0.0]))
    weights = np.array(
        [
            math.fsum(masses[j + 1 :] * np.exp(-step * np.arange(1, size - j)))
            for j in range(0, size, 1)
        ]
    )
    curve = tail_mass - weights
    for delta in (1e-2, 1e-4, 1e-7):
        expected = int(np.flatnonzero(curve <= delta)[0])
        found = spectrum.crossing(1, 0.0, delta)
        assert found is not None
        index, mass, weighted = found
        assert index == expected
        assert mass == pytest.approx(tail_mass[index - 1], abs=1e-15)
        assert weighted == pytest.approx(weights[index - 1], abs=1e-15)
    assert spectrum.crossing(1, 2e-3, 1e-3) is None  # the constant alone exceeds delta
    index, mass, _ = spectrum.crossing(size - 10, 0.0, 0.5)  # already below at `first`
    assert index == size - 10 and math.isnan(mass)


def test_bad_band_input_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        BandSpectrum(np.ones(300, dtype=complex), 512, 0.01)
    plain = np.zeros(8)
    with pytest.raises(ValueError, match="index"):
        _core.pld_band_suffix_sums(plain, plain, 1.0, 512, 0.01, 512)
    with pytest.raises(ValueError, match="equal length"):
        _core.pld_band_suffix_sums(plain, np.zeros(6), 1.0, 512, 0.01, 3)
    with pytest.raises(ValueError, match="first"):
        _core.pld_band_crossing(plain, plain, 1.0, 512, 0.01, -1, 0.0, 1e-5)


def composed(
    event: object, steps: int, *, spectral: bool, precision: float = 1e-3
) -> _pld_numerics.ComposedPLD:
    """The pessimistic remove-direction composition at the grid and tail an epsilon(1e-5) query
    uses, held as a band (shipped) or forced dense."""
    fraction = _pld_numerics.BAND_FRACTION if spectral else 10**18
    original = _pld_numerics.BAND_FRACTION
    _pld_numerics.BAND_FRACTION = fraction
    try:
        accountant = PLDAccountant(precision=precision)
        accountant.compose(event, steps)  # type: ignore[arg-type]
        return accountant._composed(
            "remove", True, accountant._grid_step(), pld._tail_for(1e-5, precision)
        )
    finally:
        _pld_numerics.BAND_FRACTION = original


def agreement_slack(band: _pld_numerics.ComposedPLD, dense: _pld_numerics.ComposedPLD) -> float:
    """How far the band's and the dense form's delta bounds can be apart: the band's sums err by
    at most its evaluation bound and the dense masses by the inverse transform's bound
    (``mass_noise``) plus their summation's (gamma relative, on masses of l1 norm ~1) and their
    clipped negative round-off; each bound is added to one side and subtracted from the other,
    and the two round-off bounds differ by the band's rotation term."""
    assert band.spectral is not None
    return (
        abs(band.noise - dense.noise)
        + 2.0 * band.spectral.error
        + 2.0 * dense.mass_noise
        + 2.0 * dense.roundoff
        + 3.0 * dense._summation * dense._mass_l1
        + 1e-16 * math.sqrt(dense.size)
    )


@pytest.mark.parametrize(
    ("event", "steps", "precision"),
    [
        (PoissonSampled(Gaussian(4.0), 0.01), 10_000, 1e-3),
        (PoissonSampled(Gaussian(0.5), 0.02), 5000, 6e-5),  # dense at the default precision
        (Gaussian(30.0), 2000, 1e-3),
    ],
)
def test_spectral_queries_agree_with_the_dense_composition(
    event: object, steps: int, precision: float
) -> None:
    band = composed(event, steps, spectral=True, precision=precision)
    dense = composed(event, steps, spectral=False, precision=precision)
    assert band.spectral is not None and dense.spectral is None
    assert band.spectral.coefficients.size <= band.size // 64
    # Same masses up to the inverse transform's round-off.
    assert np.max(np.abs(band.mass - dense.mass)) < 1e-18
    slack = agreement_slack(band, dense)
    eps = dense.epsilon(1e-5, pessimistic=True)
    for epsilon in (0.5 * eps, eps, 1.2 * eps):
        for pessimistic in (True, False):
            expected = dense.delta(epsilon, pessimistic=pessimistic)
            assert band.delta(epsilon, pessimistic=pessimistic) == pytest.approx(
                expected, abs=slack + 1e-11 * expected
            )
    for pessimistic in (True, False):
        assert band.epsilon(1e-5, pessimistic=pessimistic) == pytest.approx(
            dense.epsilon(1e-5, pessimistic=pessimistic), rel=1e-8
        )


def test_short_compositions_stay_dense() -> None:
    # Ten steps: the composed spectrum fills most of the circle.
    result = composed(PoissonSampled(Gaussian(1.0), 0.1), 10, spectral=True)
    assert result.spectral is None


@pytest.mark.parametrize(("mu", "steps", "delta"), [(1.0, 20_000, 1e-5), (3.0, 30_000, 1e-7)])
def test_spectral_bracket_holds_against_the_exact_gaussian_curve(
    mu: float, steps: int, delta: float
) -> None:
    # A composition of identical Gaussians is Gaussian with mu = sqrt(T) / sigma: the spectral
    # bounds must bracket the exact curve at every precision.
    sigma = math.sqrt(steps) / mu
    for precision in (1e-3, 1e-4):
        accountant = PLDAccountant(precision=precision).compose(Gaussian(sigma), steps)
        result = accountant._composed(
            "remove", True, accountant._grid_step(), pld._tail_for(delta, precision)
        )
        assert result.spectral is not None
        for epsilon in (0.5, 2.0, 4.0):
            lower, upper = accountant.delta_bounds(epsilon)
            assert lower <= exact_delta(epsilon, mu) <= upper


def test_spectral_epsilon_for_a_window_above_zero() -> None:
    """A composition whose window starts above loss 0 (10^7 steps of q = 0.01, sigma = 1): the
    epsilon query searches the band's closed forms from the window's first point on (no inverse
    transform of its 1.5M-point circle); its crossing is where the band's curve is delta, and
    the dense masses give the same delta there up to their round-off."""
    event = PoissonSampled(Gaussian(1.0), 0.01)
    band = composed(event, 10**7, spectral=True)
    dense = composed(event, 10**7, spectral=False)
    assert band.spectral is not None and band.start > 0
    eps = band.epsilon(1e-5, pessimistic=True)
    assert "mass" not in band.__dict__  # the masses were never formed
    assert band.delta(eps, pessimistic=True) == pytest.approx(1e-5, rel=1e-9)
    slack = agreement_slack(band, dense)
    assert abs(dense.delta(eps, pessimistic=True) - 1e-5) <= slack
    # The two forms carry different evaluation bounds (closed forms against formed masses).
    assert eps == pytest.approx(dense.epsilon(1e-5, pessimistic=True), rel=1e-8)
