"""The proven round-off bound of the FFT composition (module docstring of
``dpsharp.accountants._pld_numerics``), against exact arithmetic.

References, independent of the code under test: the DFT of small vectors in mpmath at 40 digits;
compositions of small discretised PLDs by exact integer convolution (every double is an integer
times a power of two, so a convolution of T copies is an integer vector over a power of two,
folded onto the circle exactly); hockey-stick sums of those exact masses with mpmath weights. Each
computed transform entry, mass and delta sum must lie within its proven bound, and the bound
must not be absurdly loose (within 10^4 of the error seen on the same case). The accountant's
pessimistic delta must stay above the exact delta of its own discretised composition, and a
composition whose round-off floor already exceeds delta is refused before anything is
allocated."""

from __future__ import annotations

import math
import time
import tracemalloc
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp._native import core
from dpsharp.accountants import _pld_numerics as numerics
from dpsharp.accountants._pld_numerics import DiscretePLD

def exact_dft(values: np.ndarray, size: int, frequencies: range) -> list[mpmath.mpc]:
    with mpmath.workdps(40):
        return [
            mpmath.fsum(
                mpmath.mpf(float(v)) * mpmath.expjpi(mpmath.mpf(-2 * ((f * s) % size)) / size)
                for s, v in enumerate(values)
            )
            for f in frequencies
        ]


def integer_masses(mass: np.ndarray) -> tuple[list[int], int]:
    """(M, e) with mass[s] = M[s] 2^-e exactly (every double is an integer times a power of 2)."""
    fractions = [Fraction(value) for value in mass.tolist()]
    exponent = max(f.denominator.bit_length() - 1 for f in fractions)
    out = []
    for fraction in fractions:
        scaled = fraction * (1 << exponent)
        assert scaled.denominator == 1
        out.append(int(scaled))
    return out, exponent


def convolve(a: list[int], b: list[int]) -> list[int]:
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] += x * y
    return out


def exact_composition(plds: list[DiscretePLD], counts: list[int]) -> tuple[int, list[int], int]:
    """(offset, M, e) of the linear composition: masses M[k] 2^-e at loss (offset + k) h."""
    result: list[int] = [1]
    offset = exponent = 0
    for pld, count in zip(plds, counts):
        base, scale = integer_masses(pld.mass)
        offset += pld.offset * count
        exponent += scale * count
        power: list[int] = [1]
        while count:
            if count & 1:
                power = convolve(power, base)
            count >>= 1
            if count:
                base = convolve(base, base)
        result = convolve(result, power)
    return offset, result, exponent


def folded_window(offset: int, masses: list[int], start: int, size: int) -> list[int]:
    """The linear composition folded onto the circle, entry j at loss (start + j) h."""
    out = [0] * size
    for k, m in enumerate(masses):
        out[(offset + k - start) % size] += m
    return out


def to_float_error(exact: list[int], exponent: int, computed: np.ndarray) -> np.ndarray:
    denominator = 1 << exponent
    return np.array(
        [
            abs(float(Fraction(e, denominator) - Fraction(c)))
            for e, c in zip(exact, computed.tolist())
        ]
    )


def exact_hockey_stick(
    exact: list[int], exponent: int, start: int, grid_step: float, eps: float
) -> mpmath.mpf:
    """sum_k m_k (1 - e^{eps - l_k})_+ over the window, at 50 digits."""
    with mpmath.workdps(50):
        scale = mpmath.mpf(2) ** (-exponent)
        total = mpmath.mpf(0)
        for j, m in enumerate(exact):
            loss = mpmath.mpf(start + j) * mpmath.mpf(grid_step)
            if m and loss > eps:
                total += m * scale * (1 - mpmath.exp(mpmath.mpf(eps) - loss))
        return total


def random_pld(seed: int, length: int, offset: int, grid_step: float) -> DiscretePLD:
    rng = np.random.default_rng(seed)
    mass = rng.random(length) ** 3
    mass /= mass.sum() * (1.0 + 1e-3)  # a little mass at +inf
    return DiscretePLD(offset, mass, float(1.0 - mass.sum()), grid_step)


# ----------------------------------------------------------------------------- the transforms


@pytest.mark.parametrize(
    ("length", "size"),
    [(5, 16), (40, 72), (60, 96), (100, 240), (300, 320), (150, 480), (3, 8), (56, 56),
     (30, 88), (104, 104), (200, 208)],
)
def test_forward_transform_within_its_componentwise_bound(length: int, size: int) -> None:
    """Every odd factor's first stage (1, 9, 3, 15, 5, 7, 11, 13: real products of the real
    input, its rows up to (m - 1) / 2) and the radix-2 stages after it, each computing the
    lower half of its partial transforms (the entries above a quarter of each length are
    conjugates of other butterflies' outputs), at every frequency against the DFT at 40
    digits."""
    values = np.random.default_rng(size).random(length)
    computed = numerics.certified_forward(values, size)
    exact = exact_dft(values, size, range(size // 2 + 1))
    errors = np.array([abs(complex(c) - complex(e)) for c, e in zip(computed, exact)])
    bound = numerics.forward_error(size) * float(values.sum())
    assert np.all(errors <= bound)
    assert bound <= 1e4 * errors.max()


@pytest.mark.parametrize(
    ("lengths", "size", "folds"),
    [((5, 16), 16, False), ((40, 13), 72, False), ((100, 240), 240, False), ((150, 90), 480, False),
     ((700, 200), 240, True)],
)
def test_pair_transform_within_its_componentwise_bound(
    lengths: tuple[int, int], size: int, folds: bool
) -> None:
    """Two PLDs' transforms by one complex transform (first + i second), each within its own
    bound of the exact DFT of its folded masses (40 digits), at every frequency; masses of
    very different sizes (the bound is on the sum of the two l1 norms) and, with ``folds``,
    longer than the circle."""
    rng = np.random.default_rng(sum(lengths) + size)
    first = DiscretePLD(0, rng.random(lengths[0]) ** 3, 0.0, 0.5)
    second = DiscretePLD(0, 1e-3 * rng.random(lengths[1]), 0.0, 0.5)
    computed = numerics.certified_forward_pair(first.folded(size), second.folded(size), size)
    bounds = numerics._pair_errors(first, second, size)
    assert (first.mass.size > size) == folds
    worst = 0.0
    for pld, transform, bound in zip((first, second), computed, bounds):
        # The DFT of the masses at the circle's frequencies is that of the folded masses.
        exact = exact_dft(pld.mass, size, range(size // 2 + 1))
        errors = np.array([abs(complex(c) - complex(e)) for c, e in zip(transform, exact)])
        assert np.all(errors <= bound)
        worst = max(worst, float(errors.max()))
    assert max(bounds) <= 1e5 * worst


@pytest.mark.parametrize(
    ("length", "size", "reach"), [(7, 16, 9), (300, 960, 40), (1000, 3840, 25), (900, 1280, 321)]
)
def test_band_transform_within_its_componentwise_bound(length: int, size: int, reach: int) -> None:
    values = np.random.default_rng(length).random(length)
    computed = numerics.certified_band(values, size, reach)
    exact = exact_dft(values, size, range(reach))
    errors = np.array([abs(complex(c) - complex(e)) for c, e in zip(computed, exact)])
    bound = numerics.band_dft_error(length, size) * float(values.sum())
    assert np.all(errors <= bound)
    assert bound <= 1e4 * errors.max()


@pytest.mark.parametrize(("length", "size"), [(3000, 15360), (40_000, 122_880)])
def test_band_transform_bits_do_not_depend_on_its_route(length: int, size: int) -> None:
    """The direct sums of a band are the same numbers whichever way they are taken: frequencies
    four at a time or one (a reach that is not a multiple of four), with the twiddles from the
    table of the whole circle (many terms per point, circles up to 2^16) or from the quarter
    table (few terms), on one thread or several."""
    values = np.random.default_rng(length).random(length)
    values[::7] = 0.0
    few = 4 * size // length - 1  # fewer terms than four per point of the circle
    many = 97
    reference = core.pld_certified_band_dft(values, size, many, threads=1)
    for threads in (1, 2, 3):
        np.testing.assert_array_equal(
            reference, core.pld_certified_band_dft(values, size, many, threads=threads)
        )
        for reach in (1, 2, few):
            np.testing.assert_array_equal(
                reference[:reach], core.pld_certified_band_dft(values, size, reach, threads=threads)
            )
    with pytest.raises(ValueError, match="threads"):
        core.pld_certified_band_dft(values, size, many, threads=0)


@pytest.mark.parametrize("size", [16, 80, 192])
def test_inverse_transform_within_its_normwise_bound(size: int) -> None:
    rng = np.random.default_rng(size)
    spectrum = rng.standard_normal(size // 2 + 1) + 1j * rng.standard_normal(size // 2 + 1)
    spectrum[0] = spectrum[0].real
    spectrum[-1] = spectrum[-1].real
    computed = numerics.certified_inverse(spectrum, size)
    with mpmath.workdps(40):
        full = [mpmath.mpc(complex(z)) for z in spectrum] + [
            mpmath.mpc(complex(np.conj(spectrum[size - f]))) for f in range(size // 2 + 1, size)
        ]
        exact = [
            mpmath.re(
                mpmath.fsum(
                    full[f] * mpmath.expjpi(mpmath.mpf(2 * ((f * j) % size)) / size)
                    for f in range(size)
                )
            )
            / size
            for j in range(size)
        ]
    error_l1 = float(sum(abs(mpmath.mpf(float(c)) - e) for c, e in zip(computed, exact)))
    norm = math.sqrt(sum(abs(complex(z)) ** 2 for z in full))
    bound = numerics.inverse_error(size) * norm
    assert error_l1 <= bound
    assert bound <= 1e4 * error_l1


def long_double_twiddles(phases: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and -sin of 2 pi phases / size in long double (64-bit significand), phases reduced
    mod size in integers first: within a few 2^-64 of the exact values."""
    two_pi = np.longdouble("6.28318530717958647692528676655900577")
    assert abs(float(two_pi - np.longdouble(2 * math.pi))) < 1e-15  # parsed in long double
    angle = two_pi * ((phases % size).astype(np.longdouble) / size)
    return np.cos(angle), -np.sin(angle)


@pytest.mark.parametrize("size", [3 << 13, 1 << 15])
def test_large_forward_transform_within_its_bound(size: int) -> None:
    """Circles past one cache block (4096 points): the blocked stages and the larger ones, taken
    two per pass and split over columns, at frequencies spread over the half spectrum (both
    sides of each quarter, where a stage's own outputs give way to the conjugated ones),
    against the DFT summed in long double (its own error, at most 8 size 2^-64 ||x||_1 with the
    twiddles', is added to the bound)."""
    values = np.random.default_rng(size).random(size - 7)
    computed = numerics.certified_forward(values, size)
    positions = np.arange(values.size, dtype=np.int64)
    slack = 8 * size * 2.0**-64 * float(values.sum())
    bound = numerics.forward_error(size) * float(values.sum())
    worst = 0.0
    for f in [0, 1, 3, 1000, 2049, 3071, size // 8 - 1, size // 8 + 1, size // 4 - 1,
              size // 4, size // 4 + 1, 3 * size // 8 + 5, size // 2 - 1, size // 2]:
        cos, sin = long_double_twiddles(f * positions, size)
        x = values.astype(np.longdouble)
        exact = complex(float(np.sum(x * cos)), float(np.sum(x * sin)))
        error = abs(complex(computed[f]) - exact)
        assert error <= bound + slack
        worst = max(worst, error)
    assert bound <= 1e4 * worst


def test_large_inverse_transform_within_its_bound() -> None:
    """The spectrum of three point masses, rounded to doubles: the exact inverse of the rounded
    spectrum is the three masses plus the inverse of the rounding, whose l1 norm is at most the
    rounding's 2-norm (Parseval and Cauchy-Schwarz), so the computed inverse must be within the
    proven bound plus that (the rounding measured against long double twiddles, each within
    2^-60 of the exact one)."""
    size = 1 << 15
    spikes = {5: 0.25, 4097: 0.5, size - 3: 0.125}
    frequencies = np.arange(size // 2 + 1, dtype=np.int64)
    exact_re = np.zeros(frequencies.size, dtype=np.longdouble)
    exact_im = np.zeros(frequencies.size, dtype=np.longdouble)
    for position, mass in spikes.items():
        cos, sin = long_double_twiddles(frequencies * position, size)
        exact_re += np.longdouble(mass) * cos
        exact_im += np.longdouble(mass) * sin
    spectrum = exact_re.astype(float) + 1j * exact_im.astype(float)
    multiplicity = np.where((frequencies == 0) | (2 * frequencies == size), 1.0, 2.0)
    rounding = np.hypot(
        (spectrum.real - exact_re).astype(float), (spectrum.imag - exact_im).astype(float)
    ) + 2.0**-60
    rounding_l2 = math.sqrt(float(np.sum(multiplicity * rounding**2)))
    computed = numerics.certified_inverse(spectrum, size)
    reference = np.zeros(size)
    for position, mass in spikes.items():
        reference[position] = mass
    norm = math.sqrt(float(np.sum(multiplicity * np.abs(spectrum) ** 2)))
    error_l1 = float(np.abs(computed - reference).sum())
    assert error_l1 <= numerics.inverse_error(size) * norm + rounding_l2
    assert error_l1 > 0.0


@pytest.mark.parametrize("size", [240, 15 << 10, 1 << 14, 5 << 15])
def test_short_leaf_transforms_as_its_zero_padded_circle(size: int) -> None:
    """A leaf shorter than its circle is transformed from its own masses (``on_circle``): the
    transform skips the missing zeros (whole decimated groups, and the tail of each first-stage
    sum), which must give the numbers of the explicitly zero-padded circle (an exact zero added
    changes no sum); a leaf longer than the circle is folded as before."""
    rng = np.random.default_rng(size)
    for length in (1, 7, size // 3, size // 2 + 5, size - 1, size):
        pld = random_pld(length, length, -3, 0.01)
        padded = np.zeros(size)
        padded[:length] = pld.mass
        np.testing.assert_array_equal(
            numerics.certified_forward(pld.on_circle(size), size),
            numerics.certified_forward(padded, size),
        )
    longer = DiscretePLD(0, rng.random(size + size // 3), 0.0, 0.01)
    np.testing.assert_array_equal(longer.on_circle(size), longer.folded(size))


@pytest.mark.parametrize("size", [1 << 17, 5 << 15])
def test_transform_bits_do_not_depend_on_threads(size: int) -> None:
    values = np.random.default_rng(3).random(size - 11)
    one = core.pld_certified_rfft(values, size, threads=1)
    np.testing.assert_array_equal(one, core.pld_certified_rfft(values, size, threads=2))
    np.testing.assert_array_equal(one, core.pld_certified_rfft(values, size, threads=3))
    back = core.pld_certified_irfft(one, size, threads=1)
    np.testing.assert_array_equal(back, core.pld_certified_irfft(one, size, threads=2))
    with pytest.raises(ValueError, match="threads"):
        core.pld_certified_rfft(values, size, threads=0)


# ----------------------------------------------------------------------------- compositions


def check_against_exact(
    result: numerics.ComposedPLD, plds: list[DiscretePLD], counts: list[int]
) -> float:
    """Asserts every mass, the l1 error and hockey-stick sums within the proven bounds; returns
    the observed error of the hockey-stick sums, the largest over a few epsilons."""
    with mpmath.workdps(50):
        infinity = 1 - mpmath.fprod(
            (1 - mpmath.mpf(pld.infinity_mass)) ** count for pld, count in zip(plds, counts)
        )
    offset, masses, exponent = exact_composition(plds, counts)
    exact = folded_window(offset, masses, result.start, result.size)
    errors = to_float_error(exact, exponent, result.mass)
    assert errors.sum() <= result.mass_error
    observed = 0.0
    losses = result.losses
    for eps in np.quantile(losses, [0.2, 0.5, 0.8]).tolist():
        exact_sum = exact_hockey_stick(exact, exponent, result.start, result.grid_step, eps)
        above = losses > eps
        computed_sum = float(np.dot(result.mass[above], -np.expm1(eps - losses[above])))
        error = abs(float(exact_sum - mpmath.mpf(computed_sum)))
        assert error <= result.noise + result.mass_noise + result._summation * result._mass_l1
        observed = max(observed, error)
        # The certified sides, with the window's own tails: the exact circular sum lies between.
        exact_delta = exact_sum + infinity
        assert result.delta(eps, pessimistic=True) >= exact_delta
        assert result.delta(eps, pessimistic=False) <= exact_delta
    return observed


@pytest.mark.parametrize(("length", "count"), [(12, 7), (20, 40), (6, 100)])
def test_one_pld_power_against_exact_convolution(length: int, count: int) -> None:
    pld = random_pld(length, length, -length // 3, 2.0**-4)
    result = numerics.compose([pld], [count], log_tail=math.log(1e-12), pessimistic=True)
    assert result.spectral is None
    observed = check_against_exact(result, [pld], [count])
    assert result.noise <= 1e4 * max(observed, 1e-300)


def test_two_plds_against_exact_convolution() -> None:
    plds = [random_pld(1, 15, -4, 2.0**-4), random_pld(2, 9, -1, 2.0**-4)]
    counts = [11, 6]
    result = numerics.compose(plds, counts, log_tail=math.log(1e-12), pessimistic=True)
    observed = check_against_exact(result, plds, counts)
    assert result.noise <= 1e4 * observed


def test_products_route_against_exact_convolution() -> None:
    # The route of staged and two-level compositions (complex products, integer powers).
    plds = [
        random_pld(3, 20, -6, 2.0**-3), random_pld(4, 11, -2, 2.0**-3), random_pld(5, 7, 0, 2.0**-3)
    ]
    counts = [9, 4, 17]
    result = numerics._compose_by_products(plds, counts, math.log(1e-12), parallel=False)
    observed = check_against_exact(result, plds, counts)
    assert result.noise <= 1e4 * observed


def test_products_route_drops_dead_frequencies_within_its_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Smooth PLDs composed 60 times: their powers' product falls below e^-748 at the high
    frequencies, which the products route stops computing (a shorter prefix for each later
    factor, product 0 there); the masses, their l1 error and the hockey-stick sums stay within
    the proven bounds against the exact integer convolution (a threshold that dropped live
    frequencies would break the mass bounds)."""
    plds = []
    for index, points in enumerate((20, 24, 16)):  # binomial masses: |F(w)| = cos(w / 2)^n
        mass = np.array([math.comb(points, k) for k in range(points + 1)], dtype=float)
        mass /= mass.sum() * (1.0 + 1e-4)
        plds.append(DiscretePLD(-3 + index, mass, float(1.0 - mass.sum()), 2.0**-4))
    counts = [20, 24, 16]
    lengths: list[int] = []  # the live prefix each factor is powered on
    multiply = numerics._core.pld_multiply_factor

    def recording(*args: object) -> int:
        live = multiply(*args)
        lengths.append(live)
        return live

    monkeypatch.setattr(numerics._core, "pld_multiply_factor", recording)
    result = numerics._compose_by_products(plds, counts, math.log(1e-12), parallel=False)
    assert lengths[-1] < lengths[0] <= result.size // 2 + 1  # frequencies were dropped
    check_against_exact(result, plds, counts)


def test_parts_carry_their_mass_error() -> None:
    """A composed part turned into a PLD adds its proven mass error at the window's top point
    (pessimistic) or removes that much mass from its top (optimistic), so the next level needs
    no input error."""
    pld = random_pld(6, 20, -5, 2.0**-4)
    part = numerics.compose([pld], [30], log_tail=math.log(1e-12), pessimistic=True)
    assert part.mass_error > 0.0
    upper, excess, _ = numerics._as_pld(part, pessimistic=True)
    assert excess == 0.0
    assert upper.mass[-1] >= max(part.mass[-1], 0.0) + part.mass_error
    # (the +inf mass rounded up past its evaluation error and the sum's rounding)
    assert upper.infinity_mass >= part.infinity_mass + part.infinity_error + part.above
    assert upper.infinity_mass <= (part.infinity_mass + part.above) * (1 + 1e-12)
    lower, lower_excess, _ = numerics._as_pld(part, pessimistic=False)
    assert lower_excess == part.above + part.below
    removed = math.fsum(np.maximum(part.mass, 0.0)) - math.fsum(lower.mass)
    assert removed >= part.mass_error - 1e-15  # (the two sums are near 1: 1e-16 each)
    # removed from the top: the low end is untouched
    np.testing.assert_array_equal(lower.mass[:5], np.maximum(part.mass[:5], 0.0))


def test_accountant_upper_delta_above_its_discretised_composition() -> None:
    """The accountant's certified delta against the delta of the composition of its own
    discretised PLD, convolved in long double (64-bit significand: its own rounding, gamma_N with
    u = 2^-64 on sums of non-negative terms, is added to the reference) -- the FFT composition's
    round-off must never bring the certified value below it."""
    # Subsampled (q < 1): a plain Gaussian composition is answered by its closed form, no FFT.
    event, steps = PoissonSampled(Gaussian(0.5), 0.5), 3
    accountant = PLDAccountant(precision=0.9).compose(event, steps)
    epsilon = accountant.epsilon(1e-3)
    leaves = [
        pld
        for key, c in accountant._caches.items()
        if c.plds and key[1] == accountant._grid_step() and key[0] == "remove"
        for (_, pessimistic), pld in c.plds.items()
        if pessimistic
    ]
    assert leaves  # the remove direction (the add one is certified below it on a coarser grid)
    unit = np.longdouble(2.0) ** -64
    for eps in (0.5 * epsilon, epsilon, 1.5 * epsilon):
        references = []
        for leaf in leaves:
            mass = leaf.mass.astype(np.longdouble)
            composed = mass
            for _ in range(steps - 1):
                composed = np.convolve(composed, mass)
            grid = leaf.offset * steps + np.arange(composed.size)
            losses = grid * np.longdouble(leaf.grid_step)
            infinity = 1 - (1 - np.longdouble(leaf.infinity_mass)) ** steps
            slack = 4 * steps * composed.size * unit  # convolution, weights and sum (mass 1)
            above = losses > eps
            weights = -np.expm1(np.longdouble(eps) - losses[above])
            references.append((np.sum(composed[above] * weights) + infinity, slack))
        reference, slack = max(references)
        assert accountant.delta(eps) >= float(reference + slack)
        # and above it by no more than the truncation budget of the query (1e-2 precision delta)
        assert accountant.delta(eps) <= float(reference) * (1 + 1e-2)


# ----------------------------------------------------------------------------- refusal


def test_floor_is_decided_before_allocating() -> None:
    """10^18 steps: the product rounding at frequency 0 alone, (1 + sqrt(2) gamma_2)^(T-1) - 1,
    is astronomically above any delta; the query is refused in well under a second and without
    allocating more than a few megabytes."""
    accountant = PLDAccountant().compose(PoissonSampled(Gaussian(1.1), 256 / 60000), 10**18)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        for query in (lambda: accountant.epsilon(1e-5), lambda: accountant.delta(1.0)):
            with pytest.raises(ValueError, match=r"1000000000000000000 composed steps"):
                query()
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < 16 << 20


def test_floor_refusal_names_the_limit() -> None:
    # 10^7 steps: the floor is (T - 1) sqrt(2) gamma_2 / 2 ~ 1.6e-9; a delta at or below
    # twice that is refused up front with the smallest delta that can be asked for.
    steps = 10**7
    floor = numerics.roundoff_floor(steps)
    assert floor == pytest.approx((steps - 1) * math.sqrt(2) * 2 * 2.0**-53 / 2, rel=1e-6)
    accountant = PLDAccountant().compose(PoissonSampled(Gaussian(1.1), 256 / 60000), steps)
    with pytest.raises(ValueError, match=r"10000000 composed steps.*delta >= 3\.1e-09"):
        accountant.epsilon(3e-9)
    core.pld_certified_rfft(np.ones(3), 16)  # the module is importable and the core has it
