"""DP-PCA (Abadi et al. 2016, section 3.2): exactness without noise, the noise matrix's
distribution (checked statistically against the stated variances), the frozen projection and
the event it reports."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")

from dpsharp.events import Gaussian, PoissonSampled
from dpsharp.torch import DPPCA, PCAProjection, symmetric_gaussian_noise
from dpsharp.torch.pca import _unit_rows

pytestmark = pytest.mark.torch


def _normalised(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.where(norms > 0, rows / np.where(norms > 0, norms, 1.0), 0.0)


def _top_k(matrix: np.ndarray, k: int) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    return vectors[:, np.argsort(values)[::-1][:k]]


def _anisotropic_data(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.linspace(3.0, 0.2, d)  # distinct spectrum, so directions are well defined
    return rng.standard_normal((n, d)) * scales + 0.3


def test_noise_zero_full_sample_gives_exact_principal_directions() -> None:
    data = _anisotropic_data(500, 12, seed=1)
    pca = DPPCA(5, 0.0, 1.0, seed=3)
    assert pca.fit(data) is None  # no noise: nothing to account
    unit = _normalised(data)
    expected = _top_k(unit.T @ unit, 5)
    got = pca.components.numpy()
    # Up to sign: column-wise |cosine| = 1.
    cosines = np.abs(np.sum(expected * got, axis=0))
    np.testing.assert_allclose(cosines, 1.0, atol=1e-10)
    np.testing.assert_allclose(got.T @ got, np.eye(5), atol=1e-12)
    expected_values = np.sort(np.linalg.eigvalsh(unit.T @ unit))[::-1][:5]
    np.testing.assert_allclose(pca.eigenvalues.numpy(), expected_values, rtol=1e-12)
    assert pca.sample_size == 500


def test_noise_zero_poisson_sample_uses_the_sampled_rows() -> None:
    data = _anisotropic_data(400, 8, seed=2)
    pca = DPPCA(3, 0.0, 0.3, seed=11)
    pca.fit(data)
    # The same seed reproduces the sampling mask (the first draw of the generator).
    generator = torch.Generator().manual_seed(11)
    keep = (torch.rand(400, generator=generator, dtype=torch.float64) < 0.3).numpy()
    assert pca.sample_size == int(keep.sum())
    assert 0 < pca.sample_size < 400
    unit = _normalised(data[keep])
    expected = _top_k(unit.T @ unit, 3)
    cosines = np.abs(np.sum(expected * pca.components.numpy(), axis=0))
    np.testing.assert_allclose(cosines, 1.0, atol=1e-10)


def test_zero_rows_are_left_at_zero() -> None:
    data = _anisotropic_data(50, 4, seed=5)
    data[::7] = 0.0
    pca = DPPCA(2, 0.0, 1.0, seed=0)
    pca.fit(data)
    unit = _normalised(data)
    cosines = np.abs(np.sum(_top_k(unit.T @ unit, 2) * pca.components.numpy(), axis=0))
    np.testing.assert_allclose(cosines, 1.0, atol=1e-10)


def test_noise_matrix_is_symmetric_with_the_stated_variances() -> None:
    """Diagonal N(0, sigma^2), off-diagonal N(0, sigma^2/2), upper triangle independent:
    chi-square confidence intervals for each variance (Bonferroni over the coordinates) and
    |correlation| bounds. With the naive calibration (upper triangle i.i.d. N(0, sigma^2))
    the off-diagonal test fails by a factor 2 in variance."""
    dim, draws, sigma = 4, 20000, 1.7
    generator = torch.Generator().manual_seed(2024)
    samples = torch.stack(
        [symmetric_gaussian_noise(dim, sigma, generator=generator) for _ in range(draws)]
    ).numpy()
    assert np.array_equal(samples, np.transpose(samples, (0, 2, 1)))
    upper = np.triu_indices(dim)
    coordinates = samples[:, upper[0], upper[1]]  # (draws, d(d+1)/2)
    on_diagonal = upper[0] == upper[1]
    target = np.where(on_diagonal, sigma**2, sigma**2 / 2)
    alpha = 1e-4 / coordinates.shape[1]
    low, high = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], draws)
    statistic = np.sum(coordinates**2, axis=0) / target  # ~ chi2(draws) if the variance is right
    assert np.all((low < statistic) & (statistic < high)), statistic / draws
    # Means zero: z-test per coordinate.
    z = coordinates.mean(axis=0) / np.sqrt(target / draws)
    assert np.all(np.abs(z) < stats.norm.isf(alpha / 2))
    # Independence of the upper-triangle coordinates.
    correlation = np.corrcoef(coordinates.T)
    off = correlation[~np.eye(len(target), dtype=bool)]
    assert np.max(np.abs(off)) < 5.0 / math.sqrt(draws)


def test_noise_is_isotropic_in_the_isometric_coordinates() -> None:
    """v(E) = (E_ii; sqrt(2) E_ij, i<j) satisfies ||v(M)|| = ||M||_F and must be N(0, sigma^2 I):
    the Gaussian mechanism with multiplier sigma for Frobenius sensitivity 1."""
    dim, draws, sigma = 5, 8000, 0.6
    generator = torch.Generator().manual_seed(7)
    samples = torch.stack(
        [symmetric_gaussian_noise(dim, sigma, generator=generator) for _ in range(draws)]
    ).numpy()
    upper = np.triu_indices(dim)
    weights = np.where(upper[0] == upper[1], 1.0, math.sqrt(2.0))
    v = samples[:, upper[0], upper[1]] * weights
    # The isometry itself: ||v(E)|| = ||E||_F.
    np.testing.assert_allclose(
        np.linalg.norm(v, axis=1), np.linalg.norm(samples, axis=(1, 2)), rtol=1e-12
    )
    covariance = v.T @ v / draws
    m = v.shape[1]
    # Each diagonal entry of the covariance: chi2(draws) / draws * sigma^2.
    alpha = 1e-4 / m
    low, high = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], draws) / draws * sigma**2
    assert np.all((low < np.diag(covariance)) & (np.diag(covariance) < high))
    assert np.max(np.abs(covariance - np.diag(np.diag(covariance)))) < 5 * sigma**2 / math.sqrt(draws)
    # The sensitivity: adding one unit row changes A^T A by x x^T with ||x x^T||_F = 1.
    x = np.random.default_rng(0).standard_normal(dim)
    x /= np.linalg.norm(x)
    assert math.isclose(np.linalg.norm(np.outer(x, x)), 1.0, rel_tol=1e-12)


def test_fit_returns_poisson_sampled_gaussian() -> None:
    data = _anisotropic_data(300, 6, seed=9)
    pca = DPPCA(2, 4.0, 0.25, seed=1)
    event = pca.fit(data)
    assert event == PoissonSampled(Gaussian(4.0), 0.25)
    assert pca.event == event == pca.privacy_event()
    assert pca.components.shape == (6, 2)
    np.testing.assert_allclose(pca.components.T @ pca.components, np.eye(2), atol=1e-12)


def test_small_noise_recovers_directions_approximately() -> None:
    # sigma small relative to n: the noisy top directions are close to the clean ones.
    data = _anisotropic_data(5000, 6, seed=4)
    pca = DPPCA(2, 1.0, 1.0, seed=5)
    pca.fit(data)
    unit = _normalised(data)
    expected = _top_k(unit.T @ unit, 2)
    cosines = np.abs(np.sum(expected * pca.components.numpy(), axis=0))
    assert np.all(cosines > 0.99)


def test_same_seed_same_result_and_different_seed_differs() -> None:
    data = _anisotropic_data(200, 5, seed=6)
    first, second, other = DPPCA(2, 3.0, 0.5, seed=42), DPPCA(2, 3.0, 0.5, seed=42), DPPCA(2, 3.0, 0.5, seed=43)
    for pca in (first, second, other):
        pca.fit(data)
    assert torch.equal(first.components, second.components)
    assert not torch.equal(first.components, other.components)


def test_projection_layer_is_frozen_and_projects() -> None:
    data = _anisotropic_data(200, 16, seed=8)
    pca = DPPCA(4, 2.0, 1.0, seed=2)
    pca.fit(data)
    layer = pca.projection()
    assert isinstance(layer, PCAProjection)
    assert list(layer.parameters()) == []
    assert not layer.components.requires_grad
    model = torch.nn.Sequential(layer, torch.nn.Linear(4, 3))
    inputs = torch.as_tensor(data[:10], dtype=torch.float32).reshape(10, 4, 4)  # flattened by the layer
    out = model(inputs)
    out.sum().backward()
    assert [p.shape for p in model.parameters()] == [torch.Size([3, 4]), torch.Size([3])]
    expected = data[:10] @ pca.components.numpy()
    np.testing.assert_allclose(layer(inputs).detach().numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pca.transform(data[:10]).numpy(), expected, rtol=1e-12)
    assert "components" in layer.state_dict()
    # float64 inputs are projected at full precision.
    np.testing.assert_allclose(layer(torch.as_tensor(data[:10])).numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 1.0, 0.5), "k must be an integer >= 1"),
        ((2, -1.0, 0.5), "noise_multiplier must be in"),
        ((2, float("nan"), 0.5), "noise_multiplier must be a finite"),
        ((2, 1.0, 0.0), r"sampling_probability must be in \(0, 1\]"),
        ((2, 1.0, 1.5), r"sampling_probability must be in \(0, 1\]"),
    ],
)
def test_bad_arguments(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DPPCA(*args)


def test_bad_data() -> None:
    pca = DPPCA(3, 1.0, 1.0, seed=0)
    with pytest.raises(ValueError, match="k must be in"):
        pca.fit(np.ones((10, 2)))
    bad = np.ones((10, 4))
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        pca.fit(bad)
    with pytest.raises(RuntimeError, match="fit"):
        DPPCA(2, 1.0, 1.0).projection()
    with pytest.raises(ValueError, match="no privacy guarantee"):
        DPPCA(2, 0.0, 1.0).privacy_event()


def test_full_data_event_and_replace_one_sensitivity() -> None:
    pca = DPPCA(2, 16.0, 1.0, seed=0)
    assert pca.full_data_event() == Gaussian(16.0)
    assert pca.full_data_event("replace_one") == Gaussian(16.0 / math.sqrt(2.0))
    # Replace-one sensitivity: ||x x^T - y y^T||_F = sqrt(2 - 2 (x.y)^2), at most sqrt(2) (x ⟂ y).
    rng = np.random.default_rng(1)
    for _ in range(100):
        x, y = rng.standard_normal((2, 7))
        x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
        diff = np.linalg.norm(np.outer(x, x) - np.outer(y, y))
        assert diff == pytest.approx(math.sqrt(2 - 2 * (x @ y) ** 2), rel=1e-10)
        assert diff <= math.sqrt(2) + 1e-12
    with pytest.raises(ValueError, match="sampling_probability 1"):
        DPPCA(2, 16.0, 0.5).full_data_event()


def test_rows_whose_squares_underflow_are_normalised_to_norm_at_most_one() -> None:
    """A finite row of entries about 1e-162 has subnormal squares: divided by its plain norm it
    kept norm up to 1.66, and its outer product (the record's change of A^T A, which the noise
    is calibrated to bound by 1 in Frobenius norm) reached 2.74. With noise 0 and q = 1 the top
    eigenvalue of A^T A is that record's ||x||^2 (up to the eigensolver's own rounding, a few
    units of roundoff times d, which depends on the machine's LAPACK: 1 + 1.1e-15 for d = 784
    on one CPU). The bound itself is checked exactly: the squared norm of the normalised row as
    computed, summed in rationals, is at most 1."""
    row = np.array([[1.4404947341071113e-162, 1.4723025245070847e-162,
                     1.5437613970018632e-162, 2.632919880860827e-162]])
    for data in (row, np.full((1, 3), 2.7186831132685565e-162), np.full((1, 784), 1e-300),
                 np.full((1, 5), 1e300)):
        unit = _unit_rows(torch.as_tensor(data, dtype=torch.float64))
        squared_norm = sum(Fraction(value) ** 2 for value in unit[0].tolist())
        assert Fraction(999, 1000) < squared_norm <= 1
        pca = DPPCA(1, 0.0, 1.0, seed=0)
        pca.fit(data)
        assert float(pca.eigenvalues[0]) == pytest.approx(1.0, abs=data.shape[1] * 2.0**-50)
