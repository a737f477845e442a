// Discrete Fourier transforms with a priori error bounds, for the FFT composition of PLDs (see
// pld.hpp: certified_rfft, certified_irfft, certified_band_dft; the error analysis is in
// python/dpsharp/accountants/_pld_numerics.py).
//
// Written here rather than taken from a library because the bounds need the algorithm's exact
// structure: every stage is a set of butterflies whose coefficients are single unit-modulus
// twiddles (so the componentwise bound of the whole transform is a product of per-stage
// factors), and every twiddle is formed in a way whose error is bounded.
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "dpsharp/pld.hpp"

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

// w^j = e^{-2 pi i j / size} for 0 <= j < size. Up to kFullTableUpTo points a full table of
// twiddle_at values (built from the size / 8 + 1 values of the first octant by the same exact
// swaps and sign changes, so each entry is bit for bit twiddle_at(j)): error mu. Beyond, as
// coarse[j / block] * fine[j % block], both factors from twiddle_at: error <= (1 + mu)^2 (1 +
// sqrt(2) gamma_2) - 1, in O(sqrt(size)) memory.
class TwiddleTable {
 public:
  explicit TwiddleTable(std::int64_t size) : size_(size), full_(size <= kFullTableUpTo) {
    if (full_) {
      table_.resize(static_cast<std::size_t>(size));
      for (std::int64_t j = 0; j < size; ++j) table_[static_cast<std::size_t>(j)] = twiddle_at(j, size);
      return;
    }
    block_ = 1;
    while (block_ * block_ < size) block_ *= 2;
    fine_.resize(static_cast<std::size_t>(block_));
    coarse_.resize(static_cast<std::size_t>((size + block_ - 1) / block_));
    for (std::int64_t b = 0; b < block_; ++b) {
      fine_[static_cast<std::size_t>(b)] = twiddle_at(b % size, size);
    }
    for (std::size_t a = 0; a < coarse_.size(); ++a) {
      coarse_[a] = twiddle_at(static_cast<std::int64_t>(a) * block_, size);
    }
  }

  Complex operator()(std::int64_t j) const noexcept {
    if (full_) return table_[static_cast<std::size_t>(j)];
    return times(coarse_[static_cast<std::size_t>(j / block_)],
                 fine_[static_cast<std::size_t>(j % block_)]);
  }

 private:
  std::int64_t size_;
  bool full_;
  std::int64_t block_ = 1;
  std::vector<Complex> table_;
  std::vector<Complex> fine_;
  std::vector<Complex> coarse_;
};

void check_size(std::int64_t size) {
  if (size < 8 || size % 8 != 0) throw std::invalid_argument("size must be a multiple of 8");
  std::int64_t odd = size;
  while (odd % 2 == 0) odd /= 2;
  if (odd > kMaxOddFactor) {
    throw std::invalid_argument("size must be an odd factor of at most 15 times a power of two");
  }
}

// The DFT X_f = sum_s x_s e^{-2 pi i f s / n} of `data` (n = size entries, in place): stage 0
// computes the direct DFTs of odd length m of the 2^k decimated sequences x[b + 2^k a] (b in
// bit-reversed order), each output a recursive sum of m twiddled terms; then k radix-2
// decimation-in-time stages X_f = E_f + w^f O_f, X_{f + L/2} = E_f - w^f O_f. Entries from
// `nonzero` on are exact zeros (a zero-padded input).
void transform(std::vector<Complex>& data, std::int64_t size, const TwiddleTable& twiddles,
               std::int64_t nonzero) {
  std::int64_t odd = size;
  int levels = 0;
  while (odd % 2 == 0) {
    odd /= 2;
    ++levels;
  }
  const std::int64_t blocks = size / odd;  // 2^levels
  std::vector<Complex> out(static_cast<std::size_t>(size));
  std::vector<Complex> coefficient(static_cast<std::size_t>(odd * odd));
  for (std::int64_t f = 0; f < odd; ++f) {
    for (std::int64_t a = 0; a < odd; ++a) {
      coefficient[static_cast<std::size_t>(f * odd + a)] = twiddles(((f * a) % odd) * blocks);
    }
  }
  for (std::int64_t p = 0; p < blocks; ++p) {
    std::int64_t b = 0;
    for (int bit = 0; bit < levels; ++bit) b |= ((p >> bit) & 1) << (levels - 1 - bit);
    if (b >= nonzero) {  // every input of this block is an exact zero: so are its outputs
      for (std::int64_t f = 0; f < odd; ++f) out[static_cast<std::size_t>(p * odd + f)] = Complex(0.0, 0.0);
      continue;
    }
    for (std::int64_t f = 0; f < odd; ++f) {
      Complex sum = times(coefficient[static_cast<std::size_t>(f * odd)],
                          data[static_cast<std::size_t>(b)]);
      for (std::int64_t a = 1; a < odd; ++a) {
        sum += times(coefficient[static_cast<std::size_t>(f * odd + a)],
                     data[static_cast<std::size_t>(b + blocks * a)]);
      }
      out[static_cast<std::size_t>(p * odd + f)] = sum;
    }
  }
  std::vector<Complex> stage(static_cast<std::size_t>(size / 2));
  for (std::int64_t half = odd; half < size; half *= 2) {
    const std::int64_t length = 2 * half;
    const std::int64_t stride = size / length;
    for (std::int64_t j = 0; j < half; ++j) stage[static_cast<std::size_t>(j)] = twiddles(j * stride);
    for (std::int64_t start = 0; start < size; start += length) {
      Complex* low = out.data() + start;
      Complex* high = low + half;
      for (std::int64_t j = 0; j < half; ++j) {
        const Complex t = times(stage[static_cast<std::size_t>(j)], high[j]);
        const Complex u = low[j];
        low[j] = u + t;
        high[j] = u - t;
      }
    }
  }
  data.swap(out);
}

}  // namespace

void certified_rfft(const double* values, std::size_t length, std::int64_t size, Complex* out) {
  check_size(size);
  if (static_cast<std::int64_t>(length) > size) {
    throw std::invalid_argument("values must not be longer than size");
  }
  const TwiddleTable twiddles(size);
  std::vector<Complex> data(static_cast<std::size_t>(size), Complex(0.0, 0.0));
  for (std::size_t s = 0; s < length; ++s) data[s] = Complex(values[s], 0.0);
  transform(data, size, twiddles, static_cast<std::int64_t>(length));
  for (std::int64_t f = 0; f <= size / 2; ++f) out[f] = data[static_cast<std::size_t>(f)];
}

void certified_irfft(const Complex* spectrum, std::int64_t size, double* out) {
  check_size(size);
  const TwiddleTable twiddles(size);
  // x = (1/n) conj(DFT(conj(X))) with X the Hermitian extension of the half spectrum; x is
  // real, so x = (1/n) Re DFT(conj(X)), and conj(X)_f = X_{n - f} for 0 < f < n.
  std::vector<Complex> data(static_cast<std::size_t>(size));
  const std::int64_t half = size / 2;
  data[0] = Complex(spectrum[0].real(), 0.0);
  data[static_cast<std::size_t>(half)] = Complex(spectrum[half].real(), 0.0);
  for (std::int64_t f = 1; f < half; ++f) {
    data[static_cast<std::size_t>(f)] = std::conj(spectrum[f]);
    data[static_cast<std::size_t>(size - f)] = spectrum[f];
  }
  transform(data, size, twiddles, size);
  const double scale = 1.0 / static_cast<double>(size);
  for (std::int64_t j = 0; j < size; ++j) out[j] = data[static_cast<std::size_t>(j)].real() * scale;
}

void certified_band_dft(const double* values, std::size_t length, std::int64_t size,
                        std::int64_t reach, Complex* out) {
  check_size(size);
  if (static_cast<std::int64_t>(length) > size) {
    throw std::invalid_argument("values must not be longer than size");
  }
  if (reach < 0 || reach > size / 2 + 1) throw std::invalid_argument("reach must be in [0, size/2 + 1]");
  const TwiddleTable twiddles(size);
  std::vector<Complex> partial;
  for (std::int64_t f = 0; f < reach; ++f) {
    // Blocks of kBandBlock terms summed in order, then the block sums pairwise.
    partial.clear();
    std::int64_t angle = 0;  // f s mod size, exact in integers
    for (std::size_t start = 0; start < length; start += kBandBlock) {
      const std::size_t stop = std::min(length, start + kBandBlock);
      Complex sum(0.0, 0.0);
      for (std::size_t s = start; s < stop; ++s) {
        const Complex w = twiddles(angle);
        sum += Complex(w.real() * values[s], w.imag() * values[s]);
        angle += f;
        if (angle >= size) angle -= size;
      }
      partial.push_back(sum);
    }
    while (partial.size() > 1) {
      std::size_t kept = 0;
      for (std::size_t i = 0; i + 1 < partial.size(); i += 2) partial[kept++] = partial[i] + partial[i + 1];
      if (partial.size() % 2 == 1) partial[kept++] = partial.back();
      partial.resize(kept);
    }
    out[f] = partial.empty() ? Complex(0.0, 0.0) : partial[0];
  }
}

}  // namespace dpsharp::pld
