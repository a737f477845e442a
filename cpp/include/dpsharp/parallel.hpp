// Splitting a loop over std::threads (not OpenMP: the extension must not bring a second OpenMP
// runtime next to torch's). Results never depend on the thread count or on which thread ran
// which indices: callers give every index a fixed amount of work whose result does not depend
// on the split.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace dpsharp {

// work(lo, hi) over [0, count) on at most `threads` threads, each thread's share at least
// `grain` indices (one call over everything, on the calling thread, when that is all there
// is). The indices are handed out in blocks, about 16 per thread, claimed in turn from an
// atomic counter rather than split up front: a helper thread that gets its core late (torch's
// OpenMP workers keep spinning for a while after every torch op, and the machine may be
// shared) then does less of the work instead of holding up the join.
template <typename Work>
void parallel_ranges(std::int64_t count, std::int64_t grain, int threads, Work&& work) {
  const std::int64_t useful = std::max<std::int64_t>(1, count / std::max<std::int64_t>(grain, 1));
  const int n_threads = static_cast<int>(std::min<std::int64_t>(std::max(threads, 1), useful));
  if (n_threads <= 1) {
    work(std::int64_t{0}, count);
    return;
  }
  const std::int64_t block = std::max<std::int64_t>(1, count / (16 * std::int64_t{n_threads}));
  std::atomic<std::int64_t> next{0};
  auto claim_blocks = [&work, &next, block, count] {
    for (;;) {
      const std::int64_t lo = next.fetch_add(block, std::memory_order_relaxed);
      if (lo >= count) return;
      work(lo, std::min(count, lo + block));
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(n_threads - 1));
  for (int t = 1; t < n_threads; ++t) pool.emplace_back(claim_blocks);
  claim_blocks();
  for (auto& th : pool) th.join();
}

}  // namespace dpsharp
