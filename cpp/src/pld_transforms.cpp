// Discrete Fourier transforms with a priori error bounds, for the FFT composition of PLDs (see
// pld.hpp: certified_rfft, certified_irfft, certified_band_dft; the error analysis is in
// python/dpsharp/accountants/_pld_numerics.py).
//
// Written here rather than taken from a library because the bounds need the algorithm's exact
// structure: every stage is a set of butterflies whose coefficients are single unit-modulus
// twiddles (so the componentwise bound of the whole transform is a product of per-stage
// factors), and every twiddle is formed in a way whose error is bounded.
//
// Speed without changing a bound: the data are held as separate real and imaginary arrays, so
// that the butterfly loops are plain element-wise loops the compiler vectorises (built for
// AVX-512, AVX2 and the baseline, vector_width.hpp; -ffp-contract=off, so every width computes
// the same bits); the radix-2 stages up to kBlock points run block by block while a block is
// in cache, and the larger stages two at a time (the same butterflies, one pass over memory);
// a real forward transform computes only the lower half of every partial transform (the rest
// are conjugates of it: real_transform), a real inverse transform of n points is a complex one
// of n / 2 points after one packing step; the twiddle tables of a size are built once and kept
// (PlanCache).
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "dpsharp/parallel.hpp"
#include "dpsharp/pld.hpp"
#include "dpsharp/vector_width.hpp"

namespace dpsharp::pld {
namespace {

using Complex = std::complex<double>;

// Plain complex product: (ac - bd) + i (ad + bc), each part with one rounding per operation
// (no FMA: the build has -ffp-contract=off), so |fl(xy) - xy| <= sqrt(2) gamma_2 |x| |y|
// (Higham 2002, Lemma 3.5).
inline Complex times(Complex a, Complex b) noexcept {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}

// e^{-2 pi i j / size} for 0 <= j < size (size a multiple of 8), with the angle reduced to
// [0, pi / 4] in integers (octant symmetry, exact) and evaluated as fl(fl(2 pi j') / size):
// relative angle error <= gamma_3, i.e. <= 0.79 gamma_3 absolute, plus one ulp of cos and sin.
Complex twiddle_at(std::int64_t j, std::int64_t size) noexcept {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const std::int64_t eighth = size / 8;
  const std::int64_t octant = j / eighth;
  std::int64_t r = j - octant * eighth;  // in [0, size / 8)
  // angle = 2 pi j / size = octant * pi / 4 + 2 pi r / size
  const bool mirror = (octant % 2) == 1;
  if (mirror) r = eighth - r;  // reflect within the octant: angle' = pi / 4 - angle
  const double angle = (kTwoPi * static_cast<double>(r)) / static_cast<double>(size);
  const double c = std::cos(angle);
  const double s = std::sin(angle);
  // (cos, sin) of the angle theta = octant * pi / 4 + phi, phi in [0, pi / 4): from the
  // reduced (c, s) of phi (or of pi/4 - phi for odd octants) by exact swaps and sign changes.
  double cos_theta = 0.0;
  double sin_theta = 0.0;
  switch (octant) {
    case 0: cos_theta = c; sin_theta = s; break;      // phi
    case 1: cos_theta = s; sin_theta = c; break;      // pi/2 - (pi/4 - phi)
    case 2: cos_theta = -s; sin_theta = c; break;     // pi/2 + phi
    case 3: cos_theta = -c; sin_theta = s; break;     // pi - (pi/4 - phi)
    case 4: cos_theta = -c; sin_theta = -s; break;    // pi + phi
    case 5: cos_theta = -s; sin_theta = -c; break;    // 3pi/2 - (pi/4 - phi)
    case 6: cos_theta = s; sin_theta = -c; break;     // 3pi/2 + phi
    default: cos_theta = c; sin_theta = -s; break;    // 2pi - (pi/4 - phi)
  }
  return {cos_theta, -sin_theta};
}

void check_size(std::int64_t size) {
  if (size < 8 || size % 8 != 0) throw std::invalid_argument("size must be a multiple of 8");
  std::int64_t odd = size;
  while (odd % 2 == 0) odd /= 2;
  if (odd > kMaxOddFactor) {
    throw std::invalid_argument("size must be an odd factor of at most 15 times a power of two");
  }
}

// w^j = e^{-2 pi i j / size} for 0 <= j < size from the quarter table (w^j, 0 <= j <= size / 4)
// by an exact rotation (a power of -i): the half turn a sign, the quarter turn a swap, both by
// comparisons (no integer division).
inline __attribute__((always_inline)) Complex quarter_twiddle(
    std::int64_t j, std::int64_t q, const double* __restrict quarter_re,
    const double* __restrict quarter_im) {
  const bool half_turn = j >= 2 * q;
  if (half_turn) j -= 2 * q;
  const bool quarter_turn = j >= q;
  if (quarter_turn) j -= q;
  const double re = quarter_re[j];
  const double im = quarter_im[j];
  const double sign = half_turn ? -1.0 : 1.0;
  return {sign * (quarter_turn ? im : re), sign * (quarter_turn ? -re : im)};
}

// Radix-2 stages of half-length up to this many points run block by block (a block of 2^12
// complex entries, 64 KiB as two arrays of doubles, stays in the L2 cache of every current
// x86 core).
constexpr std::int64_t kBlock = std::int64_t{1} << 12;

// Everything a transform of one size needs that does not depend on the data, built once.
// `size` is the circle n; the complex transform has `points` = n (sizes with an odd factor
// times 8) or n / 2 (the real transform through a half-size complex one, when 16 | n).
// Every twiddle is w^j = e^{-2 pi i j / n} taken from `quarter` (w^j for 0 <= j <= n / 4, each
// a twiddle_at value) by an exact multiplication by a power of -i, so every twiddle is within
// the error of one twiddle_at value.
struct Plan {
  std::int64_t size = 0;
  std::int64_t points = 0;
  std::int64_t odd = 1;
  int levels = 0;
  std::vector<double> quarter_re, quarter_im;      // w^j, 0 <= j <= n / 4
  std::vector<std::uint32_t> reversed;              // bit reversal of p over `levels` bits
  std::vector<double> coefficient_re, coefficient_im;  // odd x odd DFT matrix of stage 0
  std::vector<std::int64_t> stage_offset;           // stage l (half-length odd 2^l) twiddles
  std::vector<double> stage_re, stage_im;           // concatenated, stage l at stage_offset[l]

  // w^j for 0 <= j < n (quarter_twiddle).
  Complex twiddle_below(std::int64_t j) const noexcept {
    return quarter_twiddle(j, size / 4, quarter_re.data(), quarter_im.data());
  }

  std::size_t bytes() const noexcept {
    return 8 * (quarter_re.size() + quarter_im.size() + coefficient_re.size() +
                coefficient_im.size() + stage_re.size() + stage_im.size()) +
           4 * reversed.size();
  }
};

// The plan of a transform of `points` points on the circle `size`; `quarter_of` (optional) is a
// plan of the same size whose twiddle table is copied instead of recomputed (the same values).
// Every other table is read from the quarter table by exact turns (twiddle_below).
std::shared_ptr<const Plan> build_plan(std::int64_t size, std::int64_t points,
                                       const Plan* quarter_of = nullptr) {
  auto plan = std::make_shared<Plan>();
  plan->size = size;
  plan->points = points;
  std::int64_t odd = points;
  int levels = 0;
  while (odd % 2 == 0) {
    odd /= 2;
    ++levels;
  }
  plan->odd = odd;
  plan->levels = levels;
  const std::int64_t quarter = size / 4;
  if (quarter_of != nullptr && quarter_of->size == size) {
    plan->quarter_re = quarter_of->quarter_re;
    plan->quarter_im = quarter_of->quarter_im;
  } else {
    plan->quarter_re.resize(static_cast<std::size_t>(quarter + 1));
    plan->quarter_im.resize(static_cast<std::size_t>(quarter + 1));
    // twiddle_at reduces an angle of the second octant, j in (n / 8, n / 4), to the angle of
    // n / 4 - j in the first and swaps: w^j = (-Im w^{n/4-j}, -Re w^{n/4-j}), the same numbers
    // without a second cosine and sine. (j = n / 8 and n / 4 are computed: their reductions
    // differ in the sign of a zero.)
    const std::int64_t eighth = size / 8;
    for (std::int64_t j = 0; j <= quarter; ++j) {
      const auto at = static_cast<std::size_t>(j);
      if (j > eighth && j < quarter) {
        const auto mirror = static_cast<std::size_t>(quarter - j);
        plan->quarter_re[at] = -plan->quarter_im[mirror];
        plan->quarter_im[at] = -plan->quarter_re[mirror];
        continue;
      }
      const Complex w = twiddle_at(j, size);
      plan->quarter_re[at] = w.real();
      plan->quarter_im[at] = w.imag();
    }
  }
  const std::int64_t blocks = points / odd;
  // Bit reversal over `levels` bits: rev(p) = rev(p / 2) / 2 + (p & 1) 2^(levels - 1).
  plan->reversed.assign(static_cast<std::size_t>(blocks), 0);
  for (std::int64_t p = 1; p < blocks; ++p) {
    plan->reversed[static_cast<std::size_t>(p)] = static_cast<std::uint32_t>(
        (plan->reversed[static_cast<std::size_t>(p >> 1)] >> 1) |
        ((p & 1) << (levels - 1)));
  }
  const std::int64_t ratio = size / points;  // w_points^j = w^{j ratio}
  plan->coefficient_re.resize(static_cast<std::size_t>(odd * odd));
  plan->coefficient_im.resize(static_cast<std::size_t>(odd * odd));
  for (std::int64_t f = 0; f < odd; ++f) {
    for (std::int64_t a = 0; a < odd; ++a) {
      // ((f a) mod odd) blocks ratio < odd blocks ratio = size
      const Complex w = plan->twiddle_below(((f * a) % odd) * blocks * ratio);
      plan->coefficient_re[static_cast<std::size_t>(f * odd + a)] = w.real();
      plan->coefficient_im[static_cast<std::size_t>(f * odd + a)] = w.imag();
    }
  }
  std::int64_t total = 0;
  for (std::int64_t half = odd; half < points; half *= 2) {
    plan->stage_offset.push_back(total);
    total += half;
  }
  plan->stage_re.resize(static_cast<std::size_t>(total));
  plan->stage_im.resize(static_cast<std::size_t>(total));
  int stage = 0;
  for (std::int64_t half = odd; half < points; half *= 2, ++stage) {
    const std::int64_t stride = size / (2 * half);  // w_{2 half}^j = w^{j stride}
    const auto base = static_cast<std::size_t>(plan->stage_offset[static_cast<std::size_t>(stage)]);
    for (std::int64_t j = 0; j < half; ++j) {
      const Complex w = plan->twiddle_below(j * stride);  // j stride < size / 2
      plan->stage_re[base + static_cast<std::size_t>(j)] = w.real();
      plan->stage_im[base + static_cast<std::size_t>(j)] = w.imag();
    }
  }
  return plan;
}

// Plans of the sizes used last (at most kCachedPlans, kCachedBytes in all; a plan of more than
// half of that, 14 bytes per point, is built for its call only), so that a second
// transform of a size costs no sine or cosine: an accountant composes on a handful of circle
// sizes, and every query of a fresh accountant on them would otherwise pay the n / 4 twiddles
// again. Guarded by a mutex: transforms run on several Python threads at once.
class PlanCache {
 public:
  std::shared_ptr<const Plan> get(std::int64_t size, std::int64_t points) {
    std::shared_ptr<const Plan> same_size;  // its twiddle table is this size's
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = plans_.begin(); it != plans_.end(); ++it) {
        if ((*it)->size == size && (*it)->points == points) {
          plans_.splice(plans_.begin(), plans_, it);
          return plans_.front();
        }
        if ((*it)->size == size) same_size = *it;
      }
    }
    std::shared_ptr<const Plan> plan = build_plan(size, points, same_size.get());
    if (plan->bytes() > kCachedBytes / 2) return plan;
    const std::lock_guard<std::mutex> lock(mutex_);
    plans_.push_front(plan);
    std::size_t bytes = 0;
    std::size_t kept = 0;
    for (auto it = plans_.begin(); it != plans_.end(); ++it, ++kept) {
      bytes += (*it)->bytes();
      if (kept >= kCachedPlans || bytes > kCachedBytes) {
        plans_.erase(it, plans_.end());
        break;
      }
    }
    return plan;
  }

 private:
  static constexpr std::size_t kCachedPlans = 8;
  static constexpr std::size_t kCachedBytes = std::size_t{160} << 20;  // a 2^22 plan: 58 MiB
  std::mutex mutex_;
  std::list<std::shared_ptr<const Plan>> plans_;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

// One radix-2 decimation-in-time stage on `count` butterflies: (low, high) <- (low + w high,
// low - w high), w = (w_re, w_im)[j], each complex product as in `times`.
inline __attribute__((always_inline)) void butterflies_body(
    double* __restrict low_re, double* __restrict low_im, double* __restrict high_re,
    double* __restrict high_im, const double* __restrict w_re, const double* __restrict w_im,
    std::int64_t count) {
  for (std::int64_t j = 0; j < count; ++j) {
    const double hr = high_re[j];
    const double hi = high_im[j];
    const double tr = w_re[j] * hr - w_im[j] * hi;
    const double ti = w_re[j] * hi + w_im[j] * hr;
    const double ur = low_re[j];
    const double ui = low_im[j];
    low_re[j] = ur + tr;
    low_im[j] = ui + ti;
    high_re[j] = ur - tr;
    high_im[j] = ui - ti;
  }
}
DPSHARP_WIDTH_BUILDS(butterflies,
                     (double* __restrict low_re, double* __restrict low_im,
                      double* __restrict high_re, double* __restrict high_im,
                      const double* __restrict w_re, const double* __restrict w_im,
                      std::int64_t count),
                     (low_re, low_im, high_re, high_im, w_re, w_im, count))

// Two consecutive radix-2 stages (half-lengths `half` and 2 `half`) on one group of 4 `half`
// entries, in one pass: for each j the same four butterflies, in the same order, as the two
// stages one after the other (so the same bits).
inline __attribute__((always_inline)) void double_stage_body(
    double* __restrict r0, double* __restrict i0, double* __restrict r1, double* __restrict i1,
    double* __restrict r2, double* __restrict i2, double* __restrict r3, double* __restrict i3,
    const double* __restrict a_re, const double* __restrict a_im,
    const double* __restrict b_re, const double* __restrict b_im,
    const double* __restrict c_re, const double* __restrict c_im, std::int64_t half) {
  for (std::int64_t j = 0; j < half; ++j) {
    // stage 1: (x0, x1) and (x2, x3) with twiddle a_j
    const double t1r = a_re[j] * r1[j] - a_im[j] * i1[j];
    const double t1i = a_re[j] * i1[j] + a_im[j] * r1[j];
    const double t3r = a_re[j] * r3[j] - a_im[j] * i3[j];
    const double t3i = a_re[j] * i3[j] + a_im[j] * r3[j];
    const double y0r = r0[j] + t1r;
    const double y0i = i0[j] + t1i;
    const double y1r = r0[j] - t1r;
    const double y1i = i0[j] - t1i;
    const double y2r = r2[j] + t3r;
    const double y2i = i2[j] + t3i;
    const double y3r = r2[j] - t3r;
    const double y3i = i2[j] - t3i;
    // stage 2: (y0, y2) with twiddle b_j, (y1, y3) with twiddle c_j = b_{j + half}
    const double s2r = b_re[j] * y2r - b_im[j] * y2i;
    const double s2i = b_re[j] * y2i + b_im[j] * y2r;
    const double s3r = c_re[j] * y3r - c_im[j] * y3i;
    const double s3i = c_re[j] * y3i + c_im[j] * y3r;
    r0[j] = y0r + s2r;
    i0[j] = y0i + s2i;
    r2[j] = y0r - s2r;
    i2[j] = y0i - s2i;
    r1[j] = y1r + s3r;
    i1[j] = y1i + s3i;
    r3[j] = y1r - s3r;
    i3[j] = y1i - s3i;
  }
}
DPSHARP_WIDTH_BUILDS(double_stage,
                     (double* __restrict r0, double* __restrict i0, double* __restrict r1,
                      double* __restrict i1, double* __restrict r2, double* __restrict i2,
                      double* __restrict r3, double* __restrict i3,
                      const double* __restrict a_re, const double* __restrict a_im,
                      const double* __restrict b_re, const double* __restrict b_im,
                      const double* __restrict c_re, const double* __restrict c_im,
                      std::int64_t half),
                     (r0, i0, r1, i1, r2, i2, r3, i3, a_re, a_im, b_re, b_im, c_re, c_im, half))

// The butterfly (u, h) of twiddle w with its second output conjugated: (u + w h, conj(u - w h)),
// each complex product as in `times` (the operations of `butterflies`, and an exact sign change).
struct Mirrored {
  double low_re, low_im, high_re, high_im;
};

inline __attribute__((always_inline)) Mirrored mirrored_butterfly(double u_re, double u_im,
                                                                  double h_re, double h_im,
                                                                  double w_re, double w_im) {
  const double t_re = w_re * h_re - w_im * h_im;
  const double t_im = w_re * h_im + w_im * h_re;
  return {u_re + t_re, u_im + t_im, u_re - t_re, -(u_im - t_im)};
}

// The radix-2 stage of a real input's transform on the lower half of one group: for j in
// [0, count), the butterfly (E_j, O_j) of twiddle w_j gives Z_j = E_j + w_j O_j, written over
// E_j (low), and Z_{j + H} = E_j - w_j O_j, whose conjugate is Z_{H - j} (the transform of a
// real sequence is Hermitian), written at mirror[-j]. The operations of `butterflies`, with the
// second output conjugated (an exact sign change).
inline __attribute__((always_inline)) void half_butterflies_body(
    double* __restrict low_re, double* __restrict low_im, const double* __restrict high_re,
    const double* __restrict high_im, double* __restrict mirror_re, double* __restrict mirror_im,
    const double* __restrict w_re, const double* __restrict w_im, std::int64_t count) {
  for (std::int64_t j = 0; j < count; ++j) {
    const Mirrored z = mirrored_butterfly(low_re[j], low_im[j], high_re[j], high_im[j], w_re[j],
                                          w_im[j]);
    low_re[j] = z.low_re;
    low_im[j] = z.low_im;
    mirror_re[-j] = z.high_re;
    mirror_im[-j] = z.high_im;
  }
}
DPSHARP_WIDTH_BUILDS(half_butterflies,
                     (double* __restrict low_re, double* __restrict low_im,
                      const double* __restrict high_re, const double* __restrict high_im,
                      double* __restrict mirror_re, double* __restrict mirror_im,
                      const double* __restrict w_re, const double* __restrict w_im,
                      std::int64_t count),
                     (low_re, low_im, high_re, high_im, mirror_re, mirror_im, w_re, w_im, count))

// One butterfly of `butterflies` at j, in place, both outputs kept (for the ends of a real
// input's half stage: j = 0, whose outputs Z_0 and Z_H are both in the lower halves, and
// j = H / 2, whose second output is not needed: `keep_high` false).
inline void one_butterfly(double* re, double* im, std::int64_t low, std::int64_t high,
                          double w_re, double w_im, bool keep_high) noexcept {
  const double hr = re[high];
  const double hi = im[high];
  const double tr = w_re * hr - w_im * hi;
  const double ti = w_re * hi + w_im * hr;
  const double ur = re[low];
  const double ui = im[low];
  re[low] = ur + tr;
  im[low] = ui + ti;
  if (keep_high) {
    re[high] = ur - tr;
    im[high] = ui - ti;
  }
}

// Half-lengths below this run their butterflies inline (no vector call for a few columns).
constexpr std::int64_t kScalarHalf = 16;

// half_stage_range on every column of each group, for a small half-length H (`Half`, or the
// argument `half` where `Half` is 0): column 0 keeps both outputs, columns 1 .. ceil(H/2) - 1
// write their second output conjugated at H - j, the column H / 2 (H even) its first only.
template <std::int64_t Half>
inline void small_half_stage(double* re, double* im, const double* w_re, const double* w_im,
                             std::int64_t begin, std::int64_t end, std::int64_t half = Half) {
  if constexpr (Half != 0) half = Half;
  const std::int64_t last_mirrored = (half + 1) / 2 - 1;
  for (std::int64_t start = begin; start < end; start += 2 * half) {
    for (std::int64_t j = 0; j <= half / 2; ++j) {
      const std::int64_t low = start + j;
      const std::int64_t high = start + half + j;
      if (j == 0 || j > last_mirrored) {
        one_butterfly(re, im, low, high, w_re[j], w_im[j], j == 0);
        continue;
      }
      const Mirrored z = mirrored_butterfly(re[low], im[low], re[high], im[high], w_re[j], w_im[j]);
      re[low] = z.low_re;
      im[low] = z.low_im;
      re[start + half - j] = z.high_re;
      im[start + half - j] = z.high_im;
    }
  }
}

// The half stage of half-length H = odd 2^stage on the groups of 2 H entries starting at
// `begin`, `begin` + 2 H, ... below `end`, for the columns j0 <= j < j1 of each group (within
// [0, H / 2]). Each group holds the lower halves (entries 0 .. floor(L / 2)) of the transforms
// E and O of length H of its two decimated subsequences, at its offsets 0 and H; afterwards it
// holds the lower half of their combined transform of length 2 H (entries 0 .. H).
void half_stage_range(const Plan& plan, int stage, double* re, double* im, std::int64_t begin,
                      std::int64_t end, std::int64_t j0, std::int64_t j1) {
  const std::int64_t half = plan.odd << stage;
  const auto base = static_cast<std::size_t>(plan.stage_offset[static_cast<std::size_t>(stage)]);
  const double* w_re = plan.stage_re.data() + base;
  const double* w_im = plan.stage_im.data() + base;
  // Columns 1 .. ceil(H / 2) - 1 write their mirrors to H - j > H / 2, away from every column
  // read; column 0 writes Z_H over O_0 and the column H / 2 (H even) only its own entry.
  const std::int64_t last_mirrored = (half + 1) / 2 - 1;
  if (half < kScalarHalf && j0 == 0 && j1 == half / 2 + 1) {
    // A few columns per group: the same butterflies, inline (unrolled for H a power of two).
    switch (half) {
      case 1: small_half_stage<1>(re, im, w_re, w_im, begin, end); return;
      case 2: small_half_stage<2>(re, im, w_re, w_im, begin, end); return;
      case 4: small_half_stage<4>(re, im, w_re, w_im, begin, end); return;
      case 8: small_half_stage<8>(re, im, w_re, w_im, begin, end); return;
      default: small_half_stage<0>(re, im, w_re, w_im, begin, end, half); return;
    }
  }
  const Width width = vector_width();
  for (std::int64_t start = begin; start < end; start += 2 * half) {
    if (j0 == 0) one_butterfly(re, im, start, start + half, w_re[0], w_im[0], true);
    const std::int64_t lo = std::max<std::int64_t>(j0, 1);
    const std::int64_t hi = std::min(j1, last_mirrored + 1);
    if (hi > lo) {
      DPSHARP_WIDTH_DISPATCH(width, half_butterflies, re + start + lo, im + start + lo,
                             re + start + half + lo, im + start + half + lo,
                             re + start + half - lo, im + start + half - lo, w_re + lo, w_im + lo,
                             hi - lo);
    }
    if (half % 2 == 0 && j0 <= half / 2 && half / 2 < j1) {
      one_butterfly(re, im, start + half / 2, start + half + half / 2, w_re[half / 2],
                    w_im[half / 2], false);
    }
  }
}

void stage_range(const Plan& plan, int stage, double* re, double* im, std::int64_t begin,
                 std::int64_t end) {
  const std::int64_t half = plan.odd << stage;
  const auto base = static_cast<std::size_t>(plan.stage_offset[static_cast<std::size_t>(stage)]);
  const double* w_re = plan.stage_re.data() + base;
  const double* w_im = plan.stage_im.data() + base;
  const Width width = vector_width();
  for (std::int64_t start = begin; start < end; start += 2 * half) {
    DPSHARP_WIDTH_DISPATCH(width, butterflies, re + start, im + start, re + start + half,
                           im + start + half, w_re, w_im, half);
  }
}

// Stage 0 and the radix-2 stages whose groups fit in a block of kBlock entries (at least odd,
// at most the transform), block by block while the block is in cache, the blocks shared over
// `threads`: `group(b, out_re, out_im)` writes stage 0's outputs for the decimated sequence
// starting at input b (in bit-reversed order) to out_re, out_im, and `stages(stage, begin, end)`
// runs one stage on the block [begin, end). Returns the first stage not run.
template <typename Group, typename Stages>
int by_cache_blocks(const Plan& plan, double* re, double* im, int threads, Group&& group,
                    Stages&& stages) {
  const std::int64_t odd = plan.odd;
  const std::int64_t block = std::min(plan.points, std::max(kBlock, odd));  // odd divides it
  std::int64_t block_points = odd;
  int block_stages = 0;
  while (block_points * 2 <= block && block_stages < plan.levels) {
    block_points *= 2;
    ++block_stages;
  }
  const std::int64_t chunks = plan.points / block_points;
  parallel_ranges<Threads::kOwnThreads>(chunks, 4, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t chunk = lo; chunk < hi; ++chunk) {
      const std::int64_t first = chunk * block_points;
      for (std::int64_t p = first / odd; p < (first + block_points) / odd; ++p) {
        group(static_cast<std::int64_t>(plan.reversed[static_cast<std::size_t>(p)]), re + p * odd,
              im + p * odd);
      }
      for (int stage = 0; stage < block_stages; ++stage) stages(stage, first, first + block_points);
    }
  });
  return block_stages;
}

// The DFT Z_f = sum_s z_s w_P^{f s} (P = plan.points, w_P = e^{-2 pi i / P}) of the sequence
// z_s = load(s) (z_s = 0 from `nonzero` on), into (re, im): stage 0 computes the direct DFTs
// of odd length m of the 2^k decimated sequences z[b + 2^k a] (b in bit-reversed order), each
// output a recursive sum of m twiddled terms; then k radix-2 decimation-in-time stages
// Z_f = E_f + w^f O_f, Z_{f + L/2} = E_f - w^f O_f.
template <typename Load>
void complex_transform(const Plan& plan, Load&& load, std::int64_t nonzero, double* re,
                       double* im, int threads) {
  const std::int64_t odd = plan.odd;
  const std::int64_t points = plan.points;
  const std::int64_t blocks = points / odd;
  const double* cr = plan.coefficient_re.data();
  const double* ci = plan.coefficient_im.data();
  const int block_stages = by_cache_blocks(
      plan, re, im, threads,
      [&](std::int64_t b, double* out_re, double* out_im) {
        if (b >= nonzero) {  // every input of this group is an exact zero: so are its outputs
          std::fill(out_re, out_re + odd, 0.0);
          std::fill(out_im, out_im + odd, 0.0);
          return;
        }
        if (odd == 1) {  // the 1-point DFT: the entry itself
          const Complex z = load(b);
          out_re[0] = z.real();
          out_im[0] = z.imag();
          return;
        }
        Complex column[kMaxOddFactor];
        for (std::int64_t a = 0; a < odd; ++a) column[a] = load(b + blocks * a);
        for (std::int64_t f = 0; f < odd; ++f) {
          const std::size_t row = static_cast<std::size_t>(f * odd);
          Complex sum = times({cr[row], ci[row]}, column[0]);
          for (std::int64_t a = 1; a < odd; ++a) {
            sum += times({cr[row + static_cast<std::size_t>(a)], ci[row + static_cast<std::size_t>(a)]},
                         column[a]);
          }
          out_re[f] = sum.real();
          out_im[f] = sum.imag();
        }
      },
      [&](int stage, std::int64_t begin, std::int64_t end) {
        stage_range(plan, stage, re, im, begin, end);
      });
  // The larger stages over the whole array, two at a time where two remain.
  int stage = block_stages;
  while (stage < plan.levels) {
    const std::int64_t half = odd << stage;
    if (stage + 1 < plan.levels) {
      const auto a = static_cast<std::size_t>(plan.stage_offset[static_cast<std::size_t>(stage)]);
      const auto b = static_cast<std::size_t>(plan.stage_offset[static_cast<std::size_t>(stage + 1)]);
      const std::int64_t groups = points / (4 * half);
      // Split into groups x pieces of each group's `half` columns, so that even one group
      // (the last two stages) is shared out.
      const std::int64_t pieces = std::max<std::int64_t>(1, std::min<std::int64_t>(half / 1024, 64));
      const std::int64_t piece = (half + pieces - 1) / pieces;
      const Width width = vector_width();
      parallel_ranges<Threads::kOwnThreads>(groups * pieces, 1, threads, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t item = lo; item < hi; ++item) {
          const std::int64_t start = (item / pieces) * 4 * half;
          const std::int64_t j0 = (item % pieces) * piece;
          const std::int64_t count = std::min(half, j0 + piece) - j0;
          if (count <= 0) continue;
          double* r = re + start + j0;
          double* i = im + start + j0;
          DPSHARP_WIDTH_DISPATCH(width, double_stage, r, i, r + half, i + half, r + 2 * half,
                                 i + 2 * half, r + 3 * half, i + 3 * half,
                                 plan.stage_re.data() + a + j0, plan.stage_im.data() + a + j0,
                                 plan.stage_re.data() + b + j0, plan.stage_im.data() + b + j0,
                                 plan.stage_re.data() + b + half + j0,
                                 plan.stage_im.data() + b + half + j0, count);
        }
      });
      stage += 2;
    } else {
      const auto a = static_cast<std::size_t>(plan.stage_offset[static_cast<std::size_t>(stage)]);
      const std::int64_t pieces = std::max<std::int64_t>(1, std::min<std::int64_t>(half / 1024, 64));
      const std::int64_t piece = (half + pieces - 1) / pieces;
      const std::int64_t groups = points / (2 * half);
      const Width width = vector_width();
      parallel_ranges<Threads::kOwnThreads>(groups * pieces, 1, threads, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t item = lo; item < hi; ++item) {
          const std::int64_t start = (item / pieces) * 2 * half;
          const std::int64_t j0 = (item % pieces) * piece;
          const std::int64_t count = std::min(half, j0 + piece) - j0;
          if (count <= 0) continue;
          DPSHARP_WIDTH_DISPATCH(width, butterflies, re + start + j0, im + start + j0,
                                 re + start + half + j0, im + start + half + j0,
                                 plan.stage_re.data() + a + j0, plan.stage_im.data() + a + j0,
                                 count);
        }
      });
      stage += 1;
    }
  }
}

// Two half stages at once (half-lengths H and 2 H) on one group of 4 H entries, for columns j of
// the first stage in [1, H / 2) (the caller offsets the pointers): with A, B, C, D the group's
// quarters, the first stage's column j gives E'_j, conj E'_{H-j} from (A_j, B_j) and O'_j,
// conj O'_{H-j} from (C_j, D_j), and the second stage's columns j and H - j (both mirrored) are
// taken at once: Z_j over A_j, conj Z_{2H-j} at mirror_2h[-j], Z_{H-j} at mirror_h[-j] and
// conj Z_{H+j} over B_j. The same operations, on the same values, as the two stages one after
// the other (half_stage_range), so the same bits, with one pass over memory.
inline __attribute__((always_inline)) void double_half_stage_body(
    double* __restrict a_re, double* __restrict a_im, double* __restrict b_re,
    double* __restrict b_im, const double* __restrict c_re, const double* __restrict c_im,
    const double* __restrict d_re, const double* __restrict d_im,
    double* __restrict mirror_h_re, double* __restrict mirror_h_im,
    double* __restrict mirror_2h_re, double* __restrict mirror_2h_im,
    const double* __restrict w1_re, const double* __restrict w1_im,
    const double* __restrict w2_re, const double* __restrict w2_im,
    const double* __restrict w2_mirror_re, const double* __restrict w2_mirror_im,
    std::int64_t count) {
  for (std::int64_t j = 0; j < count; ++j) {
    const Mirrored e = mirrored_butterfly(a_re[j], a_im[j], b_re[j], b_im[j], w1_re[j], w1_im[j]);
    const Mirrored o = mirrored_butterfly(c_re[j], c_im[j], d_re[j], d_im[j], w1_re[j], w1_im[j]);
    const Mirrored low = mirrored_butterfly(e.low_re, e.low_im, o.low_re, o.low_im, w2_re[j],
                                            w2_im[j]);
    const Mirrored high = mirrored_butterfly(e.high_re, e.high_im, o.high_re, o.high_im,
                                             w2_mirror_re[-j], w2_mirror_im[-j]);
    a_re[j] = low.low_re;
    a_im[j] = low.low_im;
    mirror_2h_re[-j] = low.high_re;
    mirror_2h_im[-j] = low.high_im;
    mirror_h_re[-j] = high.low_re;
    mirror_h_im[-j] = high.low_im;
    b_re[j] = high.high_re;
    b_im[j] = high.high_im;
  }
}
DPSHARP_WIDTH_BUILDS(double_half_stage,
                     (double* __restrict a_re, double* __restrict a_im, double* __restrict b_re,
                      double* __restrict b_im, const double* __restrict c_re,
                      const double* __restrict c_im, const double* __restrict d_re,
                      const double* __restrict d_im, double* __restrict mirror_h_re,
                      double* __restrict mirror_h_im, double* __restrict mirror_2h_re,
                      double* __restrict mirror_2h_im, const double* __restrict w1_re,
                      const double* __restrict w1_im, const double* __restrict w2_re,
                      const double* __restrict w2_im, const double* __restrict w2_mirror_re,
                      const double* __restrict w2_mirror_im, std::int64_t count),
                     (a_re, a_im, b_re, b_im, c_re, c_im, d_re, d_im, mirror_h_re, mirror_h_im,
                      mirror_2h_re, mirror_2h_im, w1_re, w1_im, w2_re, w2_im, w2_mirror_re,
                      w2_mirror_im, count))

// The half stages `stage` and `stage` + 1 (half-lengths H = odd 2^stage, H even, and 2 H) on the
// group of 4 H entries at `start`, for the first stage's columns j0 <= j < j1 (within
// [0, H / 2]): column j of the first stage and columns j and H - j of the second. Columns 0 and
// H / 2 are taken one butterfly at a time, in the order of the two single stages.
void double_half_stage_range(const Plan& plan, int stage, double* re, double* im,
                             std::int64_t start, std::int64_t j0, std::int64_t j1) {
  const std::int64_t half = plan.odd << stage;
  const auto first = static_cast<std::size_t>(plan.stage_offset[static_cast<std::size_t>(stage)]);
  const auto second =
      static_cast<std::size_t>(plan.stage_offset[static_cast<std::size_t>(stage + 1)]);
  const double* w1_re = plan.stage_re.data() + first;
  const double* w1_im = plan.stage_im.data() + first;
  const double* w2_re = plan.stage_re.data() + second;
  const double* w2_im = plan.stage_im.data() + second;
  const std::int64_t a = start;
  const std::int64_t b = start + half;
  const std::int64_t c = start + 2 * half;
  const std::int64_t d = start + 3 * half;
  if (j0 == 0) {
    // First stage, column 0 of both halves (both outputs kept: E'_0, E'_H and O'_0, O'_H);
    // second stage, column 0 (Z_0, Z_{2H}) and column H (Z_H only).
    one_butterfly(re, im, a, b, w1_re[0], w1_im[0], true);
    one_butterfly(re, im, c, d, w1_re[0], w1_im[0], true);
    one_butterfly(re, im, a, c, w2_re[0], w2_im[0], true);
    one_butterfly(re, im, b, d, w2_re[half], w2_im[half], false);
  }
  const std::int64_t lo = std::max<std::int64_t>(j0, 1);
  const std::int64_t hi = std::min(j1, half / 2);
  if (hi > lo) {
    const Width width = vector_width();
    DPSHARP_WIDTH_DISPATCH(width, double_half_stage, re + a + lo, im + a + lo, re + b + lo,
                           im + b + lo, re + c + lo, im + c + lo, re + d + lo, im + d + lo,
                           re + b - lo, im + b - lo, re + c - lo, im + c - lo, w1_re + lo,
                           w1_im + lo, w2_re + lo, w2_im + lo, w2_re + half - lo,
                           w2_im + half - lo, hi - lo);
  }
  if (j0 <= half / 2 && half / 2 < j1) {
    // First stage, column H / 2 (its first output only); second stage, column H / 2 (mirrored
    // to 2H - H / 2).
    const std::int64_t j = half / 2;
    one_butterfly(re, im, a + j, b + j, w1_re[j], w1_im[j], false);
    one_butterfly(re, im, c + j, d + j, w1_re[j], w1_im[j], false);
    const Mirrored z =
        mirrored_butterfly(re[a + j], im[a + j], re[c + j], im[c + j], w2_re[j], w2_im[j]);
    re[a + j] = z.low_re;
    im[a + j] = z.low_im;
    re[c - j] = z.high_re;
    im[c - j] = z.high_im;
  }
}

// The transform Z_f = sum_s x_s w_P^{f s} of a real sequence x (x_s = values[s] below
// `length`, 0 from there on) for 0 <= f <= P / 2 only, into re[f], im[f] (P = plan.points; the
// other entries of re and im are scratch). The stages of complex_transform, each computing only
// the lower half (entries 0 .. floor(L / 2)) of every partial transform of length L: the
// transform of a real sequence is Hermitian, Z_{L - f} = conj Z_f, and the butterfly of column
// j of a stage of half-length H gives Z_j and Z_{j + H} = conj Z_{H - j}, so the columns
// 0 .. H / 2 give the whole lower half of the next length (half_stage_range). Stage 0 sums the
// rows f <= (m - 1) / 2 of its direct DFTs only, each term c x of a real x as the two real
// products (c_re x, c_im x): the values of the complex product with an imaginary part 0 (an
// exact zero added; only the sign of a zero result can differ, which no later sum, product or
// modulus sees).
// Every stored entry is a butterfly of stored entries, as in complex_transform, or the exact
// conjugate of one, and so keeps complex_transform's componentwise bound (the argument is in
// part 1 of the module docstring of _pld_numerics.py), for about half the work.
void real_transform(const Plan& plan, const double* values, std::int64_t length, double* re,
                    double* im, int threads) {
  const std::int64_t odd = plan.odd;
  const std::int64_t points = plan.points;
  const std::int64_t blocks = points / odd;
  const std::int64_t kept_rows = (odd + 1) / 2;  // rows 0 .. (m - 1) / 2 of stage 0
  const double* cr = plan.coefficient_re.data();
  const double* ci = plan.coefficient_im.data();
  const int block_stages = by_cache_blocks(
      plan, re, im, threads,
      [&](std::int64_t b, double* out_re, double* out_im) {
        if (b >= length) {  // every input of this group is an exact zero: so are its outputs
          std::fill(out_re, out_re + kept_rows, 0.0);
          std::fill(out_im, out_im + kept_rows, 0.0);
          return;
        }
        if (odd == 1) {
          out_re[0] = values[b];
          out_im[0] = 0.0;
          return;
        }
        // The terms a with b + blocks a >= length are exact zeros: the sums stop before them
        // (adding a zero product changes no sum, except the sign of a zero one).
        const std::int64_t terms = std::min(odd, (length - b + blocks - 1) / blocks);
        double column[kMaxOddFactor];
        for (std::int64_t a = 0; a < terms; ++a) column[a] = values[b + blocks * a];
        for (std::int64_t f = 0; f < kept_rows; ++f) {
          const double* row_re = cr + f * odd;
          const double* row_im = ci + f * odd;
          double sum_re = row_re[0] * column[0];
          double sum_im = row_im[0] * column[0];
          for (std::int64_t a = 1; a < terms; ++a) {
            sum_re += row_re[a] * column[a];
            sum_im += row_im[a] * column[a];
          }
          out_re[f] = sum_re;
          out_im[f] = sum_im;
        }
      },
      [&](int stage, std::int64_t begin, std::int64_t end) {
        half_stage_range(plan, stage, re, im, begin, end, 0, (odd << stage) / 2 + 1);
      });
  // The larger stages over the whole array, two at a time where two remain, each group's
  // columns split into pieces so that even one group (the last stages) is shared out.
  int stage = block_stages;
  while (stage < plan.levels) {
    const bool two = stage + 1 < plan.levels;
    const std::int64_t half = odd << stage;
    const std::int64_t columns = half / 2 + 1;
    const std::int64_t group = (two ? 4 : 2) * half;
    const std::int64_t groups = points / group;
    const std::int64_t pieces = std::max<std::int64_t>(1, std::min<std::int64_t>(columns / 1024, 64));
    const std::int64_t piece = (columns + pieces - 1) / pieces;
    parallel_ranges<Threads::kOwnThreads>(groups * pieces, 1, threads, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t item = lo; item < hi; ++item) {
        const std::int64_t start = (item / pieces) * group;
        const std::int64_t j0 = (item % pieces) * piece;
        const std::int64_t j1 = std::min(columns, j0 + piece);
        if (j1 <= j0) continue;
        if (two) {
          double_half_stage_range(plan, stage, re, im, start, j0, j1);
        } else {
          half_stage_range(plan, stage, re, im, start, start + group, j0, j1);
        }
      }
    });
    stage += two ? 2 : 1;
  }
}

bool through_half(std::int64_t size) noexcept { return size % 16 == 0; }

}  // namespace

void certified_rfft(const double* values, std::size_t length, std::int64_t size, Complex* out,
                    int threads) {
  check_size(size);
  if (static_cast<std::int64_t>(length) > size) {
    throw std::invalid_argument("values must not be longer than size");
  }
  // The transform of the real input on all n points, its lower half only (real_transform).
  // (Through a complex transform of n / 2 points, as certified_irfft does, would also halve
  // the work, but its componentwise bound is up to twice this one's: the unpacking adds the
  // errors of Z_f and Z_{n/2-f}.)
  const std::shared_ptr<const Plan> plan = plan_cache().get(size, size);
  // (every entry real_transform reads it has written first: no initialisation)
  const std::unique_ptr<double[]> re(new double[static_cast<std::size_t>(size)]);
  const std::unique_ptr<double[]> im(new double[static_cast<std::size_t>(size)]);
  real_transform(*plan, values, static_cast<std::int64_t>(length), re.get(), im.get(), threads);
  for (std::int64_t f = 0; f <= size / 2; ++f) {
    out[f] = Complex(re[static_cast<std::size_t>(f)], im[static_cast<std::size_t>(f)]);
  }
}

void certified_rfft(const double* values, std::size_t length, std::int64_t size, Complex* out) {
  certified_rfft(values, length, size, out, 1);
}

void certified_rfft_pair(const double* first, std::size_t first_length, const double* second,
                         std::size_t second_length, std::int64_t size, Complex* first_out,
                         Complex* second_out, int threads) {
  check_size(size);
  if (static_cast<std::int64_t>(first_length) > size ||
      static_cast<std::int64_t>(second_length) > size) {
    throw std::invalid_argument("values must not be longer than size");
  }
  // One complex transform of z = a + i b (the transform certified_rfft does for one real
  // sequence, whose imaginary parts are zeros), unpacked by the Hermitian symmetry of the real
  // transforms: A_f = (Z_f + conj Z_{n-f}) / 2 and B_f = -i (Z_f - conj Z_{n-f}) / 2.
  const auto a_length = static_cast<std::int64_t>(first_length);
  const auto b_length = static_cast<std::int64_t>(second_length);
  const std::shared_ptr<const Plan> plan = plan_cache().get(size, size);
  std::vector<double> re(static_cast<std::size_t>(size)), im(static_cast<std::size_t>(size));
  complex_transform(
      *plan,
      [first, second, a_length, b_length](std::int64_t s) {
        return Complex(s < a_length ? first[s] : 0.0, s < b_length ? second[s] : 0.0);
      },
      std::max(a_length, b_length), re.data(), im.data(), threads);
  for (std::int64_t f = 0; f <= size / 2; ++f) {
    const auto at = static_cast<std::size_t>(f);
    const auto mirror = static_cast<std::size_t>(f == 0 ? 0 : size - f);
    const double z_re = re[at];
    const double z_im = im[at];
    const double c_re = re[mirror];   // conj Z_{n-f} = (c_re, c_im)
    const double c_im = -im[mirror];
    first_out[f] = Complex((z_re + c_re) * 0.5, (z_im + c_im) * 0.5);
    second_out[f] = Complex((z_im - c_im) * 0.5, (c_re - z_re) * 0.5);
  }
}

void certified_irfft(const Complex* spectrum, std::int64_t size, double* out, int threads) {
  check_size(size);
  const std::int64_t half = size / 2;
  if (!through_half(size)) {
    // x = (1/n) conj(DFT(conj(X))) with X the Hermitian extension of the half spectrum; x is
    // real, so x = (1/n) Re DFT(conj(X)), and conj(X)_f = X_{n - f} for 0 < f < n.
    const std::shared_ptr<const Plan> plan = plan_cache().get(size, size);
    std::vector<Complex> data(static_cast<std::size_t>(size));
    data[0] = Complex(spectrum[0].real(), 0.0);
    data[static_cast<std::size_t>(half)] = Complex(spectrum[half].real(), 0.0);
    for (std::int64_t f = 1; f < half; ++f) {
      data[static_cast<std::size_t>(f)] = std::conj(spectrum[f]);
      data[static_cast<std::size_t>(size - f)] = spectrum[f];
    }
    std::vector<double> re(static_cast<std::size_t>(size)), im(static_cast<std::size_t>(size));
    complex_transform(
        *plan, [&data](std::int64_t s) { return data[static_cast<std::size_t>(s)]; }, size,
        re.data(), im.data(), 1);
    const double scale = 1.0 / static_cast<double>(size);
    for (std::int64_t j = 0; j < size; ++j) out[j] = re[static_cast<std::size_t>(j)] * scale;
    return;
  }
  // The inverse of certified_rfft's unpacking: with A = X_f and B = X_{f+h} = conj X_{h-f},
  // E_f = (A + B) / 2, O_f = (A - B) conj(w^f) / 2 and Z_f = E_f + i O_f (Z_{h-f} = conj E_f +
  // i conj O_f); z = IDFT_h(Z) = (1/h) conj DFT_h(conj Z) holds x_{2j} + i x_{2j+1}.
  const std::shared_ptr<const Plan> plan = plan_cache().get(size, half);
  std::vector<double> zr(static_cast<std::size_t>(half)), zi(static_cast<std::size_t>(half));
  const double* qr = plan->quarter_re.data();
  const double* qi = plan->quarter_im.data();
  for (std::int64_t f = 0; f <= half / 2; ++f) {
    double ar = spectrum[f].real();
    double ai = spectrum[f].imag();
    double br = spectrum[half - f].real();
    double bi = -spectrum[half - f].imag();  // conj X_{h-f}
    if (f == 0) {
      ai = 0.0;
      bi = 0.0;
    }
    const double er = (ar + br) * 0.5;
    const double ei = (ai + bi) * 0.5;
    const double dr = ar - br;
    const double di = ai - bi;
    const double wr = qr[f];
    const double wi = -qi[f];  // conj w^f
    const double q_r = (wr * dr - wi * di) * 0.5;
    const double q_i = (wr * di + wi * dr) * 0.5;
    // conj of Z_f = E + i q (the transform below takes conj Z)
    zr[static_cast<std::size_t>(f)] = er - q_i;
    zi[static_cast<std::size_t>(f)] = -(ei + q_r);
    if (f != 0 && f != half / 2) {
      zr[static_cast<std::size_t>(half - f)] = er + q_i;
      zi[static_cast<std::size_t>(half - f)] = -(q_r - ei);
    }
  }
  std::vector<double> re(static_cast<std::size_t>(half)), im(static_cast<std::size_t>(half));
  complex_transform(
      *plan,
      [&zr, &zi](std::int64_t s) {
        return Complex(zr[static_cast<std::size_t>(s)], zi[static_cast<std::size_t>(s)]);
      },
      half, re.data(), im.data(), threads);
  const double scale = 1.0 / static_cast<double>(half);
  for (std::int64_t j = 0; j < half; ++j) {
    out[2 * j] = re[static_cast<std::size_t>(j)] * scale;
    out[2 * j + 1] = -im[static_cast<std::size_t>(j)] * scale;
  }
}

void certified_irfft(const Complex* spectrum, std::int64_t size, double* out) {
  certified_irfft(spectrum, size, out, 1);
}

namespace {

// Frequencies summed side by side by certified_band_dft: each lane's terms are added in the
// same order as one frequency alone (the same bits), and the lanes' independent sums, held in
// registers, keep the adder busy where one frequency's running sum waits on its last addition.
constexpr int kBandLanes = 4;
// The largest circle whose whole twiddle table (16 bytes a point) band sums read: beyond it the
// table leaves the cache and the quarter table with its turn selections is faster.
constexpr std::int64_t kBandTableMax = std::int64_t{1} << 16;

// One block of `count` terms for kBandLanes frequencies: sum_re[l] + i sum_im[l] = sum_s
// twiddle(angle_l(s)) values[s] from 0, in the order of s, with angle_l advanced by step[l]
// mod size after each term; every product and sum is the one-frequency loop's. (Four lanes in
// named locals: as arrays, the compiler kept the sums in memory.)
static_assert(kBandLanes == 4, "band_block holds four lanes");
template <typename Twiddle>
inline __attribute__((always_inline)) void band_block(
    const double* __restrict values, std::int64_t count, Twiddle&& twiddle, std::int64_t size,
    std::int64_t* __restrict angle, const std::int64_t* __restrict step,
    double* __restrict sum_re, double* __restrict sum_im) {
  std::int64_t a0 = angle[0], a1 = angle[1], a2 = angle[2], a3 = angle[3];
  const std::int64_t f0 = step[0], f1 = step[1], f2 = step[2], f3 = step[3];
  double r0 = 0.0, r1 = 0.0, r2 = 0.0, r3 = 0.0;
  double i0 = 0.0, i1 = 0.0, i2 = 0.0, i3 = 0.0;
  for (std::int64_t s = 0; s < count; ++s) {
    const double value = values[s];
    const Complex w0 = twiddle(a0);
    const Complex w1 = twiddle(a1);
    const Complex w2 = twiddle(a2);
    const Complex w3 = twiddle(a3);
    r0 += w0.real() * value;
    i0 += w0.imag() * value;
    r1 += w1.real() * value;
    i1 += w1.imag() * value;
    r2 += w2.real() * value;
    i2 += w2.imag() * value;
    r3 += w3.real() * value;
    i3 += w3.imag() * value;
    a0 += f0;
    a0 = a0 >= size ? a0 - size : a0;
    a1 += f1;
    a1 = a1 >= size ? a1 - size : a1;
    a2 += f2;
    a2 = a2 >= size ? a2 - size : a2;
    a3 += f3;
    a3 = a3 >= size ? a3 - size : a3;
  }
  const std::int64_t angles[] = {a0, a1, a2, a3};
  const double res[] = {r0, r1, r2, r3};
  const double ims[] = {i0, i1, i2, i3};
  for (int lane = 0; lane < kBandLanes; ++lane) {
    angle[lane] = angles[lane];
    sum_re[lane] = res[lane];
    sum_im[lane] = ims[lane];
  }
}

// Pairwise sums of the block sums, in place: the same tree as one frequency alone.
Complex pairwise_total(std::vector<Complex>& partial) {
  while (partial.size() > 1) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i + 1 < partial.size(); i += 2) partial[kept++] = partial[i] + partial[i + 1];
    if (partial.size() % 2 == 1) partial[kept++] = partial.back();
    partial.resize(kept);
  }
  return partial.empty() ? Complex(0.0, 0.0) : partial[0];
}

}  // namespace

void certified_band_dft(const double* values, std::size_t length, std::int64_t size,
                        std::int64_t reach, Complex* out, int threads) {
  check_size(size);
  if (static_cast<std::int64_t>(length) > size) {
    throw std::invalid_argument("values must not be longer than size");
  }
  if (reach < 0 || reach > size / 2 + 1) throw std::invalid_argument("reach must be in [0, size/2 + 1]");
  if (threads < 1) throw std::invalid_argument("threads must be >= 1");
  const std::shared_ptr<const Plan> plan = plan_cache().get(size, size);  // as certified_rfft's
  const double* quarter_re = plan->quarter_re.data();
  const double* quarter_im = plan->quarter_im.data();
  const auto n_length = static_cast<std::int64_t>(length);
  const std::int64_t block = static_cast<std::int64_t>(kBandBlock);
  const std::int64_t groups = (reach + kBandLanes - 1) / kBandLanes;
  // A table of the whole circle where the terms outnumber its entries four times over.
  std::vector<double> table_re, table_im;
  const bool tabled = n_length * reach >= 4 * size && size <= kBandTableMax;
  if (tabled) {
    table_re.resize(static_cast<std::size_t>(size));
    table_im.resize(static_cast<std::size_t>(size));
    const std::int64_t q = size / 4;
    for (std::int64_t j = 0; j < size; ++j) {
      const Complex w = quarter_twiddle(j, q, quarter_re, quarter_im);
      table_re[static_cast<std::size_t>(j)] = w.real();
      table_im[static_cast<std::size_t>(j)] = w.imag();
    }
  }
  // Each group of kBandLanes frequencies: blocks of kBandBlock terms summed in order, then each
  // frequency's block sums pairwise (a lane past `reach` steps by 0 and is dropped).
  parallel_ranges<Threads::kOwnThreads>(groups, 1, threads, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<std::vector<Complex>> partial(kBandLanes);
    for (std::int64_t group = lo; group < hi; ++group) {
      const std::int64_t first = group * kBandLanes;
      std::int64_t angle[kBandLanes];
      std::int64_t step[kBandLanes];
      for (int lane = 0; lane < kBandLanes; ++lane) {
        angle[lane] = 0;  // f s mod size, exact in integers
        step[lane] = first + lane < reach ? first + lane : 0;
        partial[static_cast<std::size_t>(lane)].clear();
      }
      for (std::int64_t start = 0; start < n_length; start += block) {
        double sum_re[kBandLanes];
        double sum_im[kBandLanes];
        const std::int64_t count = std::min(n_length - start, block);
        if (tabled) {
          const double* w_re = table_re.data();
          const double* w_im = table_im.data();
          band_block(values + start, count,
                     [w_re, w_im](std::int64_t j) { return Complex(w_re[j], w_im[j]); }, size,
                     angle, step, sum_re, sum_im);
        } else {
          const std::int64_t q = size / 4;
          band_block(values + start, count,
                     [q, quarter_re, quarter_im](std::int64_t j) {
                       return quarter_twiddle(j, q, quarter_re, quarter_im);
                     },
                     size, angle, step, sum_re, sum_im);
        }
        for (int lane = 0; lane < kBandLanes; ++lane) {
          partial[static_cast<std::size_t>(lane)].emplace_back(sum_re[lane], sum_im[lane]);
        }
      }
      for (int lane = 0; lane < kBandLanes && first + lane < reach; ++lane) {
        out[first + lane] = pairwise_total(partial[static_cast<std::size_t>(lane)]);
      }
    }
  });
}

void certified_band_dft(const double* values, std::size_t length, std::int64_t size,
                        std::int64_t reach, Complex* out) {
  certified_band_dft(values, length, size, reach, out, 1);
}

}  // namespace dpsharp::pld
