"""Two PLDs' transforms taken as one complex transform (``certified_forward_pair``): the
per-part bound on the complex moduli of ``a + i b`` against 40-digit DFTs, and where the
composition uses the pair.

References independent of the code under test: the DFT of the folded masses in mpmath at 40
digits; the componentwise bound of the module docstring of ``_pld_numerics`` evaluated by hand
on the sum of the two l1 norms (the bound before the moduli)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpsharp.accountants import _pld_numerics as numerics
from dpsharp.accountants._pld_numerics import DiscretePLD


def exact_dft(values: np.ndarray, size: int) -> list[complex]:
    with mpmath.workdps(40):
        return [
            complex(mpmath.fsum(
                mpmath.mpf(float(v)) * mpmath.expjpi(mpmath.mpf(-2 * ((f * s) % size)) / size)
                for s, v in enumerate(values)
            ))
            for f in range(size // 2 + 1)
        ]


def l1_bound(first: DiscretePLD, second: DiscretePLD, size: int) -> tuple[float, float]:
    """The bound on ||a||_1 + ||b||_1 (the joint norm before the complex moduli), evaluated
    from the module docstring's part 1 and the unpacking's rounding."""
    c = numerics.forward_error(size)
    norms = [numerics._l1(pld.mass) for pld in (first, second)]
    joint = c * (norms[0] + norms[1])
    unit = 2.0**-53
    return tuple(  # type: ignore[return-value]
        (joint * (1 + unit) + unit * (norm + joint)) * numerics._MARGIN + numerics._UNDERFLOW
        for norm in norms
    )


@pytest.mark.parametrize(("length", "size", "similar"), [(40, 48, True), (90, 120, True),
                                                        (60, 64, False)])
def test_pair_bound_on_complex_moduli_holds_and_is_tighter(
    length: int, size: int, similar: bool
) -> None:
    """With the folded vectors the pair's bound uses N = sum_j |a_j + i b_j| instead of
    ||a||_1 + ||b||_1: every computed entry of both parts stays within it against the exact DFT
    (40 digits), and for two similar PLDs it is about 1/sqrt(2) of the l1 bound (equal masses:
    N = sqrt(2) ||a||_1), for disjoint supports the same as the l1 bound."""
    rng = np.random.default_rng(length + size)
    base = rng.random(length) ** 2
    base /= base.sum()
    if similar:
        other = base * (1.0 + 1e-3 * rng.random(length))
    else:  # disjoint supports: the moduli add up to the l1 norms
        other = np.zeros(length)
        other[length // 2 :] = base[length // 2 :]
        base = base.copy()
        base[length // 2 :] = 0.0
    first = DiscretePLD(0, base, 0.0, 0.5)
    second = DiscretePLD(0, other, 0.0, 0.5)
    folded = (first.folded(size), second.folded(size))
    computed = numerics.certified_forward_pair(*folded, size)
    bounds = numerics._pair_errors(first, second, size, folded=folded)
    worst = 0.0
    for pld, transform, bound in zip((first, second), computed, bounds):
        exact = exact_dft(pld.mass, size)
        errors = np.abs(transform - np.array(exact))
        assert np.all(errors <= bound)
        worst = max(worst, float(errors.max()))
    assert max(bounds) <= 1e5 * worst
    loose = l1_bound(first, second, size)
    ratio = max(b / lb for b, lb in zip(bounds, loose))
    if similar:
        # (the unpacking's own rounding, on ||a||_1 alone, keeps it a little above 1/sqrt(2))
        assert 1.0 / math.sqrt(2.0) <= ratio <= 0.72
    else:
        assert ratio <= 1.0 + 1e-12
    # Without the vectors the bound is the l1 one (the same as before the moduli were used).
    assert numerics._pair_errors(first, second, size) == pytest.approx(loose, rel=1e-15)


def test_two_level_pairs_only_the_queried_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-level composition of 300 distinct PLDs: the first level (groups made into PLDs for
    the second, whose whole l1 mass error goes to their top points) transforms each PLD on its
    own; the second level (the queried composition) takes its factors two at a time within
    each chunk of the product. The result brackets the exact Gaussian composition's delta."""
    from scipy.stats import norm

    from dpsharp._native import core

    step = 2.0**-7
    count = 300
    sigmas = np.linspace(4.0, 8.0, count)
    plds = []
    for sigma in sigmas:
        offset, mass, infinity = core.pld_discretize(0, float(sigma), 1.0, step, 1e-15, 1e-15, True)
        plds.append(DiscretePLD(int(offset), np.asarray(mass), float(infinity), step))
    sizes: dict[str, list[int]] = {"pair": [], "single": []}
    real_pair, real_single = numerics.certified_forward_pair, numerics.certified_forward

    def pair(first, second, size):  # type: ignore[no-untyped-def]
        sizes["pair"].append(size)
        return real_pair(first, second, size)

    def single(values, size):  # type: ignore[no-untyped-def]
        sizes["single"].append(size)
        return real_single(values, size)

    monkeypatch.setattr(numerics, "certified_forward_pair", pair)
    monkeypatch.setattr(numerics, "certified_forward", single)
    result = numerics.compose(plds, [1] * count, log_tail=math.log(1e-14), pessimistic=True)
    monkeypatch.undo()
    groups = max(2, round(count / numerics._GROUP_SIZE))
    chunks = numerics._chunks(groups, numerics._PRODUCT_CHUNKS)
    # Second level: the group results two at a time within each chunk, on the final circle.
    assert len(sizes["pair"]) == sum(len(chunk) // 2 for chunk in chunks) > 0
    assert set(sizes["pair"]) == {result.size}
    # First level: every one of the PLDs alone (plus the odd factor of each chunk above).
    assert len(sizes["single"]) == count + sum(len(chunk) % 2 for chunk in chunks)
    # The exact composition is mu-GDP with mu = sqrt(sum 1 / sigma^2) (Dong, Roth, Su 2019).
    mu = math.sqrt(float(np.sum(1.0 / sigmas**2)))
    for eps in (0.0, 0.5, 1.0):
        exact = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        assert result.delta(eps, pessimistic=True) >= exact
        assert result.delta(eps, pessimistic=True) <= exact * (1 + 1e-2)
