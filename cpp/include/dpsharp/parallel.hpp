// Splitting a loop over std::threads (not OpenMP: the extension must not bring a second OpenMP
// runtime next to torch's). Results never depend on the thread count: callers give every
// index a fixed amount of work whose result does not depend on the split.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace dpsharp {

// work(lo, hi) over [0, count) in at most `threads` contiguous ranges, each of at least `grain`
// indices (one range, on the calling thread, when that is all there is).
template <typename Work>
void parallel_ranges(std::int64_t count, std::int64_t grain, int threads, Work&& work) {
  const std::int64_t useful = std::max<std::int64_t>(1, count / std::max<std::int64_t>(grain, 1));
  const int n_threads = static_cast<int>(std::min<std::int64_t>(std::max(threads, 1), useful));
  if (n_threads <= 1) {
    work(std::int64_t{0}, count);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(n_threads - 1));
  const std::int64_t chunk = (count + n_threads - 1) / n_threads;
  for (int t = 1; t < n_threads; ++t) {
    const std::int64_t lo = std::min(count, chunk * t);
    const std::int64_t hi = std::min(count, lo + chunk);
    pool.emplace_back([&work, lo, hi] { work(lo, hi); });
  }
  work(std::int64_t{0}, std::min(count, chunk));
  for (auto& th : pool) th.join();
}

}  // namespace dpsharp
