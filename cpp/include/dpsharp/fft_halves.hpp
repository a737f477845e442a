// A real FFT of length n (a multiple of 4) from the real FFTs of its even and odd samples, and
// back: the radix-2 decimation-in-time step between a transform and two of half the length,
// so that the two halves can be transformed on two threads (pocketfft runs one 1-D transform
// on one thread) and each half's working set is half as large.
//
// With m = n / 2, w = e^{-2 pi i / n}, E = rfft(x[0::2]) and O = rfft(x[1::2]) (m / 2 + 1
// entries each) and X = rfft(x) (m + 1 entries), for j = 0 .. m / 2:
//   X[j]     = E[j] + w^j O[j]
//   X[m - j] = conj(E[j] - w^j O[j])
// (E and O are m-periodic and Hermitian, and w^m = -1). The inverse step solves those two
// equations: E[j] = (X[j] + conj(X[m - j])) / 2, O[j] = (X[j] - conj(X[m - j])) conj(w^j) / 2.
//
// Accuracy: w^j = w^{a B} w^{b} (j = a B + b, B about sqrt(m / 2)) from two tables of correctly
// evaluated sines and cosines, so every twiddle is within a few ulp, like a radix-2 stage of
// the FFT itself; each output entry then costs one complex product and one sum.
#pragma once

#include <complex>
#include <cstdint>

namespace dpsharp::fft {

// out[0 .. size / 2] = the real FFT of length `size` whose even and odd samples have the real
// FFTs `even` and `odd` (size / 4 + 1 entries each). `size` must be a positive multiple of 4.
void combine_halves(const std::complex<double>* even, const std::complex<double>* odd,
                    std::int64_t size, std::complex<double>* out, int threads);

// The inverse: `even` and `odd` (size / 4 + 1 entries each) from `spectrum` (size / 2 + 1
// entries), such that irfft(even, size / 2) and irfft(odd, size / 2) are the even and odd
// samples of irfft(spectrum, size). The imaginary parts of spectrum[0] and spectrum[size / 2]
// are ignored, as irfft ignores them.
void split_spectrum(const std::complex<double>* spectrum, std::int64_t size,
                    std::complex<double>* even, std::complex<double>* odd, int threads);

}  // namespace dpsharp::fft
