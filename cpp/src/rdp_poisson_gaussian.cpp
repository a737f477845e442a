// Renyi divergence of the Poisson-subsampled Gaussian mechanism under add/remove one.
//
// With L(z) = exp((2z - 1)/(2 sigma^2)) the likelihood ratio N(1, sigma^2)/N(0, sigma^2) and
// u = q (L - 1), Mironov, Talwar, Zhang 2019 (Sections 3.1-3.3) show that
//   D_alpha = log(A_alpha)/(alpha - 1),  A_alpha = E_{z ~ N(0, sigma^2)}[(1 + u)^alpha],
// the maximum over the two directions of the add/remove relation. Since E[u] = 0,
//   A_alpha - 1 = E[(1 + u)^alpha - 1 - alpha u],
// an expectation of a NON-NEGATIVE function (convexity of x^alpha). Computing A - 1 directly,
// as a sum or integral of non-negative terms, is what makes tiny divergences (q = 1e-6,
// sigma = 1000: D ~ 1e-18) come out to full relative precision, where computing A and then
// log(A) would cancel catastrophically. log A = log1p(A - 1) keeps that precision.
//
// Integer alpha: the binomial expansion (MTZ Section 3.3) with the "- 1" folded into each term,
//   A - 1 = sum_{k=2}^{alpha} C(alpha, k) (1-q)^(alpha-k) q^k expm1(k (k-1) / (2 sigma^2)),
// all terms >= 0, summed in log space.
// Fractional alpha: quadrature in t = z / sigma of
//   phi(t) g(u),  g(u) = beta * [(1+u) log(1+u) - u] + (1+u) * e1(beta log(1+u)),
// beta = alpha - 1, e1(x) = expm1(x) - x. Both brackets are >= 0 for every u > -1, so g is
// evaluated without cancellation (each bracket by its Taylor series near 0). First the
// trapezoidal rule on the whole line (the integrand is analytic in the strip |Im t| < pi sigma
// and decays like a Gaussian, so the rule converges geometrically in 1/h: Trefethen and
// Weideman 2014, "The exponentially convergent trapezoidal rule", Section 5), truncated where
// proven tail bounds are negligible; where it does not settle within a few halvings of the
// step, adaptive Gauss-Kronrod (7/15) quadrature. Either carries its error estimate; if neither
// can certify the target precision the order gets +inf.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpsharp/numerics.hpp"
#include "dpsharp/rdp.hpp"

namespace dpsharp::rdp {
namespace {

constexpr double kLogSqrt2Pi = 0.91893853320467274178;  // log(sqrt(2 pi))
constexpr double kLog2 = 0.69314718055994530942;
// the unit roundoff of double, 2^-53
constexpr double kUnitRoundoff = 1.1102230246251565e-16;
// The quadrature stops when its error estimate (QUADPACK's qk15 estimate, summed over pieces)
// is below this fraction of the integral: 100x below the 1e-10 target.
constexpr double kQuadratureTolerance = 1e-12;
constexpr std::size_t kMaxIntervals = 4000;
// Orders above this are refused (the integer sum costs O(alpha)).
constexpr double kMaxOrder = 1e6;

// 1/k! for k = 2..21 scaled by 2 (so the series below starts at 1), and 1/(k(k-1)) for
// k = 2..21: Taylor coefficients used near 0, where the closed forms cancel.
constexpr double kInvFactorialTimes2[20] = {
    1.0, 1.0 / 3, 1.0 / 12, 1.0 / 60, 1.0 / 360, 1.0 / 2520, 1.0 / 20160, 1.0 / 181440,
    1.0 / 1814400, 1.0 / 19958400, 1.0 / 239500800, 1.0 / 3113510400.0, 1.0 / 43589145600.0,
    1.0 / 653837184000.0, 1.0 / 10461394944000.0, 1.0 / 177843714048000.0,
    1.0 / 3201186852864000.0, 1.0 / 60822550204416000.0, 1.0 / 1216451004088320000.0,
    1.0 / 25545471085854720000.0};
constexpr double kInvKKm1[20] = {
    1.0 / 2,   1.0 / 6,   1.0 / 12,  1.0 / 20,  1.0 / 30,  1.0 / 42,  1.0 / 56,
    1.0 / 72,  1.0 / 90,  1.0 / 110, 1.0 / 132, 1.0 / 156, 1.0 / 182, 1.0 / 210,
    1.0 / 240, 1.0 / 272, 1.0 / 306, 1.0 / 342, 1.0 / 380, 1.0 / 420};

// log(exp(x) - 1 - x) for any real x (the value is >= 0, and 0 only at x = 0).
double log_e1(double x) noexcept {
  if (x == 0.0) return kNegInf;
  if (std::fabs(x) < 0.125) {
    // sum_{k>=2} x^k / k! = x^2/2 * sum_{i>=0} c_i x^i; |x| < 1/8 -> 20 terms exceed 1e-17
    double sum = 0.0;
    for (int i = 19; i >= 0; --i) sum = sum * x + kInvFactorialTimes2[i];
    return 2.0 * std::log(std::fabs(x)) - kLog2 + std::log(sum);
  }
  if (x > 0.0) {
    // expm1(x) - x loses at most a factor ~16 to cancellation for x >= 1/8
    if (x < 40.0) return std::log(std::expm1(x) - x);
    return x + std::log1p(-(1.0 + x) * std::exp(-x));
  }
  return std::log(std::exp(x) - 1.0 - x);
}

// log((1+u) log(1+u) - u) for u > -1, given u and L = log1p(u) (u may be +inf, then L is
// finite and large).
double log_phi(double u, double L) noexcept {
  if (u == 0.0) return kNegInf;
  if (std::fabs(u) < 0.125) {
    // sum_{k>=2} (-1)^k u^k / (k (k-1)) = u^2 (1/2 - u/6 + u^2/12 - ...); 20 terms for |u| < 1/8
    double sum = 0.0;
    for (int i = 19; i >= 0; --i) sum = sum * -u + kInvKKm1[i];
    return 2.0 * std::log(std::fabs(u)) + std::log(sum);
  }
  if (std::isinf(u)) return L + std::log(L - 1.0);
  return std::log((1.0 + u) * L - u);
}

struct Integrand {
  double q, sigma, alpha;
  double log_q, log_1mq, beta, log_beta, inv_sigma, shift;

  Integrand(double q_, double sigma_, double alpha_)
      : q(q_),
        sigma(sigma_),
        alpha(alpha_),
        log_q(std::log(q_)),
        log_1mq(std::log1p(-q_)),
        beta(alpha_ - 1.0),
        log_beta(std::log(alpha_ - 1.0)),
        inv_sigma(1.0 / sigma_),
        shift(0.5 / (sigma_ * sigma_)) {}

  // log of phi(t) * g(u(t)), the integrand of A - 1 in t = z / sigma.
  double operator()(double t) const noexcept {
    const double s = t * inv_sigma - shift;
    double u;
    double L;
    if (s < 700.0) {
      u = q * std::expm1(s);
      L = std::log1p(u);
    } else {
      u = kInf;
      L = log_q + s + std::log1p(std::exp(log_1mq - log_q - s));
    }
    const double log_term1 = log_beta + log_phi(u, L);
    const double log_term2 = L + log_e1(beta * L);
    return -0.5 * t * t - kLogSqrt2Pi + log_add_exp(log_term1, log_term2);
  }

  // phi(t) g(u(t)) e^{-log_scale}: the same integrand in linear arithmetic (half the
  // transcendental calls), where that is exact to rounding: (1+u)^alpha well inside the double
  // range and |u| far from underflow (u^2 is a factor of g); elsewhere exp of the log form.
  double scaled(double t, double log_scale) const noexcept {
    const double s = t * inv_sigma - shift;
    if (s < 700.0) {
      const double u = q * std::expm1(s);
      const double L = std::log1p(u);
      const double au = std::fabs(u);
      if (alpha * L < 600.0 && au > 1e-100) {
        double phi;  // (1+u) log(1+u) - u >= 0
        if (au < 0.125) {
          double sum = 0.0;
          for (int i = 19; i >= 0; --i) sum = sum * -u + kInvKKm1[i];
          phi = u * u * sum;
        } else {
          phi = (1.0 + u) * L - u;
        }
        const double x = beta * L;
        double e1;  // e^x - 1 - x >= 0
        if (std::fabs(x) < 0.125) {
          double sum = 0.0;
          for (int i = 19; i >= 0; --i) sum = sum * x + kInvFactorialTimes2[i];
          e1 = 0.5 * x * x * sum;
        } else {
          e1 = std::expm1(x) - x;
        }
        return (beta * phi + (1.0 + u) * e1) * std::exp(-0.5 * t * t - kLogSqrt2Pi - log_scale);
      }
    }
    return std::exp((*this)(t) - log_scale);
  }
};

// Gauss-Kronrod 7/15 nodes and weights on [-1, 1] (QUADPACK qk15).
constexpr double kXgk[8] = {0.991455371120812639206854697526329, 0.949107912342758524526189684047851,
                            0.864864423359769072789712788640926, 0.741531185599394439863864773280788,
                            0.586087235467691130294144845693013, 0.405845151377397166906606412076961,
                            0.207784955007898467600689403773245, 0.000000000000000000000000000000000};
constexpr double kWgk[8] = {0.022935322010529224963732008058970, 0.063092092629978553290700663189204,
                            0.104790010322250183839876322541518, 0.140653259715525918745189590510238,
                            0.169004726639267902826583426598550, 0.190350578064785409913256402421014,
                            0.204432940075298892414161999234649, 0.209482141084727828012999174891714};
constexpr double kWg[4] = {0.129484966168869693270611432679082, 0.279705391489276667901467771423780,
                           0.381830050505118944950369775488975, 0.417959183673469387755102040816327};

struct Piece {
  double a, b;
  double log_max;  // the largest log-integrand value seen on the piece
  double kronrod;  // integral / exp(log_max)
  double error;    // |kronrod - gauss| / exp(log_max)
};

Piece integrate_piece(const Integrand& f, double a, double b) {
  const double half = 0.5 * (b - a);
  const double mid = 0.5 * (a + b);
  double values[15];
  values[7] = f(mid);
  for (int j = 0; j < 7; ++j) {
    values[j] = f(mid - half * kXgk[j]);
    values[14 - j] = f(mid + half * kXgk[j]);
  }
  double log_max = kNegInf;
  for (double v : values) log_max = std::max(log_max, v);
  Piece piece{a, b, log_max, 0.0, 0.0};
  if (log_max == kNegInf) return piece;
  double kronrod = kWgk[7] * std::exp(values[7] - log_max);
  double gauss = kWg[3] * std::exp(values[7] - log_max);
  for (int j = 0; j < 7; ++j) {
    const double pair = std::exp(values[j] - log_max) + std::exp(values[14 - j] - log_max);
    kronrod += kWgk[j] * pair;
    if (j % 2 == 1) gauss += kWg[j / 2] * pair;
  }
  // QUADPACK's (qk15) error estimate: the Kronrod-Gauss difference, sharpened by
  // (200 |K - G| / resasc)^1.5 for smooth integrands, never above resasc.
  const double mean = 0.5 * kronrod;
  double resasc = kWgk[7] * std::fabs(std::exp(values[7] - log_max) - mean);
  for (int j = 0; j < 7; ++j) {
    resasc += kWgk[j] * (std::fabs(std::exp(values[j] - log_max) - mean) +
                         std::fabs(std::exp(values[14 - j] - log_max) - mean));
  }
  double error = std::fabs(kronrod - gauss);
  if (resasc != 0.0 && error != 0.0) error = resasc * std::min(1.0, std::pow(200.0 * error / resasc, 1.5));
  piece.kronrod = kronrod * half;
  piece.error = error * half;
  return piece;
}

// The modes of h(t) = -t^2/2 + alpha log(1 - q + q e^{s(t)}), which bounds the log-integrand
// from above where u > 0 and matches it where u >> 1/alpha. h' = -t + alpha p(t)/sigma with
// p a logistic function of t, so h'' = -1 + (alpha/sigma^2) p (1-p) changes sign at most twice
// and h has at most two local maxima, all in [0, alpha/sigma]; each is bracketed between the
// inflection points and found by bisection.
std::vector<std::pair<double, double>> modes_of_envelope(const Integrand& f) {
  const double q = f.q, sigma = f.sigma, alpha = f.alpha;
  const double logit_q = f.log_q - f.log_1mq;
  auto p_of = [&](double t) {
    const double x = logit_q + t / sigma - f.shift;
    return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
  };
  auto dh = [&](double t) { return -t + alpha * p_of(t) / sigma; };
  auto t_of_p = [&](double p) { return sigma * (std::log(p / (1.0 - p)) - logit_q + f.shift); };
  std::vector<double> cuts{0.0, alpha / sigma};
  const double disc = 1.0 - 4.0 * sigma * sigma / alpha;
  if (disc > 0.0) {
    const double root = std::sqrt(disc);
    for (double p : {0.5 * (1.0 - root), 0.5 * (1.0 + root)}) {
      if (p > 0.0 && p < 1.0) {
        const double t = t_of_p(p);
        if (t > 0.0 && t < alpha / sigma) cuts.push_back(t);
      }
    }
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<double, double>> modes;  // (location, width)
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    double lo = cuts[i], hi = cuts[i + 1];
    const double dlo = dh(lo), dhi = dh(hi);
    if (!(dlo >= 0.0 && dhi <= 0.0)) continue;  // a maximum needs h' going from + to -
    for (int it = 0; it < 200 && hi - lo > 1e-12 * (1.0 + std::fabs(hi)); ++it) {
      const double m = 0.5 * (lo + hi);
      (dh(m) > 0.0 ? lo : hi) = m;
    }
    const double t = 0.5 * (lo + hi);
    const double p = p_of(t);
    const double curvature = 1.0 - alpha / (sigma * sigma) * p * (1.0 - p);
    modes.emplace_back(t, 1.0 / std::sqrt(std::max(curvature, 1e-8)));
  }
  (void)q;
  return modes;
}

// log(A - 1) by adaptive Gauss-Kronrod quadrature, or +inf if the precision cannot be
// certified.
double log_a_minus_one_kronrod(const Integrand& f) {
  const double sigma = f.sigma, alpha = f.alpha;
  // The integrand is negligible outside [-40, alpha/sigma + 40]: left of t = 1/(2 sigma) it is
  // at most phi(t) alpha q; right of alpha/sigma it is below phi(t)(1+u)^alpha, whose log has
  // derivative <= alpha/sigma - t, so it falls by > 800 nats within 40 units.
  const double lo = -40.0;
  const double hi = std::max(alpha / sigma, 0.5 / sigma) + 40.0;
  std::vector<double> cuts{lo, -20.0, hi};
  for (double t = -12.0; t <= 12.0; t += 6.0) cuts.push_back(t);
  cuts.push_back(0.5 / sigma);
  cuts.push_back(2.0 / sigma);
  cuts.push_back(alpha / sigma);
  for (const auto& [mode, width] : modes_of_envelope(f)) {
    // +-10 widths hold all but ~e^-50 of a Gaussian-shaped peak; adaptivity refines further.
    const double w = std::min(width, (hi - lo) / 32.0);
    for (double k : {-10.0, -5.0, -2.0, 0.0, 2.0, 5.0, 10.0}) cuts.push_back(mode + k * w);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<Piece> pieces;
  pieces.reserve(256);
  double previous = lo;
  for (double c : cuts) {
    if (c <= previous) continue;
    if (c > hi) c = hi;
    if (c - previous > 1e-9) {
      pieces.push_back(integrate_piece(f, previous, c));
      previous = c;
    }
    if (c >= hi) break;
  }
  while (true) {
    double global_max = kNegInf;
    for (const Piece& p : pieces) global_max = std::max(global_max, p.log_max);
    if (global_max == kNegInf) return kNegInf;  // cannot happen for q > 0; A - 1 = 0
    if (!std::isfinite(global_max)) return kInf;
    double total = 0.0, total_error = 0.0;
    std::size_t worst = 0;
    double worst_error = -1.0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const double scale = std::exp(pieces[i].log_max - global_max);
      total += pieces[i].kronrod * scale;
      const double err = pieces[i].error * scale;
      total_error += err;
      if (err > worst_error) {
        worst_error = err;
        worst = i;
      }
    }
    if (!(total > 0.0) || !std::isfinite(total)) return kInf;
    // D_alpha = log1p(A - 1)/(alpha - 1) needs A - 1 only to relative precision
    // tol * max(1, log A): when A is large, log A absorbs a relative error of A - 1 as an
    // absolute one. (Rounding in the log-integrand is ~1e-16 * log A, so this is reachable.)
    const double log_am1 = global_max + std::log(total);
    const double log_a = log_am1 < 0.0 ? std::log1p(std::exp(log_am1))
                                       : log_am1 + std::log1p(std::exp(-log_am1));
    if (total_error <= kQuadratureTolerance * std::max(1.0, log_a) * total) return log_am1;
    if (pieces.size() >= kMaxIntervals) return kInf;  // fail closed
    const Piece split = pieces[worst];
    const double mid = 0.5 * (split.a + split.b);
    if (!(mid > split.a && mid < split.b)) return kInf;
    pieces[worst] = integrate_piece(f, split.a, mid);
    pieces.push_back(integrate_piece(f, mid, split.b));
  }
}

// log(A - 1) by the trapezoidal rule on a uniform grid t_k = k h, or NaN where the rule does
// not certify the target precision here (the caller then integrates adaptively).
//
// Truncation, with proven bounds on what is left out (each must be below e^-40 of the sum):
//  * left of t_L <= min(0, 1/(2 sigma)): there u in (-q, 0], and by Taylor's theorem
//    (1+u)^alpha - 1 - alpha u = alpha (alpha-1)/2 (1+xi)^(alpha-2) u^2 for some xi in [u, 0],
//    so the integrand is at most phi(t) C_L, C_L = alpha (alpha-1)/2 q^2 max(1, (1-q)^(alpha-2)),
//    and the tail at most C_L Phi(t_L);
//  * right of t_R >= 1/(2 sigma): there u > 0, the integrand is at most
//    e^{h(t)} = phi(t) (1 - q + q e^{s(t)})^alpha, and log(1 - q + q e^s) grows with slope
//    p <= 1 in s = t/sigma - 1/(2 sigma^2), so h(t_R + x) <= h(t_R) - x^2/2 + (alpha/sigma - t_R) x
//    and the tail is at most e^{h(t_R)} sqrt(2 pi) e^{c^2/2} Phi(c), c = alpha/sigma - t_R.
// The grid is walked outwards from 0 until both bounds are below e^-50 of the largest value seen
// and every peak of the integrand's envelope (modes_of_envelope) is inside.
//
// Discretisation: the sums with steps 2h and h are compared; the rule's error falls like
// e^{-2 pi d / h} (d: the half-width of the strip of analyticity), so halving h squares the
// relative error, and a difference below 1e-10 of the sum leaves the finer sum ~1e-20 from the
// integral. Otherwise h is halved (midpoints added) up to three times.
double log_a_minus_one_trapezoid(const Integrand& f) {
  constexpr std::size_t kMaxPoints = 1200;  // beyond, adaptive Gauss-Kronrod is cheaper
  constexpr double kWalkMargin = 50.0;      // nats below the largest value: the tails' share
  constexpr double kTailMargin = 40.0;      // what the tail bounds must be below at the end
  constexpr double kSettled = 1e-10;        // relative difference of the 2h and h sums
  const double kSmall = std::exp(-30.0);    // the tail bounds are tried below this share
  const double sigma = f.sigma, alpha = f.alpha, q = f.q;
  const double zero_at = f.shift * sigma;  // t = 1/(2 sigma): u = 0
  double right_from = zero_at, left_from = std::min(0.0, zero_at);
  // The values are computed as f(t) e^{-log_scale}, log_scale the largest log-integrand at 0
  // and at the envelope's peaks: within a few hundred nats of the maximum, so the scaled values
  // neither overflow nor lose what matters to underflow (if they do: NaN, and the caller falls
  // back).
  double log_scale = f(0.0);
  for (const auto& mode : modes_of_envelope(f)) {
    right_from = std::max(right_from, mode.first);
    left_from = std::min(left_from, mode.first);
    log_scale = std::max(log_scale, f(mode.first));
  }
  if (!std::isfinite(log_scale)) return kNaN;
  const double log_left_constant = std::log(alpha * (alpha - 1.0) * 0.5) + 2.0 * f.log_q +
                                   std::max(0.0, (alpha - 2.0) * f.log_1mq);
  auto log_left_tail = [&](double t) { return log_left_constant + log_normal_cdf(t); };
  const double alpha_over_sigma = alpha / sigma;
  auto log_right_tail = [&](double t) {
    const double s = t * f.inv_sigma - f.shift;
    const double log_mixture =
        s < 0.0 ? std::log1p(q * std::expm1(s))
                : s + f.log_q + std::log1p(std::exp(f.log_1mq - f.log_q - s));
    const double c = alpha_over_sigma - t;
    // h(t) + log(sqrt(2 pi) e^{c^2/2} Phi(c)); the two log(sqrt(2 pi)) cancel
    return -0.5 * t * t + alpha * log_mixture + 0.5 * c * c + log_normal_cdf(c);
  };
  // The singularities nearest the real axis (1 - q + q e^s = 0) are at Im t = pi sigma; a step
  // of 0.3 sigma (at most 0.4) makes the first comparison settle for the usual orders.
  const double h = std::min(0.3 * sigma, 0.4);
  std::vector<double> right_values{f.scaled(0.0, log_scale)};  // k = 0, 1, ...
  std::vector<double> left_values;                              // k = -1, -2, ...
  right_values.reserve(128);
  left_values.reserve(64);
  double largest = right_values[0];
  // the bounds (a few transcendental calls) are tried once the integrand is small
  auto walked_far = [&](double v, double t, bool right) {
    if (!(v < kSmall * largest)) return false;
    const double log_largest = log_scale + std::log(largest);
    return right ? t >= right_from && log_right_tail(t) < log_largest - kWalkMargin
                 : t <= left_from && log_left_tail(t) < log_largest - kWalkMargin;
  };
  for (long k = 1;; ++k) {
    const double t = static_cast<double>(k) * h;
    const double v = f.scaled(t, log_scale);
    right_values.push_back(v);
    largest = std::max(largest, v);
    if (walked_far(v, t, true)) break;
    if (right_values.size() > kMaxPoints || !std::isfinite(v)) return kNaN;
  }
  for (long k = 1;; ++k) {
    const double t = -static_cast<double>(k) * h;
    const double v = f.scaled(t, log_scale);
    left_values.push_back(v);
    largest = std::max(largest, v);
    if (walked_far(v, t, false)) break;
    if (left_values.size() + right_values.size() > kMaxPoints || !std::isfinite(v)) return kNaN;
  }
  if (!(largest > 0.0) || !std::isfinite(largest)) return kNaN;
  const auto n_left = static_cast<long>(left_values.size());
  const auto n_right = static_cast<long>(right_values.size()) - 1;
  // sums on the grid of step h (fine) and on its even points (step 2h)
  double fine = 0.0, coarse = 0.0;
  for (std::size_t i = 0; i < right_values.size(); ++i) {
    fine += right_values[i];
    if (i % 2 == 0) coarse += right_values[i];
  }
  for (std::size_t i = 0; i < left_values.size(); ++i) {
    fine += left_values[i];
    if (i % 2 == 1) coarse += left_values[i];
  }
  double previous = 2.0 * h * coarse;
  double current = h * fine;
  double step = h;
  std::size_t points = left_values.size() + right_values.size();
  for (int halving = 0; !(std::fabs(current - previous) <= kSettled * current); ++halving) {
    const long intervals = (n_left + n_right) << halving;
    points += static_cast<std::size_t>(intervals);
    if (halving == 3 || points > kMaxPoints) return kNaN;
    const double start = -static_cast<double>(n_left) * h;
    double midpoints = 0.0;
    for (long i = 0; i < intervals; ++i) {
      midpoints += f.scaled(start + (static_cast<double>(i) + 0.5) * step, log_scale);
    }
    previous = current;
    current = 0.5 * current + 0.5 * step * midpoints;
    step *= 0.5;
  }
  if (!(current > 0.0) || !std::isfinite(current)) return kNaN;
  const double log_sum = log_scale + std::log(current);
  const double log_tails = log_add_exp(log_left_tail(-static_cast<double>(n_left) * h),
                                       log_right_tail(static_cast<double>(n_right) * h));
  if (!(log_tails < log_sum - kTailMargin)) return kNaN;
  return log_sum;
}

// log(A - 1) by quadrature: the trapezoidal rule where it certifies the precision, adaptive
// Gauss-Kronrod elsewhere (QuadratureMethod::kAuto), or one of them alone.
double log_a_minus_one_quadrature(double q, double sigma, double alpha,
                                  QuadratureMethod method = QuadratureMethod::kAuto) {
  const Integrand f(q, sigma, alpha);
  // The walk of the trapezoidal rule spans about [-9, max(alpha, 1/2)/sigma + 9] with steps of
  // 0.3 sigma (at most 0.4): where that is many points (small sigma, large alpha) the adaptive
  // rule, which places its points where the mass is, is cheaper.
  const double expected_points =
      (std::max(alpha, 0.5) / sigma + 18.0) / std::min(0.3 * sigma, 0.4);
  if (method == QuadratureMethod::kAuto && expected_points > 400.0) {
    method = QuadratureMethod::kKronrod;
  }
  if (method != QuadratureMethod::kKronrod) {
    const double value = log_a_minus_one_trapezoid(f);
    if (!std::isnan(value) || method == QuadratureMethod::kTrapezoid) return value;
  }
  return log_a_minus_one_kronrod(f);
}

// Stirling's error log(n!) - log(sqrt(2 pi n) (n/e)^n) (Loader 2000, "Fast and accurate
// computation of binomial probabilities"): its asymptotic series above 15 (truncation below
// 3e-16), lgamma below (absolute error below 1e-14 there). 0 at n = 0.
double stirling_error(double n) noexcept {
  constexpr double kS0 = 1.0 / 12.0, kS1 = 1.0 / 360.0, kS2 = 1.0 / 1260.0, kS3 = 1.0 / 1680.0,
                   kS4 = 1.0 / 1188.0;
  if (n == 0.0) return 0.0;
  if (n <= 15.0) return std::lgamma(n + 1.0) - (n + 0.5) * std::log(n) + n - kLogSqrt2Pi;
  const double nn = n * n;
  if (n > 500.0) return (kS0 - kS1 / nn) / n;
  if (n > 80.0) return (kS0 - (kS1 - kS2 / nn) / nn) / n;
  if (n > 35.0) return (kS0 - (kS1 - (kS2 - kS3 / nn) / nn) / nn) / n;
  return (kS0 - (kS1 - (kS2 - (kS3 - kS4 / nn) / nn) / nn) / nn) / n;
}

// The deviance x log(x / m) + m - x >= 0 (Loader 2000), by its series in v = (x - m)/(x + m)
// where |v| < 0.1, else directly (there it is at least 0.017 (x + m) and the direct form loses
// at most about 30 ulps of it).
double binomial_deviance(double x, double m) noexcept {
  if (std::fabs(x - m) < 0.1 * (x + m)) {
    double v = (x - m) / (x + m);
    double sum = (x - m) * v;
    double power = 2.0 * x * v;
    v *= v;
    for (int j = 1; j < 1000; ++j) {
      power *= v;
      const double next = sum + power / (2.0 * j + 1.0);
      if (next == sum) return next;
      sum = next;
    }
    return sum;
  }
  return x * std::log(x / m) + m - x;
}

// log of the binomial probability C(n, k) q^k (1 - q)^(n - k) for 0 < k < n and 0 < q < 1, by
// Loader's saddle-point form: its rounding error is a few ulps of the deviances and of the
// logarithms it adds, not of log C(n, k) and k log q, which cancel (at n = 1e6 those are
// 1e7 in size, and their difference lost 1e-9 relative). ``error`` receives a bound on the
// absolute error of the result.
double log_binomial_probability(double n, double k, double q, double& error) noexcept {
  const double mean = n * q;
  const double rest_mean = n * (1.0 - q);
  const double dev_k = binomial_deviance(k, mean);
  const double dev_rest = binomial_deviance(n - k, rest_mean);
  const double log_circle = 2.0 * kLogSqrt2Pi + std::log(k) + std::log1p(-k / n);
  const double stirling = stirling_error(n) - stirling_error(k) - stirling_error(n - k);
  // 64 ulps of every part (the direct deviance's ~30, the roundings of n q and 1 - q moving a
  // deviance by at most |x - m| u, the sums), and 4e-14 per Stirling error.
  error = 64.0 * kUnitRoundoff *
              (dev_k + dev_rest + std::fabs(log_circle) + 2.0 * std::fabs(k - mean) + 1.0) +
          1.2e-13;
  return stirling - dev_k - dev_rest - 0.5 * log_circle;
}

// log(A - 1) for integer alpha by the non-negative binomial sum, rounded up.
//   term(k) = log[C(alpha,k) q^k (1-q)^(alpha-k)] + log expm1(k(k-1) c),  c = 1/(2 sigma^2).
// Terms more than kSkip nats below the largest term change the sum by < alpha e^-kSkip relative,
// so runs of them are skipped with a proven upper bound: for i >= k the increment
// term(i+1) - term(i) is at most log((alpha-k)/(k+1)) + log(q/(1-q)) + kappa 2 i c with
// kappa = 1/(1 - exp(-k(k-1)c)) (log expm1 has derivative 1/(1-e^{-y}), decreasing in y), so
// after j steps term(k+j) <= term(k) + j a0 + kappa c j (2k + j - 1). The sweep jumps to the
// first j where that bound reaches the threshold. The threshold uses a lower bound of the
// largest term (the maximum over a coarse sample of k), so nothing that matters is skipped.
// The result is moved up by a bound on its rounding error (each term's, weighted by its share
// of the sum; the exponentials and the sum's) and on the skipped terms' share, so it is never
// below the exact log(A - 1) (Mironov, Talwar, Zhang 2019, Section 3.3's sum).
double log_a_minus_one_binomial(double q, double sigma, double alpha) {
  constexpr double kSkip = 60.0;
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);  // q < 1 here (q = 1 is the Gaussian itself)
  const double c = 0.5 / (sigma * sigma);
  const long n = static_cast<long>(alpha);
  auto log_expm1_fast = [](double y) { return y > 37.0 ? y : log_expm1(y); };
  // log P(K = k) for K ~ Binomial(alpha, q), directly (Loader's form), with its error bound
  auto log_probability_at = [&](long k, double& error) {
    if (k == n) {
      error = 4.0 * kUnitRoundoff * std::fabs(alpha * log_q);
      return alpha * log_q;
    }
    return log_binomial_probability(alpha, static_cast<double>(k), q, error);
  };
  // term(k) from log P(K = k) and its error; adds the error of the rest of the term
  auto term_from = [&](long k, double log_probability, double& error) {
    const double kd = static_cast<double>(k);
    const double y = kd * (kd - 1.0) * c;
    const double growth = log_expm1_fast(y);  // y > 37: y >= log expm1(y), rounded up
    // y carries 4 roundings, moving log expm1(y) by at most 4 u max(y, 1) (its derivative is
    // 1/(1 - e^-y) <= max(1, 2/y)); log expm1 itself 4 ulps; the sum 2 ulps
    error += 8.0 * kUnitRoundoff * (y + 1.0) + 4.0 * kUnitRoundoff * std::fabs(growth);
    const double term = log_probability + growth;
    error += 2.0 * kUnitRoundoff * std::fabs(term);
    return term;
  };
  auto term_at = [&](long k, double& error) {
    return term_from(k, log_probability_at(k, error), error);
  };
  double unused_error = 0.0;
  // A lower bound on the largest term: a coarse sample (both ends, the binomial mode, 64 points).
  // Up to 64 terms nothing is skipped (the sample would cost as much as the sum).
  double threshold = kNegInf;
  if (n > 64) {
    double sampled_max = kNegInf;
    const long stride = std::max(1L, n / 64);
    for (long k = 2; k <= n; k += stride) {
      sampled_max = std::max(sampled_max, term_at(k, unused_error));
    }
    sampled_max = std::max(sampled_max, term_at(n, unused_error));
    const long mode = std::min(n, std::max(2L, static_cast<long>(q * alpha)));
    sampled_max = std::max(sampled_max, term_at(mode, unused_error));
    threshold = sampled_max - kSkip;
  }
  const double log_odds = log_q - log_1mq;

  double running_max = kNegInf;
  double running_sum = 0.0;    // sum of exp(term - running_max)
  double running_error = 0.0;  // sum of exp(term - running_max) * error(term)
  double largest_magnitude = 0.0;
  long included = 0;
  long k = 2;
  // log P(K = k) is carried from k to k + 1 by log((alpha - k)/(k + 1)) + log(q/(1 - q)) and
  // taken afresh (Loader's form) every 64 steps and after a jump; its error bound is carried too
  double log_probability_error = 0.0;
  double log_probability = log_probability_at(k, log_probability_error);
  long since_anchor = 0;
  while (k <= n) {
    double error = log_probability_error;
    const double term = term_from(k, log_probability, error);
    if (term >= threshold) {
      ++included;
      largest_magnitude = std::max(largest_magnitude, std::fabs(term));
      if (term > running_max) {
        const double scale = std::exp(running_max - term);
        running_sum = running_sum * scale + 1.0;
        running_error = running_error * scale + error;
        running_max = term;
      } else {
        const double weight = std::exp(term - running_max);
        running_sum += weight;
        running_error += weight * error;
      }
    } else if (k < n) {
      const double kd = static_cast<double>(k);
      const double y = kd * (kd - 1.0) * c;
      const double kappa = 1.0 / -std::expm1(-y);
      const double a0 = std::log((alpha - kd) / (kd + 1.0)) + log_odds;
      const double b = kappa * c;  // bound(j) = term + j a0 + b j (2k + j - 1)
      // smallest j >= 1 with b j^2 + (a0 + b (2k - 1)) j + (term - threshold) >= 0
      const double lin = a0 + b * (2.0 * kd - 1.0);
      const double gap = threshold - term;  // > 0
      const double disc = lin * lin + 4.0 * b * gap;
      const double j_real = (-lin + std::sqrt(disc)) / (2.0 * b);
      long jump = static_cast<long>(std::floor(j_real));
      if (!(jump > 1)) jump = 1;  // also catches NaN
      if (jump > 1) {
        k = std::min(n, k + jump);
        log_probability = log_probability_at(k, log_probability_error);
        since_anchor = 0;
        continue;
      }
    }
    ++k;
    if (k > n) break;
    if (++since_anchor == 64 || k == n) {
      log_probability = log_probability_at(k, log_probability_error);
      since_anchor = 0;
    } else {
      // the step's logarithm (2 ulps of it, its quotient's rounding included), the odds' (2 ulps
      // of log q and of log(1 - q)), and the two additions (an ulp of each partial sum)
      const double kd = static_cast<double>(k);
      const double step = std::log((alpha - kd + 1.0) / kd);
      log_probability += step + log_odds;
      log_probability_error += 2.0 * kUnitRoundoff * std::fabs(step) +
                               2.0 * kUnitRoundoff * (std::fabs(log_q) + std::fabs(log_1mq)) +
                               kUnitRoundoff * (std::fabs(step + log_odds) + std::fabs(log_probability));
    }
  }
  if (running_max == kNegInf) return kNegInf;
  // The terms' errors (relative errors of their exponentials, weighted by their shares), the
  // exponentials of the differences (4 ulps of the largest magnitude), the sum's roundings
  // (one ulp per term), and the skipped terms (below alpha e^-kSkip of the sum).
  const double margin = running_error / running_sum +
                        4.0 * kUnitRoundoff * (largest_magnitude + std::fabs(running_max)) +
                        static_cast<double>(included + 4) * kUnitRoundoff +
                        alpha * std::exp(-kSkip);
  return running_max + std::log(running_sum) + margin;
}

// Whether c = 1/(2 sigma^2) and 1/sigma are finite doubles. Below sigma ~ 7e-155 they overflow,
// and the integrand and the binomial terms, written in c, would read +inf - inf as NaN or lose
// the shift altogether (a finite, wrong quadrature); the divergence is +inf there.
bool shift_is_finite(double sigma) noexcept {
  return std::isfinite(0.5 / (sigma * sigma)) && std::isfinite(1.0 / sigma);
}

void check_order(double order) {
  if (!std::isfinite(order) || !(order > 1.0) || order > kMaxOrder) {
    throw std::invalid_argument("orders must be finite and in (1, 1e6], got " +
                                std::to_string(order));
  }
}

void check_poisson(double q, double sigma) {
  if (!std::isfinite(q) || !(q > 0.0) || q > 1.0) {
    throw std::invalid_argument("sampling_probability must be in (0, 1], got " + std::to_string(q));
  }
  if (!std::isfinite(sigma) || !(sigma > 0.0)) {
    throw std::invalid_argument("noise_multiplier must be in (0, inf), got " + std::to_string(sigma));
  }
}

}  // namespace

double poisson_gaussian_log_a_minus_one(double q, double sigma, double order,
                                        bool use_quadrature, QuadratureMethod method) {
  check_poisson(q, sigma);
  check_order(order);
  if (q == 1.0) return log_expm1(order * (order - 1.0) * 0.5 / (sigma * sigma));
  if (!shift_is_finite(sigma)) return kInf;
  if (!use_quadrature && order == std::floor(order)) return log_a_minus_one_binomial(q, sigma, order);
  return log_a_minus_one_quadrature(q, sigma, order, method);
}

void poisson_gaussian(double q, double sigma, const double* orders, std::size_t n, double* out) {
  check_poisson(q, sigma);
  for (std::size_t i = 0; i < n; ++i) check_order(orders[i]);
  const bool finite_shift = shift_is_finite(sigma);
  for (std::size_t i = 0; i < n; ++i) {
    const double alpha = orders[i];
    if (q == 1.0) {
      out[i] = gaussian_order_coefficient(alpha, sigma);  // no sampling: the Gaussian itself
      continue;
    }
    if (!finite_shift) {
      // D_alpha >= (alpha log q + alpha (alpha - 1) c) / (alpha - 1) with c = 1/(2 sigma^2)
      // (keep only the term q^alpha L^alpha of (1 - q + q L)^alpha, whose mean under
      // N(0, sigma^2) is q^alpha e^{alpha (alpha - 1) c}): infinite once c overflows.
      out[i] = kInf;
      continue;
    }
    const bool integer_order = alpha == std::floor(alpha);
    double log_am1 = integer_order ? log_a_minus_one_binomial(q, sigma, alpha)
                                   : log_a_minus_one_quadrature(q, sigma, alpha);
    if (!integer_order && std::isfinite(log_am1)) {
      // The quadrature's value is not an upper bound (it is within kQuadratureTolerance
      // max(1, log A) of A - 1, either side; 181 of 330 fractional grid points read up to
      // 6.5e-15 relative below 60-digit mpmath, and 1.3e-12 at sigma = 1e-5): A - 1 is raised
      // by twice that tolerance, as the integer orders' binomial sum is raised by its bound.
      const double rough_log_a = std::max(log_am1, 0.0) + std::log1p(std::exp(-std::abs(log_am1)));
      log_am1 += std::log1p(2.0 * kQuadratureTolerance * std::max(1.0, rough_log_a));
    }
    double log_a;
    if (std::isnan(log_am1) || log_am1 == kInf) {
      log_a = kInf;
    } else if (log_am1 < -600.0) {
      // log A = log1p(e^l) <= e^l, and e^l / (alpha - 1) may lie below the normal range (it
      // read 0 at q = 1e-170, sigma = 1: a claim of pure DP): one exponential of a value
      // within a few units of roundoff of |l|, raised past that and two doubles more.
      const double value = std::exp(log_am1 - std::log(alpha - 1.0));
      out[i] = std::nextafter(std::nextafter(value * (1.0 + 0x1p-40), kInf), kInf);
      continue;
    } else if (log_am1 < 0.0) {
      log_a = std::log1p(std::exp(log_am1));
    } else {
      log_a = log_am1 + std::log1p(std::exp(-log_am1));
    }
    out[i] = integer_order ? log_a / (alpha - 1.0)
                           : std::nextafter(log_a / (alpha - 1.0), kInf);  // (its roundings)
  }
}

}  // namespace dpsharp::rdp
