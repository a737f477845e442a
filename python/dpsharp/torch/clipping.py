"""Clip-factor rules beyond ``min(1, C / ||g_i||)``: automatic and adaptive quantile clipping.

A rule turns each example's gradient norm into the factor its gradient is multiplied by before
the sum (:class:`dpsharp.torch.PerSampleClipper` computes the norms; the rule only picks the
factors), and may keep state between releases:

* :class:`AutomaticClipping` (Bu, Wang, Zha, Karypis 2023, "Automatic Clipping: Differentially
  Private Deep Learning Made Easier and Stronger", AUTO-S, eq. (4.1)): every gradient is
  normalised, c_i = C / (||g_i|| + gamma) with a stability constant gamma >= 0 (gamma = 0 is
  their AUTO-V). Each clipped gradient has norm C ||g_i|| / (||g_i|| + gamma) < C, so the
  sensitivity, and the privacy at a given noise multiplier, is that of flat clipping at C.
* :class:`AdaptiveQuantileClipping` (Andrew, Thakkar, McMahan, Ramaswamy 2021,
  "Differentially Private Learning with Adaptive Clipping", Algorithm 1): flat clipping at a
  bound C_t that follows the gamma-quantile of the gradient norms. At each release the number
  of unclipped examples is released privately,

      b~_t = (sum_i (1[||g_i|| <= C_t] - 1/2) + N(0, sigma_b^2)) / B + 1/2,

  (B the expected batch size; the centred bits have sensitivity 1/2 under add/remove), and
  the bound moves geometrically, C_{t+1} = C_t exp(-eta_C (b~_t - gamma)).

Privacy of adaptive clipping. Both releases of a step read the same sampled batch. Scaled by
their noise, (clipped sum / (z_grad C_t), centred count / sigma_b) is one Gaussian mechanism
with unit noise whose sensitivity is sqrt(z_grad^-2 + (s / sigma_b)^2), s the count's
sensitivity relative to the gradient's C: s = 1/2 under add/remove (a record's centred bit
b - 1/2 is +-1/2) and under replace-one (both parts double: 2 C and 1), but s = 1 under
zero-out, where a record with b = 0 is replaced by a null record whose zero gradient is
unclipped (b = 1): the gradient moves by at most C, the count by 1. So one sampled Gaussian
with noise multiplier

    z = (z_grad^-2 + (s / sigma_b)^2)^(-1/2)

per step (Andrew et al. 2021, section 3; the Gaussian composition of Dong, Roth, Su 2019,
Corollary 3.3, or Mironov 2017, Proposition 7, on the joint vector). dpsharp therefore keeps
the optimizer's ``noise_multiplier`` = z, the *total* per-step noise multiplier that the engine
charges to its accountant (one event per step for both releases, exactly as for plain
DP-SGD), and noises the gradient with the larger z_grad = (z^-2 - (s / sigma_b)^2)^(-1/2),
which needs sigma_b / s > z. So a run with adaptive clipping is accounted, budgeted and
calibrated exactly like a plain run at sigma = z. The engine tells the rule the relation it
accounts under (:meth:`AdaptiveQuantileClipping.set_neighbouring`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dpsharp._validation import require_positive_finite, require_real

if TYPE_CHECKING:
    import torch

    from dpsharp.torch.noise import NoiseGenerator

__all__ = ["AdaptiveQuantileClipping", "AutomaticClipping", "ClipRule", "resolve_clipping",
           "gradient_noise_multiplier"]


class ClipRule:
    """Base class: the clip factors of a batch from its per-example norms.

    ``structure`` is the clipper's norm structure: ``"flat"`` (one norm per example over all
    parameters, factors of shape (B,)) or ``"per_layer"`` (one norm per example and
    parameter, factors (B, L) against bounds (L,)).
    """

    structure: str = "flat"

    def factors(self, norms: torch.Tensor, bounds: Any) -> torch.Tensor:
        """Clip factors (float64, the shape of ``norms``) for ``norms`` >= 0 (float64)."""
        raise NotImplementedError

    def observe(self, norms: torch.Tensor, bounds: Any) -> None:
        """Called with every backward pass's norms (before :meth:`factors`)."""

    def reset(self) -> None:
        """Drop what was observed since the last release (the clipper was reset)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class AutomaticClipping(ClipRule):
    """c_i = C / (||g_i|| + gamma) (Bu, Wang, Zha, Karypis 2023, AUTO-S; gamma = 0: AUTO-V).

    Parameters
    ----------
    stability:
        gamma >= 0 (default 0.01, the paper's choice). With gamma = 0 a zero gradient gets the
        factor 0 (its contribution is zero either way).
    per_layer:
        Normalise each parameter tensor's gradient on its own, c_{i,l} = C_l / (||g_{i,l}|| +
        gamma), against per-layer bounds C_l (the overall bound is sqrt(sum_l C_l^2)).
    """

    def __init__(self, stability: float = 0.01, *, per_layer: bool = False) -> None:
        gamma = require_real("stability", stability)
        if not (gamma >= 0.0 and math.isfinite(gamma)):
            raise ValueError(f"stability must be a finite number >= 0, got {stability!r}")
        if not isinstance(per_layer, bool):
            raise TypeError(f"per_layer must be a bool, got {per_layer!r}")
        self.stability = gamma
        self.structure = "per_layer" if per_layer else "flat"

    def factors(self, norms: torch.Tensor, bounds: Any) -> torch.Tensor:
        import torch

        denominator = norms + self.stability
        out = bounds / denominator
        return torch.where(denominator > 0.0, out, torch.zeros_like(out))

    def __repr__(self) -> str:
        return f"AutomaticClipping(stability={self.stability}, structure={self.structure!r})"


def gradient_noise_multiplier(noise_multiplier: float, count_noise_std: float,
                              count_sensitivity: float = 0.5) -> float:
    """z_grad = (z^-2 - (s / sigma_b)^-2)^(-1/2): the gradient's noise multiplier that,
    composed with the count released at noise std sigma_b and relative sensitivity s
    (``count_sensitivity``: 1/2 under add/remove and replace-one, 1 under zero-out; module
    docstring), is one Gaussian mechanism of noise multiplier z (Andrew et al. 2021, section
    3). z = 0 gives 0 (no privacy either way); needs sigma_b / s > z otherwise."""
    z = require_real("noise_multiplier", noise_multiplier)
    if z < 0.0:
        raise ValueError(f"noise_multiplier must be in [0, inf), got {noise_multiplier!r}")
    sigma_b = require_real("count_noise_std", count_noise_std)
    if not (sigma_b >= 0.0 and math.isfinite(sigma_b)):
        raise ValueError(f"count_noise_std must be a finite number >= 0, got {count_noise_std!r}")
    if count_sensitivity not in (0.5, 1.0):
        raise ValueError(f"count_sensitivity must be 0.5 or 1.0, got {count_sensitivity!r}")
    if z == 0.0:
        return 0.0
    if math.isinf(z):
        raise ValueError("noise_multiplier must be finite with adaptive clipping")
    count_multiplier = sigma_b / count_sensitivity  # exact: a division by 1/2 or 1
    if not count_multiplier > z:
        relation = "" if count_sensitivity == 0.5 else " (the count's sensitivity 1 under zero-out)"
        raise ValueError(
            f"adaptive clipping needs count_noise_std / {count_sensitivity!r} > "
            f"noise_multiplier{relation}: the count's release must leave privacy for the "
            f"gradient; got count_noise_std={sigma_b!r}, noise_multiplier={z!r}: raise "
            f"count_noise_std above {z * count_sensitivity!r}"
        )
    # z_grad = z m / sqrt((m - z)(m + z)), m = sigma_b / s: the difference is exact when the
    # two are close (Sterbenz), so every operation is correctly rounded and the result is
    # within a few ulp even as m -> z (1 - (z / m)^2 would cancel).
    return z * count_multiplier / math.sqrt((count_multiplier - z) * (count_multiplier + z))


class AdaptiveQuantileClipping(ClipRule):
    """Flat clipping at a bound that tracks the ``target_quantile`` of the gradient norms
    (Andrew, Thakkar, McMahan, Ramaswamy 2021, Algorithm 1; module docstring).

    Parameters
    ----------
    target_quantile:
        gamma in [0, 1]: the fraction of examples the bound should leave unclipped (the paper
        uses 0.5).
    learning_rate:
        eta_C > 0 of the geometric update C <- C exp(-eta_C (b~ - gamma)) (the paper: 0.2).
    count_noise_std:
        sigma_b >= 0, the std of the noise on the count of unclipped examples; None (default)
        takes the paper's sigma_b = B / 20 for an expected batch size B. The gradient's noise
        multiplier is raised so that both releases together cost the optimizer's
        ``noise_multiplier`` (:func:`gradient_noise_multiplier`).
    min_bound, max_bound:
        Optional limits the bound is kept in (post-processing of the noisy count: free).

    The bound starts at the optimizer's ``max_grad_norm``.
    """

    structure = "flat"

    def __init__(self, target_quantile: float = 0.5, learning_rate: float = 0.2, *,
                 count_noise_std: float | None = None, min_bound: float | None = None,
                 max_bound: float | None = None) -> None:
        gamma = require_real("target_quantile", target_quantile)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"target_quantile must be in [0, 1], got {target_quantile!r}")
        self.target_quantile = gamma
        self.learning_rate = require_positive_finite("learning_rate", learning_rate)
        if count_noise_std is not None:
            sigma_b = require_real("count_noise_std", count_noise_std)
            if not (sigma_b >= 0.0 and math.isfinite(sigma_b)):
                raise ValueError(
                    f"count_noise_std must be a finite number >= 0, got {count_noise_std!r}")
            count_noise_std = sigma_b
        self.count_noise_std = count_noise_std
        self.min_bound = None if min_bound is None else require_positive_finite(
            "min_bound", min_bound)
        self.max_bound = None if max_bound is None else require_positive_finite(
            "max_bound", max_bound)
        if (self.min_bound is not None and self.max_bound is not None
                and self.min_bound > self.max_bound):
            raise ValueError(f"min_bound must be <= max_bound, got {min_bound!r} > {max_bound!r}")
        self.bound: float | None = None  # C_t, set by bind()
        self.unclipped = 0  # examples with ||g_i|| <= C_t since the last release
        self.last_fraction: float | None = None  # b~ of the last release
        #: the count's sensitivity relative to the gradient's (module docstring)
        self.count_sensitivity = 0.5

    def bind(self, bound: float, expected_batch_size: float) -> None:
        """Start at ``bound``; fix sigma_b = B / 20 if it was left None."""
        self.bound = require_positive_finite("max_grad_norm", bound)
        if self.count_noise_std is None:
            self.count_noise_std = require_positive_finite(
                "expected_batch_size", expected_batch_size) / 20.0

    def factors(self, norms: torch.Tensor, bounds: Any) -> torch.Tensor:
        # min(1, C / norm), 1 for a zero norm (C / 2^-1074 = inf, clamped)
        return (bounds / norms.clamp_min(5e-324)).clamp_(max=1.0)

    def observe(self, norms: torch.Tensor, bounds: Any) -> None:
        self.unclipped += int((norms <= bounds).sum())

    def reset(self) -> None:
        self.unclipped = 0

    def set_neighbouring(self, neighbouring: Any) -> None:
        """The relation the run is accounted under (a :class:`dpsharp.events.Neighbouring` or
        its value): zero-out gives the count sensitivity 1 against the gradient's C (a null
        record's zero gradient counts as unclipped), add/remove and replace-one 1/2."""
        from dpsharp.events import Neighbouring

        relation = Neighbouring(neighbouring)
        self.count_sensitivity = 1.0 if relation is Neighbouring.ZERO_OUT else 0.5

    def gradient_noise_multiplier(self, noise_multiplier: float) -> float:
        """z_grad for the optimizer's total noise multiplier z (module docstring)."""
        if self.count_noise_std is None:
            raise RuntimeError("bind() the rule to an optimizer first")
        return gradient_noise_multiplier(noise_multiplier, self.count_noise_std,
                                         self.count_sensitivity)

    def release(self, *, noise: NoiseGenerator, expected_batch_size: float,
                realised_batch_size: int) -> float:
        """Release the noisy unclipped fraction b~ of the lot just released and update the
        bound: C <- C exp(-eta_C (b~ - gamma)), kept in [min_bound, max_bound]. The noise is
        stream 0 of a fresh release of ``noise`` (so secure mode draws it from the CSPRNG).
        Returns the new bound."""
        import torch

        from dpsharp.torch import kernels

        if self.bound is None or self.count_noise_std is None:
            raise RuntimeError("bind() the rule to an optimizer first")
        b = require_positive_finite("expected_batch_size", expected_batch_size)
        centred = torch.tensor([self.unclipped - 0.5 * realised_batch_size],
                               dtype=torch.float64)
        key = noise.next_release()
        kernels.release_noise([centred], [centred], noise_std=self.count_noise_std,
                              key=key.key, release=key.release, rank=key.rank)
        fraction = float(centred[0]) / b + 0.5
        bound = self.bound * math.exp(-self.learning_rate * (fraction - self.target_quantile))
        if self.min_bound is not None:
            bound = max(bound, self.min_bound)
        if self.max_bound is not None:
            bound = min(bound, self.max_bound)
        if not (bound > 0.0 and math.isfinite(bound)):
            raise FloatingPointError(f"the adaptive clipping bound left (0, inf): {bound!r}")
        self.bound = bound
        self.last_fraction = fraction
        self.unclipped = 0
        return bound

    def state_dict(self) -> dict[str, Any]:
        return {"bound": self.bound, "count_noise_std": self.count_noise_std,
                "last_fraction": self.last_fraction}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("bound") is not None:
            self.bound = require_positive_finite("bound", state["bound"])
        if state.get("count_noise_std") is not None:
            self.count_noise_std = float(state["count_noise_std"])
        self.last_fraction = state.get("last_fraction")
        self.unclipped = 0

    def __repr__(self) -> str:
        return (f"AdaptiveQuantileClipping(target_quantile={self.target_quantile}, "
                f"learning_rate={self.learning_rate}, count_noise_std={self.count_noise_std}, "
                f"bound={self.bound})")


def resolve_clipping(clipping: Any, *, stability: float = 0.01) -> tuple[str, ClipRule | None]:
    """(clipper structure, rule) for the optimizers' ``clipping`` argument: ``"flat"`` or
    ``"per_layer"`` (min(1, C / ||g||), no rule), ``"automatic"`` (:class:`AutomaticClipping`
    with ``stability``), ``"adaptive"`` (:class:`AdaptiveQuantileClipping` with the paper's
    defaults), or a :class:`ClipRule` instance."""
    if isinstance(clipping, ClipRule):
        return clipping.structure, clipping
    if clipping in ("flat", "per_layer"):
        return clipping, None
    if clipping == "automatic":
        return "flat", AutomaticClipping(stability)
    if clipping == "adaptive":
        return "flat", AdaptiveQuantileClipping()
    raise ValueError(
        "clipping must be 'flat', 'per_layer', 'automatic', 'adaptive' or a "
        f"dpsharp.torch.clipping.ClipRule, got {clipping!r}"
    )
