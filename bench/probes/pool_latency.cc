// How long a job of kvattn's own thread pool (src/cpu/common/thread_pool.h) takes beyond its work:
// `parallel_for` over 2 items of `work` microseconds of busy-waiting each, on 2 threads, with
// `gap` microseconds of busy work on the calling thread between jobs (the host's own work between
// two kvattn calls). Ideal: `work`. Compare KVATTN_CPU_SPIN_US=0 (the workers and the caller
// sleep at once) with the default (they spin 50 us first).
//
// Not part of the build (a one-off measurement; links the release library):
//   g++ -O2 -std=c++20 -pthread -I src -I include bench/probes/pool_latency.cc \
//       build/release/libkvattn.a -ldl -o /tmp/pool_latency
//   KVATTN_CPU_SPIN_US=0 /tmp/pool_latency 30 0; /tmp/pool_latency 30 0
// Prints the median and the 90th percentile over 400 jobs.
//
// AMD Zen 4 VM (2 vCPUs, 2026-12-06, two runs; work 30 us; median / p90 us):
//   gap 0:     spin 0  60.2-61.0 / 63.1-68.2   spin 50  30.3 / 30.8-60.2
//   gap 200:   spin 0  67.4-71.7 / 78.3-84.4   spin 50  51.2-56.9 / 60.2-67.1
//   gap 2000:  spin 0  69.4-84.2 / 91.9-96.0   spin 50  61.0-67.7 / 70.2-73.6
// Back to back, a sleeping worker wakes too late to take its item (the caller runs both: 60 us)
// and the caller, asleep on the done signal, wakes ~25 us late; spinning, both are on time.
// After a gap longer than the spin, the worker's wake-up stays (the caller then runs both items);
// the caller's spin on the done signal still saves its own.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/common/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

void busy(double us) {
  const auto end = Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(us * 1000));
  while (Clock::now() < end) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  const double work = argc > 1 ? std::atof(argv[1]) : 30, gap = argc > 2 ? std::atof(argv[2]) : 0;
  auto& pool = kvattn::cpu::ThreadPool::global();
  std::vector<double> us;
  for (int i = 0; i < 400; ++i) {
    if (gap > 0) busy(gap);
    const auto t0 = Clock::now();
    pool.parallel_for(2, 2, [&](int64_t, int) { busy(work); });
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("work %.0f us, gap %.0f us: median %.1f us, p90 %.1f\n", work, gap, us[us.size() / 2],
              us[us.size() * 9 / 10]);
}
