// Privacy-loss distributions (PLDs) discretised on a uniform loss grid, with certified roundings.
//
// A mechanism is described by a dominating pair (P, Q); its privacy loss is L = log(dP/dQ)(X) for
// X ~ P, and its hockey-stick curve is delta(eps) = E_P[(1 - e^{eps - L})_+] + P(L = inf).
// Writing Y = e^{-L} = dQ/dP, delta(eps) = E_P[phi(Y)] with phi(y) = (1 - e^eps y)_+ convex and
// non-increasing in y, and for a composition Y = prod_i Y_i with independent factors. So any
// replacement of a factor Y_i by Y_i' that is larger in the *decreasing convex order* (a
// mean-preserving spread of Y_i, or moving mass to smaller y, i.e. larger loss) can only raise
// every delta(eps) of every composition it enters; one that is smaller in that order (a
// mean-preserving contraction, e.g. merging mass into its barycentre, or moving mass to larger y)
// can only lower it (Jensen; the argument of Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022,
// "Connect the dots", Section 3, written for products of independent factors).
//
//  * pessimistic (upper bound): each cell (kh, (k+1)h] of the loss axis is replaced by the
//    mean-preserving spread of its mass onto its two end points ("connect the dots"); the mass
//    above the top grid point is spread between the top point and +inf (the infinity bucket gets
//    exactly delta(l_top)); the mass below the bottom point is moved up to it.
//  * optimistic (lower bound): the loss axis is cut into cells centred on the grid points and the
//    output is post-processed to the cell index (an exact, dominated pair: data processing); each
//    cell's point y*_k = Q(cell)/P(cell) is then moved to its grid point y_k = e^{-kh} either by
//    moving it up in y (when y*_k <= y_k) or by merging it with just enough mass of higher-loss
//    cells that the barycentre is exactly y_k (a mean-preserving contraction). Mass below the
//    bottom cell is dropped (sent to loss -inf). The loss shift is second order in h. For the
//    mechanisms here three such roundings are formed (pull_onto_grid in pld_discretize.cpp,
//    and contract_onto_grid on the centred and on half-width cells) and the one with the
//    largest mean loss is kept (each is certified).
//
// All tails are evaluated in log space (log_normal_cdf, log_add_exp, log_sub_exp), or in linear
// space where no tail at the range's ends underflows. What a pessimistic rounding moves up, a
// cell's excess P - e^{a} Q, is formed from the pair's parts (the two normals of a Gaussian-family
// pair, the atoms and the continuous part of the Laplace pair), never as the difference of P and
// Q (which agree to 1 - O(q) under a small sampling rate), and is rounded up by an allowance for
// its own arithmetic (kExcessSlack). Rounding errors of the tails themselves (relative ~1e-12 on
// a cell mass) are not certified.
#pragma once

#include <complex>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dpsharp/numerics.hpp"

namespace dpsharp::pld {

// The dominating pairs, in units where the noise standard deviation is 1 and the shift is
// mu = 1 / noise_multiplier:
//   kGaussian:        P = N(mu, 1), Q = N(0, 1)  (symmetric; equals kPoissonRemove with q = 1).
//   kLaplace:         P = Lap(1, b), Q = Lap(0, b), b = scale (symmetric).
//   kPoissonRemove:   P = (1-q) N(0,1) + q N(mu,1), Q = N(0,1)  (remove one record).
//   kPoissonAdd:      P = N(0,1), Q = (1-q) N(0,1) + q N(mu,1)  (add one record).
//   kSampledSymmetric: the pair of min{f_q, f_q^{-1}}** with f_q = q G_mu + (1-q) Id (Dong, Roth,
//       Su 2019, Thm 4.2 for sampling without replacement under replace-one). The convex
//       conjugate of a lower convex envelope of a minimum is the maximum of the conjugates, so its
//       hockey-stick curve is max(delta_remove, delta_add) at every eps; its tails at a loss l are
//       those of whichever direction has the larger delta(l).
enum class Mechanism : int {
  kGaussian = 0,
  kLaplace = 1,
  kPoissonRemove = 2,
  kPoissonAdd = 3,
  kSampledSymmetric = 4,
};

struct MechanismParams {
  Mechanism mechanism = Mechanism::kGaussian;
  double parameter = 1.0;      // noise multiplier (Gaussian family) or Laplace scale b
  double sampling_rate = 1.0;  // q in (0, 1]; ignored for kGaussian and kLaplace
};

// log P(L > l), log P(L <= l), log Q(L > l), log Q(L <= l).
struct LossTails {
  double log_survival_p;
  double log_cdf_p;
  double log_survival_q;
  double log_cdf_q;
};

LossTails loss_tails(const MechanismParams& params, double loss) noexcept;

// log delta(eps) of the (continuous) pair at eps = loss; -inf when delta is 0. Formed without
// the difference P(L > l) - e^{l} Q(L > l) of two nearly equal numbers (GaussianExcess,
// laplace_log_excess) and rounded up by its round-off allowance.
double log_hockey_stick(const MechanismParams& params, double loss) noexcept;

// The excess P(S) - e^{a} Q(S) of a set S of outputs whose losses exceed a is what a pessimistic
// rounding moves up (a cell's weight at its upper end, the mass at +inf). Under a small sampling
// rate, or a large noise, P and Q are both 1 - O(q) and their difference loses everything below
// their ulp (at q = 1e-12: 1e-4 relative), so it is formed from the pair's parts instead. The
// allowance for its own rounding (a few ulps of the terms, which may cancel) is added, relative
// kExcessSlack per unit of the terms' magnitudes (of their logarithms, in log space).
inline constexpr double kExcessSlack = 8.0 * 0x1p-53;

// The excess P(S) - e^{a} Q(S) of sets S above the loss a in one direction of a Gaussian-family
// pair (remove: P = (1 - q) N(0, 1) + q N(mu, 1), Q = N(0, 1); add: the other way round; q = 1
// the Gaussian pair), from their null N(0, 1) and shifted N(mu, 1) component log masses log N(S)
// and log S(S) (log_of): remove q S - c N, add e^{a} (c N - q S), with c = e^{+-a} - (1 - q)
// (e^{a} when q = 1) of either sign; rounded up (or down) by its allowance; -inf when not
// positive.
struct GaussianExcess {
  GaussianExcess() = default;
  GaussianExcess(bool remove_direction, double q, double loss) noexcept;
  double log_of(double log_null, double log_shifted, bool round_up) const noexcept;

  bool remove = true;
  double log_q = 0.0;
  double log1mq = kNegInf;       // log(1 - q)
  double scale = 0.0;            // log of the factor e^{a} (add) or 1 (remove)
  double magnitude = 0.0;        // |a|, for the allowance
  bool positive = true;          // c > 0 (a inside the direction's support)
  double log_coefficient = 0.0;  // log |c|
};

// The log masses of the two components on {L > a} (survival) and {L <= a} (cdf), a the loss
// of `at`.
struct ComponentLogTails {
  double null_survival;
  double null_cdf;
  double shifted_survival;
  double shifted_cdf;
};

ComponentLogTails gaussian_component_log_tails(const GaussianExcess& at, double mu) noexcept;

// The tails of a Gaussian-family or kSampledSymmetric pair at a loss: those of the direction
// that holds them (for kSampledSymmetric the one with the larger delta(l)), its excess at l
// (direction, sampling rate: 1 for kGaussian) and log delta(l).
struct GaussianPointTails {
  ComponentLogTails components;
  GaussianExcess excess;
  double log_delta;
};

GaussianPointTails gaussian_point_tails(const MechanismParams& params, double loss) noexcept;

// The pair's tails (loss_tails) from them.
LossTails gaussian_loss_tails(const GaussianPointTails& t) noexcept;

// The largest privacy loss eps0 of the Laplace pair of scale b: 1/b rounded up
// (reciprocal_rounded_up), so that the pair analysed, of scale 1/eps0 <= b, dominates the pair
// asked for. Every Laplace formula here reads its loss support [-eps0, eps0] from this.
inline double laplace_top_loss(double scale) noexcept { return reciprocal_rounded_up(scale); }

// log(P(S) - e^{lower} Q(S)) of the Laplace pair (kLaplace, scale b) on S = {lower < L <= upper}
// (upper may be +inf), in closed form from its two atoms at -+1/b and its continuous part; rounded
// up; -inf when S is empty. `cell_bracket`: laplace_cell_bracket(upper - lower) when already at
// hand (NaN: computed here), for a cell within the continuous part.
double laplace_log_excess(double scale, double lower, double upper, double cell_bracket) noexcept;

// log(4 sinh^2(width / 4)), the continuous part's factor for a cell of this width (see
// laplace_log_excess).
double laplace_cell_bracket(double width) noexcept;

// A PLD on the grid {k h : offset <= k < offset + mass.size()} plus a mass at +inf.
struct DiscretePld {
  std::int64_t offset = 0;
  std::vector<double> mass;
  double infinity_mass = 0.0;
};

struct GridRange {
  std::int64_t lowest;   // index of the bottom grid point
  std::int64_t highest;  // index of the top grid point
};

// The grid indices [lowest, highest] such that delta(highest * h) <= top_tail and
// P(L <= lowest * h) <= bottom_tail (so the pessimistic infinity bucket holds at most top_tail and
// the optimistic rounding drops at most bottom_tail + the mass of the lowest half cell).
GridRange grid_range(const MechanismParams& params, double grid_step, double top_tail,
                     double bottom_tail);

// The pessimistic (connect-the-dots) discretisation on [range.lowest, range.highest] * h.
DiscretePld discretize_pessimistic(const MechanismParams& params, double grid_step,
                                   GridRange range);

// discretize_pessimistic or discretize_optimistic for one mechanism and sampling rate at each of
// `parameters`, each on its own grid_range(top_tail, bottom_tail): the same results, with the
// parameter-independent work of the Gaussian-family pairs (the loss-to-quantile map and e^{l} at
// each grid point) done once. `threads` (>= 1) split the grid points of those pairs' work
// (parallel.hpp); the results do not depend on it.
std::vector<DiscretePld> discretize_many(Mechanism mechanism, const std::vector<double>& parameters,
                                         double sampling_rate, double grid_step, double top_tail,
                                         double bottom_tail, bool pessimistic, int threads = 1);

// The optimistic discretisation (cell post-processing plus mean-preserving merges).
DiscretePld discretize_optimistic(const MechanismParams& params, double grid_step,
                                  GridRange range);

// The mean-preserving contraction of a measure onto the grid {k h : lowest <= k < lowest + n}:
// atom c has mass cell_mass[c] at loss cell_loss[c] (atoms in increasing loss, +inf allowed for
// the last). Sweeping from the highest loss down, a group starts at the first unplaced atom,
// targets the largest grid loss <= its loss (the top grid point if it lies above the grid) and
// absorbs the following (lower-loss) atoms, the last one only in part, until its barycentre in
// y = e^{-L} is exactly the target's; a last group that never gets there is moved to lower loss.
// Every step lowers every delta(eps) of every composition (see the header comment): the result is
// an optimistic rounding. Its loss shift is second order in h.
DiscretePld contract_onto_grid(std::int64_t lowest, std::int64_t n, double grid_step,
                               const std::vector<double>& cell_mass,
                               const std::vector<double>& cell_loss);

// The mean-preserving merge of a measure onto the grid {k h : lowest <= k < lowest + n} by an
// upward sweep (atoms in increasing loss, +inf allowed): each group starts at the first unplaced
// atom, aims at a grid point g plus a margin (the nearest grid point and h / 1000, or with
// `target_above` the lowest one at or above the atom and 1e-6 h; at least 1e-12) and absorbs the
// following atoms, the last one only in part, until its barycentre in y = e^{-L} reaches the
// target's; it is then placed at g. An atom at or above its target, and a last group that never
// gets there, are rounded down to the grid. Every step lowers every delta(eps) of every
// composition: an optimistic rounding, second order in h where no group is rounded down.
DiscretePld pull_onto_grid(std::int64_t lowest, std::int64_t n, double grid_step,
                           const std::vector<double>& mass_of, const std::vector<double>& loss_of,
                           bool target_above);

// The optimistic coarsening of a PLD with masses mass[i] at losses (offset + i) fine_step onto
// the grid of step factor * fine_step (contract_onto_grid with one atom per fine grid point;
// negative entries count as 0). With fine_step a power of two every loss and grid index is exact.
// The infinity mass is not touched (it stays at +inf).
DiscretePld coarsen_optimistic(const double* mass, std::size_t size, std::int64_t offset,
                               double fine_step, std::int64_t factor);

// log E[e^{t L}; L finite] = log sum_k mass[k] e^{t (offset + k) h} for each exponent t, the
// log moment generating function of the finite part of a discretised PLD (for the Chernoff
// bounds of the FFT window, see accountants/_pld_numerics.py), rounded to nearest: the caller
// raises it by its evaluation error (DiscretePLD.log_mgf). -inf when the finite mass is 0.
// Computed by the recurrence e^{t l_{k-1}} = e^{t l_k} e^{-t h} from the end where t l is
// largest, stopped when the remaining terms are below 1e-18 of the sum so far (relative
// round-off about 4 size u); where the masses near that end are 0 or tiny and the factor
// would underflow first, by a log-sum-exp instead.
std::vector<double> log_mgf(const double* mass, std::size_t size, std::int64_t offset,
                            double grid_step, const std::vector<double>& exponents);

// The crossing of a composed PLD's hockey-stick curve with delta. With masses m_0..m_{n-1} on a
// grid of step h (decay = e^{-h}), the curve at grid point j is
//   A_j + constant - W_j,  A_j = sum_{k > j} m_k,  W_j = sum_{k > j} m_k e^{-(k - j) h}
// (W by the recursion W_j = e^{-h} (m_{j+1} + W_{j+1}), which never forms a ratio of
// exponentials). `index` is the smallest j with curve_j <= delta (-1 if there is none) and, when
// index > 0, tail_mass and tail_weighted are A and W at index - 1 (between grid points index - 1
// and index the curve is A - e^{eps - l_{index-1}} W). clip_negative: negative masses (FFT
// round-off) count as 0. relative_slack in (-1, 1): the curve tested is
// A_j (1 + slack) + constant - W_j (1 - slack): with slack = g (-g) an upper (a lower) bound of
// the exact curve when the sums' rounding is within g relative (the returned A and W are the
// computed sums).
struct CurveCrossing {
  std::int64_t index = -1;
  double tail_mass = 0.0;
  double tail_weighted = 0.0;
};

CurveCrossing delta_crossing(const double* mass, std::size_t size, double constant, double decay,
                             double delta, bool clip_negative, double relative_slack = 0.0);

// A composition's window masses held as the band of a real trigonometric polynomial,
// m_k = (1/n) [D_0 + 2 Re sum_{f=1}^{J-1} D_f w^{f k}] (w = e^{2 pi i / n}, 0 <= k < n), through
// the precomputed terms P_f = D_f / (1 - w^f) and Q_f = D_f / (1 - rho w^f) (rho = e^{-h}),
// interleaved (re, im), f = 1 .. J-1 (`count` = J - 1), and total = D_0.
struct BandTerms {
  const double* plain = nullptr;
  const double* discounted = nullptr;
  std::size_t count = 0;
  double total = 0.0;
  std::int64_t size = 0;
  double grid_step = 0.0;
};

struct BandSums {
  double mass_above = 0.0;      // A_K = sum_{k > K} m_k
  double weighted_above = 0.0;  // W_K = sum_{k > K} m_k e^{-(k - K) h}
};

// (A_K, W_K) by their closed forms (finite geometric series per frequency), with the phase
// f (K+1) mod n reduced in integers and 1 - cos formed as 2 sin^2: O(J) operations.
BandSums band_suffix_sums(const BandTerms& terms, std::int64_t index);

// The first index j >= first with A_j + constant - W_j <= delta (bisection on the
// non-increasing curve), with (A, W) at j - 1; index -1 if none (constant > delta); (first,
// nan, nan) if the curve is already at most delta at `first`.
CurveCrossing band_crossing(const BandTerms& terms, std::int64_t first, double constant,
                            double delta);

// Discrete Fourier transforms with a priori error bounds (pld_transforms.cpp; the analysis is in
// python/dpsharp/accountants/_pld_numerics.py). `size` is m 2^k with m odd, m <= kMaxOddFactor
// and 8 | size. Twiddles e^{-2 pi i j / size} are formed from the angle reduced to [0, pi / 4]
// in integers and std::cos / std::sin.
//  * certified_rfft: X_f = sum_s x_s e^{-2 pi i f s / size} for f = 0 .. size / 2 (out has
//    size / 2 + 1 entries), x zero-padded from `length` <= size values: stage 0 is the direct
//    DFT of odd length m of each decimated sequence, then k radix-2 decimation-in-time stages,
//    each computing the lower half (entries 0 .. L / 2) of its partial transforms of length L
//    only (the upper halves of real sequences' transforms are their conjugates).
//  * certified_irfft: x_j = (1/size) sum_{f < size} X_f e^{2 pi i f j / size} of the Hermitian
//    extension of the half spectrum (imaginary parts of X_0 and X_{size/2} ignored).
//  * certified_band_dft: X_f for f < reach by direct summation (blocks of kBandBlock terms in
//    order, the block sums pairwise), with the phase f s mod size formed in integers.
// Every twiddle is one twiddle_at value times an exact power of -i. When 16 | size the real
// inverse transform goes through a complex transform of size / 2 points (pld_transforms.cpp).
constexpr std::int64_t kMaxOddFactor = 15;
constexpr std::size_t kBandBlock = 16;
void certified_rfft(const double* values, std::size_t length, std::int64_t size,
                    std::complex<double>* out);
void certified_irfft(const std::complex<double>* spectrum, std::int64_t size, double* out);
// The same on up to `threads` threads (the bits do not depend on the thread count).
void certified_rfft(const double* values, std::size_t length, std::int64_t size,
                    std::complex<double>* out, int threads);
void certified_irfft(const std::complex<double>* spectrum, std::int64_t size, double* out,
                     int threads);
void certified_band_dft(const double* values, std::size_t length, std::int64_t size,
                        std::int64_t reach, std::complex<double>* out);
// The same on up to `threads` threads, each taking whole frequencies (the same bits).
void certified_band_dft(const double* values, std::size_t length, std::int64_t size,
                        std::int64_t reach, std::complex<double>* out, int threads);
// The certified_rfft of two real sequences at once (half the work of two): one complex
// transform of z = a + i b on `size` points, unpacked as A_f = (Z_f + conj Z_{size-f}) / 2 and
// B_f = -i (Z_f - conj Z_{size-f}) / 2. Its componentwise bound is on ||a||_1 + ||b||_1 (see
// forward_pair_error in _pld_numerics.py).
void certified_rfft_pair(const double* first, std::size_t first_length, const double* second,
                         std::size_t second_length, std::int64_t size,
                         std::complex<double>* first_out, std::complex<double>* second_out,
                         int threads);

// One factor F^count multiplied into the running product of a composition's spectra on its live
// prefix [0, live) (count >= 1), with the log-moduli that bound the product's round-off: at
// every f < live, upper[f] += count log(|F_f|^ + error) and lower[f] += count log |F_f|^, with
// |F_f|^ an upper bound on the modulus of the computed entry (within 4 u above it, and at least
// the smallest subnormal), log(|F_f|^ + error) taken without rounding the sum. With a cutoff
// (not NaN) the live prefix then shrinks to end at the last f whose upper[f] exceeds it, and
// only that prefix's products are formed: product[f] *= F_f^count by repeated squaring (about
// 2 log2(count) complex multiplications, each two products and a sum per part). Returns the new
// live prefix. The caller's argument that an entry past the prefix may be taken as 0 is in
// _compose_by_products (python/dpsharp/accountants/_pld_numerics.py).
std::int64_t multiply_factor(std::complex<double>* product, double* upper, double* lower,
                             const std::complex<double>* factor, std::int64_t live,
                             std::int64_t count, double error, double cutoff) noexcept;

}  // namespace dpsharp::pld
