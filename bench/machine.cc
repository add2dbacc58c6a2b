#include "bench/machine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "cpu/mla/mla.h"
#include "cpu/common/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvattn::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kWorkingSetBytes = std::size_t{1} << 30;
constexpr int kBandwidthPasses = 9;  // odd: the median is one pass
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr int kFmaPasses = 5;
constexpr int64_t kFmaIterations = 20'000'000;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sums 64-byte lines; the sum is returned so that the loads cannot be dropped.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t read_avx512(const uint64_t* p, std::size_t words) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 32 <= words; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 24));
  }
  // Summed as unsigned words (_mm512_reduce_add_epi64 adds signed lanes, which overflow).
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  return std::accumulate(lanes, lanes + 8, uint64_t{0});
}
__attribute__((target("avx2"))) uint64_t read_avx2(const uint64_t* p, std::size_t words) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 16 <= words; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif
uint64_t read_portable(const uint64_t* p, std::size_t words) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (std::size_t i = 0; i + 4 <= words; i += 4) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

uint64_t read_words(const uint64_t* p, std::size_t words) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return read_avx512(p, words);
  if (__builtin_cpu_supports("avx2")) return read_avx2(p, words);
#endif
  return read_portable(p, words);
}

// 16 independent FMA chains per thread: enough to cover latency 4 x 2 pipes with room to spare.
#if defined(__x86_64__)
__attribute__((target("avx512f,fma"))) float fma_avx512(int64_t iterations, int64_t* flops) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  *flops = iterations * 16 * 16 * 2;
  __m512 sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}
__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iterations, int64_t* flops) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  *flops = iterations * 12 * 8 * 2;
  alignas(32) float lanes[8];
  __m256 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, acc[i]);
  _mm256_store_ps(lanes, sum);
  return lanes[0];
}
#endif
float fma_portable(int64_t iterations, int64_t* flops) {
  float acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = static_cast<float>(i);
  for (int64_t it = 0; it < iterations; ++it) {
    for (float& x : acc) x = x * 0.999999f + 1e-7f;
  }
  *flops = iterations * 8 * 2;
  return acc[0] + acc[7];
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_avx512(int64_t iterations,
                                                                    int64_t* flops) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  *flops = iterations * 16 * 16 * 2 * 2;
  __m512 sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}
#endif

#if defined(__x86_64__)
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
// Six independent accumulator tiles (2..7) over one A (0) and one B (1) tile.
__attribute__((target("amx-tile,amx-bf16"))) float amx_bf16(int64_t iterations, int64_t* flops) {
  AmxConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t ab[16 * 32];
  for (uint16_t& x : ab) x = 0x3f80;  // bf16 1.0
  alignas(64) float c[16 * 16] = {};
  _tile_loadd(0, ab, 64);
  _tile_loadd(1, ab, 64);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  const int64_t n = iterations / 16;
  for (int64_t it = 0; it < n; ++it) {
    _tile_dpbf16ps(2, 0, 1);
    _tile_dpbf16ps(3, 0, 1);
    _tile_dpbf16ps(4, 0, 1);
    _tile_dpbf16ps(5, 0, 1);
    _tile_dpbf16ps(6, 0, 1);
    _tile_dpbf16ps(7, 0, 1);
  }
  _tile_stored(2, c, 64);
  _tile_release();
  *flops = n * 6 * 16 * 16 * 32 * 2;
  return c[0];
}
#endif

float run_fma(int64_t iterations, int64_t* flops) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return fma_avx512(iterations, flops);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return fma_avx2(iterations, flops);
  }
#endif
  return fma_portable(iterations, flops);
}

}  // namespace

struct DramReader::Buffer {
  std::unique_ptr<uint64_t[], void (*)(uint64_t*)> data{nullptr, [](uint64_t* p) { std::free(p); }};
  std::size_t bytes = 0, words = 0, share = 0;
  int threads = 1;
  std::atomic<uint64_t> sink{0};
};

DramReader::DramReader(int num_threads) : buffer_(std::make_unique<Buffer>()) {
  Buffer& b = *buffer_;
  b.threads = cpu::resolve_num_threads(num_threads);
  // Far past the last-level cache: at least 1 GiB and 8x the L3, at most 4 GiB.
  b.bytes = kWorkingSetBytes;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) b.bytes = std::max(b.bytes, std::size_t(8) * static_cast<std::size_t>(l3));
  b.bytes = std::min(b.bytes, std::size_t{4} << 30);
  b.bytes = b.bytes / kHugePage * kHugePage;
  // On transparent huge pages, as the benchmarked K/V caches are (harness.cc): with 4 KiB pages
  // the hardware prefetchers stop at every page boundary.
  b.data.reset(static_cast<uint64_t*>(std::aligned_alloc(kHugePage, b.bytes)));
#if defined(MADV_HUGEPAGE)
  madvise(b.data.get(), b.bytes, MADV_HUGEPAGE);
#endif
  b.words = b.bytes / sizeof(uint64_t);
  b.share = b.words / b.threads / 32 * 32;
  // First touch by the thread that reads the share (NUMA placement), with non-zero data.
  cpu::ThreadPool::global().parallel_for(b.threads, b.threads, [&](int64_t t, int) {
    uint64_t* share = b.data.get() + t * b.share;
    for (std::size_t i = 0; i < b.share; ++i) share[i] = i ^ static_cast<uint64_t>(t);
  });
  // One pass discarded: on the Zen 4 VM the passes right after the first touch read ~5 % slower
  // than later ones (31.4 against 32.6-33.3 GB/s, medians of 9, three measures in a row).
  (void)pass_gbps();
}

DramReader::~DramReader() = default;

double DramReader::pass_gbps() {
  Buffer& b = *buffer_;
  // All threads streaming their shares at once, as decode's threads do.
  const auto t0 = Clock::now();
  cpu::ThreadPool::global().parallel_for(b.threads, b.threads, [&](int64_t t, int) {
    b.sink.fetch_add(read_words(b.data.get() + t * b.share, b.share), std::memory_order_relaxed);
  });
  return static_cast<double>(b.share * b.threads * sizeof(uint64_t)) / seconds_since(t0) / 1e9;
}

DramBandwidth DramReader::measure() {
  Buffer& b = *buffer_;
  std::vector<double> passes;
  for (int pass = 0; pass < kBandwidthPasses; ++pass) passes.push_back(pass_gbps());
  // One thread alone over a quarter of the buffer: what one core can pull.
  std::vector<double> single;
  const std::size_t single_words = b.words / 4 / 32 * 32;
  for (int pass = 0; pass < kBandwidthPasses; ++pass) {
    const auto t0 = Clock::now();
    b.sink.fetch_add(read_words(b.data.get() + (pass % 4) * single_words, single_words),
                     std::memory_order_relaxed);
    single.push_back(static_cast<double>(single_words * sizeof(uint64_t)) / seconds_since(t0));
  }
  std::sort(passes.begin(), passes.end());
  std::sort(single.begin(), single.end());
  DramBandwidth r;
  r.gbps = passes[passes.size() / 2];
  r.min_gbps = passes.front();
  r.max_gbps = passes.back();
  r.bytes_per_s_per_core = single[single.size() / 2];
  r.buffer_bytes = static_cast<double>(b.bytes);
  r.passes = kBandwidthPasses;
  if (b.sink.load() == 42) r.passes += 0;  // the sums are used, so the loads stay
  return r;
}

double measure_bf16_dot_gflops(int num_threads) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512bf16")) return 0;
  const int threads = cpu::resolve_num_threads(num_threads);
  double best = 0;
  std::atomic<float> sink{0};
  for (int pass = 0; pass < kFmaPasses; ++pass) {
    std::vector<int64_t> flops(threads, 0);
    const auto t0 = Clock::now();
    cpu::ThreadPool::global().parallel_for(threads, threads, [&](int64_t t, int) {
      const float r = bf16_dot_avx512(kFmaIterations, &flops[t]);
      float seen = sink.load();
      while (!sink.compare_exchange_weak(seen, seen + r)) {
      }
    });
    const double s = seconds_since(t0);
    double total = 0;
    for (int64_t f : flops) total += static_cast<double>(f);
    best = std::max(best, total / s / 1e9);
  }
  return best;
#else
  (void)num_threads;
  return 0;
#endif
}

double measure_amx_bf16_gflops(int num_threads) {
#if defined(__x86_64__)
  if (!cpu::mla_amx_active()) return 0;  // also obtains the tile state from the OS
  const int threads = cpu::resolve_num_threads(num_threads);
  double best = 0;
  std::atomic<float> sink{0};
  for (int pass = 0; pass < kFmaPasses; ++pass) {
    std::vector<int64_t> flops(threads, 0);
    const auto t0 = Clock::now();
    cpu::ThreadPool::global().parallel_for(threads, threads, [&](int64_t t, int) {
      const float r = amx_bf16(kFmaIterations, &flops[t]);
      float seen = sink.load();
      while (!sink.compare_exchange_weak(seen, seen + r)) {
      }
    });
    const double s = seconds_since(t0);
    double total = 0;
    for (int64_t f : flops) total += static_cast<double>(f);
    best = std::max(best, total / s / 1e9);
  }
  return best;
#else
  (void)num_threads;
  return 0;
#endif
}

namespace {
// The best of kFmaPasses all-thread passes of `fma` (e.g. run_fma).
double measure_fma_with(float (*fma)(int64_t, int64_t*), int num_threads) {
  const int threads = cpu::resolve_num_threads(num_threads);
  double best = 0;
  std::atomic<float> sink{0};
  for (int pass = 0; pass < kFmaPasses; ++pass) {
    std::vector<int64_t> flops(threads, 0);
    const auto t0 = Clock::now();
    cpu::ThreadPool::global().parallel_for(threads, threads, [&](int64_t t, int) {
      const float r = fma(kFmaIterations, &flops[t]);
      float seen = sink.load();
      while (!sink.compare_exchange_weak(seen, seen + r)) {
      }
    });
    const double s = seconds_since(t0);
    double total = 0;
    for (int64_t f : flops) total += static_cast<double>(f);
    best = std::max(best, total / s / 1e9);
  }
  return best;
}

float run_fma256(int64_t iterations, int64_t* flops) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return fma_avx2(iterations, flops);
  }
#endif
  return fma_portable(iterations, flops);
}
}  // namespace

double measure_fma_gflops(int num_threads) { return measure_fma_with(run_fma, num_threads); }

double measure_fma256_gflops(int num_threads) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512f")) return measure_fma_gflops(num_threads);
#endif
  return measure_fma_with(run_fma256, num_threads);
}

}  // namespace kvattn::bench
