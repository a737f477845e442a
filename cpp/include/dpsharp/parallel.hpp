// Splitting a loop over threads. Results never depend on the thread count or on which thread
// ran which indices: callers give every index a fixed amount of work whose result does not
// depend on the split.
//
// Which threads: when an OpenMP runtime is already loaded into the process with global symbol
// visibility (PyTorch loads its libgomp that way, through libtorch_global_deps), the loop runs
// on that runtime's own thread team through its GOMP_parallel entry point, i.e. on the very
// threads torch's operators use. Otherwise it runs on std::threads started for the call.
// The extension itself never links an OpenMP runtime (a second runtime next to torch's would
// oversubscribe the cores). Why borrow torch's team: after every parallel torch operator its
// OpenMP workers keep spinning for a while, so a std::thread started right after one waits for
// a core that a spinning worker holds; on 2 cores the noise kernel after a backward pass ran
// at 1-thread speed or slower (MLP release 4.2-5.1 ms at 2 threads, 3.3-4.3 ms at 1), whereas
// the spinning workers pick up a team's work at once (1.6-1.8 ms).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>
#endif

namespace dpsharp {

// GOMP_parallel(fn, data, num_threads, flags): libgomp's stable ABI entry (GOMP_4.0, also
// provided by LLVM's libomp) that runs fn(data) on every thread of a team of up to num_threads
// threads, the caller included, and returns when all have finished.
using OpenmpTeamLauncher = void (*)(void (*)(void*), void*, unsigned, unsigned);

// The GOMP_parallel of an OpenMP runtime loaded with global visibility, or nullptr. A found
// address is cached (a loaded runtime is never unloaded while torch is in the process); a miss
// is looked up again on the next call, since torch may be imported later.
inline OpenmpTeamLauncher loaded_openmp_team_launcher() noexcept {
#if defined(__linux__) || defined(__APPLE__)
  static std::atomic<OpenmpTeamLauncher> found{nullptr};
  OpenmpTeamLauncher launch = found.load(std::memory_order_acquire);
  if (launch == nullptr) {
    launch = reinterpret_cast<OpenmpTeamLauncher>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
    if (launch != nullptr) found.store(launch, std::memory_order_release);
  }
  return launch;
#else
  return nullptr;
#endif
}

// work(lo, hi) over [0, count) on at most `threads` threads, each thread's share at least
// `grain` indices (one call over everything, on the calling thread, when that is all there
// is). The indices are handed out in blocks, about 16 per thread, claimed in turn from an
// atomic counter rather than split up front: a thread that gets its core late (the machine
// may be shared) then does less of the work instead of holding up the join, and a team
// smaller than asked for (an OpenMP runtime may give fewer threads, e.g. inside another
// parallel region) still covers every index. `work` must not throw.
//
// `Threads` picks the threads: kTorchTeam (the default) as described above, for the training
// kernels that run between torch's own parallel operators; kOwnThreads always std::threads,
// for the accountant's numerics, which have no reason to run on another library's thread team
// (they may be called from any thread, next to anything torch is doing).
enum class Threads { kTorchTeam, kOwnThreads };

template <Threads kThreads = Threads::kTorchTeam, typename Work>
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
  if (const OpenmpTeamLauncher launch =
          kThreads == Threads::kTorchTeam ? loaded_openmp_team_launcher() : nullptr) {
    launch([](void* claim) { (*static_cast<decltype(claim_blocks)*>(claim))(); }, &claim_blocks,
           static_cast<unsigned>(n_threads), 0u);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(n_threads - 1));
  for (int t = 1; t < n_threads; ++t) pool.emplace_back(claim_blocks);
  claim_blocks();
  for (auto& th : pool) th.join();
}

// Which threads parallel_ranges uses now: "openmp" (a loaded OpenMP runtime's team) or
// "std::thread".
inline const char* parallel_backend() noexcept {
  return loaded_openmp_team_launcher() != nullptr ? "openmp" : "std::thread";
}

}  // namespace dpsharp
