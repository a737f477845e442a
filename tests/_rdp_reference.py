"""Independent mpmath references for the RDP tests (50 significant digits).

log(A_alpha - 1) of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019):
A_alpha = E_{z ~ N(0, sigma^2)}[(1 - q + q exp((2z - 1)/(2 sigma^2)))^alpha]. Integer orders use
the exact binomial sum A = sum_k C(alpha,k) (1-q)^(alpha-k) q^k exp(k(k-1)/(2 sigma^2)) (then
subtract 1 at 50 digits); fractional orders integrate the definition with mpmath.quad over
pieces split around the integrand's peaks. Written directly from the formulas, sharing no code
with dpsharp.
"""

from __future__ import annotations

import mpmath

DIGITS = 50


def log_a_minus_one(q: float, sigma: float, alpha: float) -> mpmath.mpf:
    with mpmath.workdps(DIGITS + 20):
        q_m, s_m, a_m = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(alpha)
        if q == 1.0:
            return mpmath.log(mpmath.expm1(a_m * (a_m - 1) / (2 * s_m**2)))
        if float(alpha).is_integer():
            n = int(alpha)
            total = mpmath.mpf(0)
            for k in range(n + 1):
                total += (
                    mpmath.binomial(n, k)
                    * (1 - q_m) ** (n - k)
                    * q_m**k
                    * mpmath.exp(mpmath.mpf(k * (k - 1)) / (2 * s_m**2))
                )
            return mpmath.log(total - 1)

        def integrand(t: mpmath.mpf) -> mpmath.mpf:
            u = q_m * mpmath.expm1(t / s_m - 1 / (2 * s_m**2))
            return mpmath.npdf(t) * ((1 + u) ** a_m - 1 - a_m * u)

        peak = a_m / s_m  # the far peak of the integrand (in t = z / sigma)
        split = s_m * mpmath.log((1 - q_m) / q_m) + 1 / (2 * s_m)
        points = sorted(
            {
                mpmath.mpf(x)
                for x in [-60, -8, -4, -2, -1, 0, 1, 2, 4, 8]
                + [peak + d for d in (-30, -12, -6, -3, -1.5, 0, 1.5, 3, 6, 12, 30)]
                + [split, 1 / (2 * s_m), 2 / s_m]
            }
        )
        points = [p for p in points if -60 <= p <= peak + 60]
        points.append(peak + 60 if peak + 60 > points[-1] else points[-1] + 60)
        value = mpmath.quad(integrand, points, maxdegree=10)
        return mpmath.log(value)


def rdp(q: float, sigma: float, alpha: float) -> mpmath.mpf:
    """D_alpha = log(A_alpha) / (alpha - 1) at 50 digits."""
    with mpmath.workdps(DIGITS + 20):
        la = log_a_minus_one(q, sigma, alpha)
        return mpmath.log1p(mpmath.exp(la)) / (mpmath.mpf(alpha) - 1)
