// One decode step of a model's attention, layer after layer, as a serving engine calls kvattn:
// `layers` layers, each with its own paged K/V cache (Llama-3-8B heads: 32 q / 8 KV, d 128, bf16,
// pages of 16, shuffled), one plan for the step, `run` per layer back to back, optionally with
// `gap` microseconds of the caller's own work between layers (the engine's GEMMs, on one thread
// here). Prints the median step time over `steps` steps and the KV bytes read per second.
// Compare KVATTN_CPU_SPIN_US=0 with the default (kvattn's own pool, src/cpu/common/thread_pool.h).
//
// Not part of the build (a one-off measurement; links the release libraries):
//   g++ -O2 -std=c++20 -pthread -I src -I include -I . bench/probes/layer_step.cc \
//       build/release/testing/libkvattn_testing.a build/release/libkvattn.a \
//       /usr/local/cuda/lib/libcudart_static.a -ldl -lrt -o /tmp/layer_step
// (the CUDA runtime only where the release build has CUDA kernels, as this machine's does)
//   /tmp/layer_step [batch=1] [context=1024] [layers=32] [gap_us=0] [steps=50] [threads=2] [thp=0]
// thp=1 copies each layer's K and V caches onto transparent huge pages (madvise), as
// `kvattn bench` does; 0 leaves them where the case put them (4 KiB pages under THP "madvise").
//
// AMD Zen 4 VM (2 vCPUs, 2026-12-06, 2 threads, 32 layers, 30 steps, two runs; attention ms a
// step, KVATTN_CPU_SPIN_US=0 -> default 50):
//   B1 x 1024 (4 MiB a layer)   gap 0: 8.34 / 7.91 -> 6.86 / 7.67 (1.03-1.22x)
//                               gap 500 us: 9.77 / 9.55 -> 7.57 / 8.78 (1.09-1.29x)
//   B4 x 1024, B16 x 256, B1 x 4096 (16 MiB a layer), gap 0 and 500 us: 0.95-1.07x (the noise)
// At 4 MiB a layer the wake-ups were ~15 % of the step; the caller's spin on the workers' count
// saves its own wake-up even where the workers' spin has run out in the gap. A spin of 1000 us
// at gap 500 us: 6.76 / 6.82 ms against 6.96 / 7.01 at 50 (0 us: 9.57 / 8.66).
// thp=1 against 0, the same session (B1 x 1024 / x 4096, gap 0, two runs): 6.54 / 8.15 against
// 7.01 / 6.97 ms, 26.0 / 26.2 against 24.2 / 30.7: no difference this host's noise lets through.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <sys/mman.h>

#include "kvattn/kvattn.h"
#include "testing/case_builder.h"

namespace {

using Clock = std::chrono::steady_clock;

void busy(double us) {
  const auto end = Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(us * 1000));
  while (Clock::now() < end) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, double fallback) { return argc > i ? std::atof(argv[i]) : fallback; };
  const int batch = static_cast<int>(arg(1, 1)), layers = static_cast<int>(arg(3, 32));
  const int64_t context = static_cast<int64_t>(arg(2, 1024));
  const double gap = arg(4, 0);
  const int steps = static_cast<int>(arg(5, 50)), threads = static_cast<int>(arg(6, 2));
  const bool thp = arg(7, 0) != 0;

  kvattn::testing::CaseSpec spec;
  kvattn::Problem& p = spec.problem;
  p.op = kvattn::Op::kBatchDecode;
  p.batch_size = batch;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = p.head_dim_vo = 128;
  p.page_size = 16;
  p.q_dtype = p.kv_dtype = p.o_dtype = kvattn::DType::kBF16;
  spec.kv_lens.assign(batch, context);
  spec.extra_pages = 0;
  spec.nan_fill_outputs = false;
  std::vector<kvattn::testing::Case> cases;
  std::vector<kvattn::AttentionArgs> args;
  for (int l = 0; l < layers; ++l) {
    spec.seed = 1 + l;
    cases.push_back(kvattn::testing::Case::make(spec));
  }
  for (auto& c : cases) args.push_back(c.args());
  std::vector<std::unique_ptr<std::byte, decltype(&std::free)>> huge;
  if (thp) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    for (int l = 0; l < layers; ++l) {
      // The paged caches' buffers (testing/case_builder.h), the views pointing into them.
      for (auto [view, cache] : {std::pair{&args[l].paged_k_cache, &cases[l].k_cache},
                                 std::pair{&args[l].paged_v_cache, &cases[l].v_cache}}) {
        const std::size_t n = (cache->size() + kHuge - 1) / kHuge * kHuge;
        auto* buf = static_cast<std::byte*>(std::aligned_alloc(kHuge, n));
        madvise(buf, n, MADV_HUGEPAGE);
        std::memcpy(buf, cache->data(), cache->size());
        view->data = buf + (static_cast<const std::byte*>(view->data) - cache->data());
        huge.emplace_back(buf, &std::free);
      }
    }
  }
  kvattn::PlanOptions options;
  options.backend = "cpu";
  options.num_threads = threads;
  kvattn::Plan plan;
  if (kvattn::Status s = kvattn::plan(p, args[0], options, &plan); !s.ok()) {
    std::fprintf(stderr, "plan: %s\n", s.to_string().c_str());
    return 1;
  }
  std::vector<double> ms;
  for (int step = 0; step < steps + 1; ++step) {  // the first step warms up
    double own = 0;
    const auto t0 = Clock::now();
    for (int l = 0; l < layers; ++l) {
      if (gap > 0) {
        const auto g0 = Clock::now();
        busy(gap);
        own += std::chrono::duration<double, std::milli>(Clock::now() - g0).count();
      }
      if (kvattn::Status s = kvattn::run(plan, args[l]); !s.ok()) {
        std::fprintf(stderr, "run: %s\n", s.to_string().c_str());
        return 1;
      }
    }
    const double total = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (step > 0) ms.push_back(total - own);
  }
  std::sort(ms.begin(), ms.end());
  const double bytes = static_cast<double>(cases[0].bytes_moved()) * layers;
  const double med = ms[ms.size() / 2];
  std::printf("B%d x %lld keys, %d layers, gap %.0f us, %d threads, thp %d: attention %.3f ms a step "
              "(min %.3f), %.1f GB/s, %.1f us a layer\n",
              batch, static_cast<long long>(context), layers, gap, threads, thp ? 1 : 0, med,
              ms.front(),
              bytes / (med / 1e3) / 1e9, med * 1e3 / layers);
}
