// The radix-2 step between a real FFT and the real FFTs of its even and odd samples (see
// fft_halves.hpp for the formulas).
#include "dpsharp/fft_halves.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "dpsharp/parallel.hpp"

namespace dpsharp::fft {
namespace {

using Complex = std::complex<double>;

// Plain complex arithmetic (std::complex's operator* also checks for NaN results, which the
// finite spectra here never produce, and is several times slower).
inline Complex times(Complex a, Complex b) noexcept {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}

// w^j = e^{-2 pi i j / size} for j = 0 .. size / 4 as coarse[j / block] * fine[j % block].
class Twiddles {
 public:
  explicit Twiddles(std::int64_t size) : size_(size) {
    const std::int64_t last = size / 4;
    block_ = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(last + 1))));
    fine_.resize(static_cast<std::size_t>(block_));
    coarse_.resize(static_cast<std::size_t>(last / block_ + 1));
    for (std::int64_t b = 0; b < block_; ++b) fine_[static_cast<std::size_t>(b)] = at_angle(b);
    for (std::size_t a = 0; a < coarse_.size(); ++a) {
      coarse_[a] = at_angle(static_cast<std::int64_t>(a) * block_);
    }
  }

  Complex operator()(std::int64_t j) const noexcept {
    return times(coarse_[static_cast<std::size_t>(j / block_)],
                 fine_[static_cast<std::size_t>(j % block_)]);
  }

 private:
  // e^{-2 pi i j / size}, with the angle in [0, pi / 2] (j <= size / 4) where sin and cos are
  // evaluated to within an ulp.
  Complex at_angle(std::int64_t j) const noexcept {
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    const double angle = kTwoPi * (static_cast<double>(j) / static_cast<double>(size_));
    return {std::cos(angle), -std::sin(angle)};
  }

  std::int64_t size_;
  std::int64_t block_ = 1;
  std::vector<Complex> fine_;
  std::vector<Complex> coarse_;
};

void check_size(std::int64_t size) {
  if (size < 4 || size % 4 != 0) {
    throw std::invalid_argument("size must be a positive multiple of 4");
  }
}

// Entries per thread at least (the work per entry is a few nanoseconds).
constexpr std::int64_t kGrain = std::int64_t{1} << 15;

// step(j, m, w^j) for j = 0 .. size / 4 (m = size / 2), the entries split over `threads`:
// each j reads and writes only entries j and m - j of its arrays.
template <typename Step>
void for_each_pair(std::int64_t size, int threads, Step&& step) {
  check_size(size);
  const std::int64_t m = size / 2;
  const Twiddles twiddle(size);
  parallel_ranges<Threads::kOwnThreads>(
      m / 2 + 1, kGrain, threads, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t j = lo; j < hi; ++j) step(j, m, twiddle(j));
      });
}

}  // namespace

void combine_halves(const Complex* even, const Complex* odd, std::int64_t size, Complex* out,
                    int threads) {
  for_each_pair(size, threads, [&](std::int64_t j, std::int64_t m, Complex w) {
    const Complex rotated = times(w, odd[j]);
    out[j] = even[j] + rotated;
    const Complex difference = even[j] - rotated;
    out[m - j] = {difference.real(), -difference.imag()};
  });
}

void split_spectrum(const Complex* spectrum, std::int64_t size, Complex* even, Complex* odd,
                    int threads) {
  for_each_pair(size, threads, [&](std::int64_t j, std::int64_t m, Complex w) {
    Complex low = spectrum[j];
    Complex high = spectrum[m - j];
    if (j == 0) {  // irfft ignores the imaginary parts at 0 and m
      low = {low.real(), 0.0};
      high = {high.real(), 0.0};
    }
    const Complex high_conj{high.real(), -high.imag()};
    even[j] = 0.5 * (low + high_conj);
    odd[j] = 0.5 * times(low - high_conj, {w.real(), -w.imag()});
  });
}

}  // namespace dpsharp::fft
