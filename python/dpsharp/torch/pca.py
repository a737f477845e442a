"""Differentially private PCA as an input projection (Abadi et al. 2016, section 3.2).

The procedure of Abadi et al. 2016 ("Differentially private PCA"), which follows "Analyze
Gauss" (Dwork, Talwar, Thakurta, Zhang, STOC 2014):

1. Poisson-sample the training rows: each row joins the sample independently with probability
   ``q`` (``sampling_probability``).
2. Normalise every sampled row x to unit L2 norm (an all-zero row stays zero) and stack them
   as the rows of A, so that A^T A = sum_i x_i x_i^T.
3. Release the noisy second-moment matrix  S = A^T A + E  with E a symmetric Gaussian matrix.
4. Keep the top-k eigenvectors V_k (d x k) of S; the projection is x -> V_k^T x.

**Sensitivity.** Under add/remove one record (the relation of Poisson sampling), A^T A changes
by x x^T for one row with ||x||_2 <= 1, and ||x x^T||_F = ||x||_2^2 <= 1: the Frobenius (L2 on
the d x d entries) sensitivity is 1.

**The noise matrix and why its variances are right.** E = (G + G^T) / 2 with G a d x d matrix
of i.i.d. N(0, sigma^2) entries, sigma = ``noise_multiplier``. Hence

* diagonal entries E_ii = G_ii ~ N(0, sigma^2),
* off-diagonal entries E_ij = E_ji = (G_ij + G_ji)/2 ~ N(0, sigma^2 / 2), independent across
  the upper triangle i <= j, mirrored below.

Proof that this is exactly the Gaussian mechanism with multiplier sigma at sensitivity 1:
(a) A^T A + G is the Gaussian mechanism on R^{d x d} with Frobenius sensitivity 1 and noise
N(0, sigma^2 I); (b) S = P(A^T A + G) where P(M) = (M + M^T)/2 is the orthogonal projection
onto symmetric matrices, and P(A^T A) = A^T A, so S is a post-processing of (a). Equivalently,
in the isometric coordinates v(M) = (M_ii for all i; sqrt(2) M_ij for i < j), for which
||v(M)||_2 = ||M||_F, the noise v(E) is exactly N(0, sigma^2 I) on R^{d(d+1)/2}: the sqrt(2)
weight turns the off-diagonal variance sigma^2/2 into sigma^2. Drawing the whole upper triangle
i.i.d. N(0, sigma^2) and mirroring it (as a literal reading of "Analyze Gauss" suggests) would
also be private, but it puts variance 2 sigma^2 on the off-diagonal v-coordinates, i.e. it
wastes a factor sqrt(2) of noise on d(d-1)/2 of the d(d+1)/2 directions.

So :meth:`DPPCA.fit` is ``PoissonSampled(Gaussian(noise_multiplier), q)`` under add/remove; the
eigendecomposition and the projection are post-processing. Compose the returned event into the
training engine's accountant to report one number for the whole pipeline, or into a separate
accountant to report the PCA cost apart (as Yu et al. 2019 do with sigma_pca = 16:
rho = 1/(2 sigma_pca^2) for q = 1 under zCDP).
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import numpy as np
import torch

from dpsharp._validation import require_count, require_probability, require_real
from dpsharp.events import Gaussian, Neighbouring, PoissonSampled

__all__ = ["DPPCA", "PCAProjection", "symmetric_gaussian_noise"]


def _make_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    if seed is None:
        generator.manual_seed(secrets.randbits(63))
    else:
        generator.manual_seed(require_count("seed", seed))
    return generator


def symmetric_gaussian_noise(
    dim: int, noise_multiplier: float, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The symmetric noise matrix E = (G + G^T)/2, G_ij i.i.d. N(0, noise_multiplier^2).

    float64, shape (dim, dim). Var(E_ii) = sigma^2, Var(E_ij) = sigma^2/2 for i != j, the
    upper triangle (diagonal included) independent: exactly N(0, sigma^2 I) in the isometric
    coordinates (E_ii; sqrt(2) E_ij, i < j) of symmetric matrices (see the module docstring).
    """
    dim = require_count("dim", dim, minimum=1)
    sigma = require_real("noise_multiplier", noise_multiplier)
    if sigma < 0.0:
        raise ValueError(f"noise_multiplier must be in [0, inf), got {sigma!r}")
    gaussian = torch.randn((dim, dim), generator=generator, dtype=torch.float64) * sigma
    return (gaussian + gaussian.T) / 2.0


class PCAProjection(torch.nn.Module):
    """A frozen linear layer x -> V_k^T x (no bias, no centring, as in Abadi et al. 2016).

    ``components`` (d x k, orthonormal columns) is stored as a buffer, not a parameter: it has
    ``requires_grad=False``, is not returned by ``parameters()`` (so neither an optimizer nor a
    per-sample clipper touches it) and travels with ``state_dict()`` / ``.to()``. Inputs of
    shape ``(N, *)`` are flattened to (N, d); a single example of shape (d,) is also accepted.
    """

    components: torch.Tensor

    def __init__(self, components: torch.Tensor) -> None:
        super().__init__()
        if not isinstance(components, torch.Tensor) or components.dim() != 2:
            raise ValueError("components must be a 2-d tensor of shape (d, k)")
        # Kept in the precision it was computed in (float64 from DPPCA.fit); cast to the input's
        # dtype and device at each call, so float32 and float64 models both work.
        self.register_buffer("components", components.detach().clone())

    @property
    def in_features(self) -> int:
        return int(self.components.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.components.shape[1])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = inputs.reshape(inputs.shape[0], -1) if inputs.dim() > 2 else inputs
        if flat.shape[-1] != self.in_features:
            raise ValueError(
                f"inputs have {flat.shape[-1]} features after flattening, the projection "
                f"expects {self.in_features}"
            )
        return flat @ self.components.to(dtype=flat.dtype, device=flat.device)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, frozen"


def _unit_rows(rows: torch.Tensor) -> torch.Tensor:
    """Each float64 row scaled to L2 norm at most 1 (a zero row stays zero: it has no
    direction, and its outer product has norm 0).

    The sensitivity argument needs ||x||_2 <= 1 for every row as computed. A row is first
    divided by its largest magnitude (entries in [-1, 1], the largest exactly 1), so the squares
    of the norm cannot underflow: dividing by the plain norm of a row of entries about 1e-162,
    whose squares are subnormal and keep few digits, left rows of norm up to 1.66 (outer
    products of Frobenius norm 2.74, where the noise is calibrated to 1). The norm of the scaled
    row is then >= 1 and accurate to a few units of rounding; dividing by it times (1 + 2^-50)
    leaves every norm below 1."""
    largest = rows.abs().amax(dim=1, keepdim=True)
    nonzero = largest > 0
    scaled = rows / torch.where(nonzero, largest, 1.0)
    norms = torch.linalg.vector_norm(scaled, dim=1, keepdim=True) * (1.0 + 2.0**-50)
    return torch.where(nonzero, scaled / torch.where(nonzero, norms, 1.0), 0.0)


class DPPCA:
    """Differentially private PCA (Abadi et al. 2016, section 3.2; Dwork et al. 2014).

    Parameters
    ----------
    k:
        Number of principal directions kept (1 <= k <= d, checked at :meth:`fit`).
    noise_multiplier:
        sigma = noise standard deviation / Frobenius sensitivity (which is 1 under add/remove
        for unit-norm rows). ``0`` is a non-private mode for tests: :meth:`fit` then returns
        ``None`` because there is nothing an accountant can account.
    sampling_probability:
        q in (0, 1]: each row joins the PCA sample independently with this probability.
    seed:
        Seed of the sampling and noise generator; ``None`` takes a fresh key from the OS
        CSPRNG (``secrets``).

    Notes
    -----
    After :meth:`fit`: ``components`` (d x k, float64, orthonormal columns ordered by
    decreasing noisy eigenvalue), ``eigenvalues`` (the top-k noisy eigenvalues),
    ``sample_size`` (the realised Poisson sample size; not private, for diagnostics only) and
    ``event``.
    """

    def __init__(
        self,
        k: int,
        noise_multiplier: float,
        sampling_probability: float,
        *,
        seed: int | None = None,
    ) -> None:
        self.k = require_count("k", k, minimum=1)
        sigma = require_real("noise_multiplier", noise_multiplier)
        if sigma < 0.0:
            raise ValueError(f"noise_multiplier must be in [0, inf), got {sigma!r}")
        self.noise_multiplier = sigma
        self.sampling_probability = require_probability("sampling_probability", sampling_probability)
        self._generator = _make_generator(seed)
        self.components: torch.Tensor | None = None
        self.eigenvalues: torch.Tensor | None = None
        self.sample_size: int | None = None
        self.event: PoissonSampled | None = None

    def privacy_event(self) -> PoissonSampled:
        """PoissonSampled(Gaussian(noise_multiplier), q): the cost of one :meth:`fit`."""
        if self.noise_multiplier == 0.0:
            raise ValueError("noise_multiplier is 0: DP-PCA without noise has no privacy guarantee")
        return PoissonSampled(Gaussian(self.noise_multiplier), self.sampling_probability)

    def full_data_event(self, neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE) -> Gaussian:
        """The cost of one :meth:`fit` as an unsampled ``Gaussian`` event, for q = 1 only (e.g.
        for the zCDP accountant, which has no exact analysis of Poisson sampling: 004 reports
        rho = 1/(2 sigma_pca^2)). Under add/remove the Frobenius sensitivity is 1, so it is
        ``Gaussian(sigma)``; under replace-one it is ||x x^T - y y^T||_F =
        sqrt(2 - 2 (x.y)^2) <= sqrt(2) for unit rows, so ``Gaussian(sigma / sqrt(2))``."""
        relation = Neighbouring(neighbouring)
        if self.sampling_probability != 1.0:
            raise ValueError(
                f"full_data_event needs sampling_probability 1, got {self.sampling_probability!r}; "
                "use privacy_event() (PoissonSampled) for q < 1"
            )
        if self.noise_multiplier == 0.0:
            raise ValueError("noise_multiplier is 0: DP-PCA without noise has no privacy guarantee")
        if relation is Neighbouring.ADD_REMOVE:
            return Gaussian(self.noise_multiplier)
        return Gaussian(self.noise_multiplier / math.sqrt(2.0))

    def fit(self, data: Any) -> PoissonSampled | None:
        """Run DP-PCA on ``data`` (n x d, or n x (any shape) flattened to n x d rows).

        Returns the event to compose into an accountant (``None`` when noise_multiplier is 0).
        Raises ValueError for non-finite data or k > d.
        """
        rows = self._as_rows(data)
        n, dim = rows.shape
        if self.k > dim:
            raise ValueError(f"k must be in [1, d={dim}], got {self.k}")
        keep = torch.rand(n, generator=self._generator, dtype=torch.float64) < self.sampling_probability
        sample = rows[keep]
        unit = _unit_rows(sample)
        second_moment = unit.T @ unit
        if self.noise_multiplier > 0.0:
            second_moment = second_moment + symmetric_gaussian_noise(
                dim, self.noise_multiplier, generator=self._generator
            )
        eigenvalues, eigenvectors = torch.linalg.eigh(second_moment)
        order = torch.argsort(eigenvalues, descending=True)[: self.k]
        self.components = eigenvectors[:, order].contiguous()
        self.eigenvalues = eigenvalues[order].contiguous()
        self.sample_size = int(keep.sum())
        self.event = None if self.noise_multiplier == 0.0 else self.privacy_event()
        return self.event

    def projection(self) -> PCAProjection:
        """A frozen :class:`PCAProjection` onto the fitted components (use as a first layer)."""
        if self.components is None:
            raise RuntimeError("call fit(data) before projection()")
        return PCAProjection(self.components)

    def transform(self, data: Any) -> torch.Tensor:
        """``data`` (flattened to rows) times the components: the projection as a tensor."""
        if self.components is None:
            raise RuntimeError("call fit(data) before transform()")
        return self._as_rows(data) @ self.components

    @staticmethod
    def _as_rows(data: Any) -> torch.Tensor:
        if isinstance(data, torch.Tensor):
            rows = data.detach().to(device="cpu", dtype=torch.float64)
        else:
            rows = torch.as_tensor(np.asarray(data, dtype=np.float64))
        if rows.dim() < 2:
            raise ValueError(f"data must have shape (n, d) or (n, ...), got {tuple(rows.shape)}")
        rows = rows.reshape(rows.shape[0], -1)
        if rows.shape[0] < 1 or rows.shape[1] < 1:
            raise ValueError(f"data must have at least one row and one column, got {tuple(rows.shape)}")
        if not bool(torch.isfinite(rows).all()):
            raise ValueError("data must be finite (found NaN or inf)")
        return rows

    def __repr__(self) -> str:
        return (
            f"DPPCA(k={self.k}, noise_multiplier={self.noise_multiplier!r}, "
            f"sampling_probability={self.sampling_probability!r})"
        )
