// A model of the decode kernel's stream, to tell what of its DRAM rate the access pattern and the
// prefetch allow: how much of min(compute, memory) a plain loop reaches on this machine. Each
// thread reads shuffled 32 KiB pages in groups of four (decode's tile of 32 keys: 2 pages of K, 2
// of V at 8 heads x d128 bf16) and does W 512-bit FMAs a 64-byte line, in 8 chains. Columns:
//   cache          the loop over 256 KiB a thread (L2): its compute rate
//   in order       DRAM, each group read line l of every page in turn (the bench's paged-read
//                  ceiling's order), FMAs independent of the loads
//   + prefetch     the same with prefetcht0 of the next group, line for line in that order, in
//                  visits of argv[2] lines (decode's walk: 4 lines a tick)
//   by heads       DRAM, each group read as decode's one-head-a-step NHD task reads it (head h of
//                  all 16 tokens of the 4 pages, 256 bytes each, then head h + 1), no prefetch
//   dependent ...  the FMAs take the loaded line, as decode's products do (a late line holds them
//                  up); "+ walk" prefetches through a copy of decode's walk (TilePrefetcher),
//                  "+ pf in reads' order" the line the next group reads at the same point
//   barrier ...    as "+ walk", and between each head's K and V pages a "softmax" the V lines'
//                  products wait on (every accumulator reduced, 16 dependent FMAs)
// "(x)" is the DRAM rate over min(the column's cache rate, the W 0 in-order DRAM read).
// Not part of the build; AVX-512 only:
//   g++ -O3 -march=native -std=c++20 -pthread bench/probes/stream_overlap.cc -o /tmp/so
//   /tmp/so [threads=2] [prefetch lines a visit=1] [transparent huge pages=0]
// Decode's figure in the same terms: `kvattn bench`'s dram_paired_fraction (its compute rate,
// ~25 GB/s a thread cache-resident, is above the read with two threads). The figures of an AMD
// Zen 4 VM: the README block "Zen 4, 2026-12-08" (issue 23's note of that day).
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr size_t kPage = 32768;
constexpr int kLines = kPage / 64;
int g_burst = 1;  // the prefetch's lines a visit (argv[2]): every g_burst-th line issues that many

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// decode's prefetch walk (src/cpu/decode/decode_prefetch.h, TilePrefetcher::issue_lines) in
// small: line j of every stream in turn, a bound test a line, the position kept in members.
struct Walk {
  const char* begin[64];
  int64_t lines[64];
  int count = 0;
  int64_t line = 0;
  int stream = 0;
  [[gnu::always_inline]] void issue(int64_t n) {
    int64_t l = line, left = n;
    int s = stream;
    while (left > 0) {
      if (l < lines[s]) {
        _mm_prefetch(begin[s] + 64 * l, _MM_HINT_T0);
        --left;
      }
      if (++s == count) {
        s = 0;
        ++l;
      }
      if (l >= kLines) break;
    }
    line = l;
    stream = s;
  }
};

// One thread's pass over its pages (a multiple of 4), W FMAs a line in 8 chains. kHeadMajor
// reads each group of 4 pages as decode's one-head-a-step NHD task does (a 32 KiB page: 16 tokens
// x 8 heads x 256 bytes; head h of every token of the 4 pages, then head h + 1), the prefetch of
// the next group still line by line over its pages.
template <int W, bool kHeadMajor = false, bool kDependent = false, bool kBarrier = false>
uint64_t pass(const char* buf, const size_t* order, size_t pages, int prefetch) {
  Walk walk;
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_set1_ps(1.0f);
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
  __m512i sum = _mm512_setzero_si512();
  __m512 gate = one;
  for (size_t p = 0; p < pages; p += 4) {
    const bool ahead = prefetch == 1 && p + 4 < pages;
    const bool walks = prefetch == 2 && p + 4 < pages;
    if (walks) {
      walk.count = 4;
      walk.line = walk.stream = 0;
      for (int s = 0; s < 4; ++s) {
        walk.begin[s] = buf + order[p + 4 + s] * kPage;
        walk.lines[s] = kLines;
      }
    }
    for (int i = 0; i < 4 * kLines; ++i) {
      const int l = i / 4, s = i % 4;  // the prefetch's order: line l of page s
      if (walks && i % g_burst == 0) walk.issue(g_burst);
      if (ahead && i % g_burst == 0) {
        for (int j = i; j < i + g_burst && j < 4 * kLines; ++j) {
          _mm_prefetch(buf + order[p + 4 + j % 4] * kPage + 64 * (j / 4), _MM_HINT_T0);
        }
      }
      size_t at = order[p + s] * kPage + 64 * l;
      if constexpr (kHeadMajor) {
        // i = ((h * 4 + page) * 16 + token) * 4 + line
        const int line = i % 4, token = i / 4 % 16, page = i / 64 % 4, h = i / 256;
        at = order[p + page] * kPage + 2048 * token + 256 * h + 64 * line;
        // Mode 3: the line the next group reads at this point (the prefetch in the reads' order).
        if (prefetch == 3 && p + 4 < pages) {
          _mm_prefetch(buf + order[p + 4 + page] * kPage + 2048 * token + 256 * h + 64 * line,
                       _MM_HINT_T0);
        }
      }
      if (kBarrier && i % 256 == 128) {
        // The head's "softmax" between its K rows and its V rows: every accumulator summed and
        // reduced, then a chain of 16 dependent FMAs; the V rows' products wait on it (gate = 1).
        __m512 t = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])),
            _mm512_add_ps(_mm512_add_ps(acc[4], acc[5]), _mm512_add_ps(acc[6], acc[7])));
        t = _mm512_add_ps(t, _mm512_maskz_shuffle_f32x4(0xFFFF, t, t, 0x4E));
        t = _mm512_add_ps(t, _mm512_maskz_shuffle_f32x4(0xFFFF, t, t, 0xB1));
        t = _mm512_add_ps(t, _mm512_maskz_permute_ps(0xFFFF, t, 0x4E));
        t = _mm512_add_ps(t, _mm512_maskz_permute_ps(0xFFFF, t, 0xB1));
        for (int k = 0; k < 16; ++k) t = _mm512_fmadd_ps(t, half, one);
        gate = _mm512_maskz_max_ps(0xFFFF, _mm512_maskz_min_ps(0xFFFF, t, one), one);
      }
      const __m512i v = _mm512_load_si512(buf + at);
      sum = _mm512_add_epi64(sum, v);
      // kDependent: the FMAs take the line (its bytes 0x01: a tiny normal float), as decode's
      // products do, so a late line holds them up; else they run beside the loads.
      __m512 x = kDependent ? _mm512_castsi512_ps(v) : half;
      if (kBarrier && i % 256 >= 128) x = _mm512_mul_ps(x, gate);
#pragma GCC unroll 64
      for (int w = 0; w < W; ++w) acc[w % 8] = _mm512_fmadd_ps(acc[w % 8], x, one);
    }
  }
  __m512 t = acc[0];
  for (int k = 1; k < 8; ++k) t = _mm512_add_ps(t, acc[k]);
  // Stored and summed (GCC 12's _mm512_reduce_add_* warn of an uninitialized operand).
  alignas(64) uint64_t words[8];
  alignas(64) float floats[16];
  _mm512_store_si512(words, sum);
  _mm512_store_ps(floats, t);
  return std::accumulate(words, words + 8, uint64_t{0}) +
         static_cast<uint64_t>(std::accumulate(floats, floats + 16, 0.0f));
}

struct Buffer {
  char* data = nullptr;
  size_t bytes = 0;
  std::vector<std::vector<size_t>> orders;  // per thread: its pages, shuffled

  Buffer(size_t total, int threads, bool huge) : bytes(total) {
    data = static_cast<char*>(aligned_alloc(size_t{1} << 21, total));
    madvise(data, total, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(data, 1, total);
    const size_t per = total / kPage / threads / 4 * 4;
    std::mt19937_64 rng(1);
    for (int t = 0; t < threads; ++t) {
      std::vector<size_t> o(per);
      std::iota(o.begin(), o.end(), t * per);
      std::shuffle(o.begin(), o.end(), rng);
      orders.push_back(std::move(o));
    }
  }
  ~Buffer() { free(data); }
};

// GB/s of `threads` threads each running its pass `reps` times (best of `rounds`).
template <int W, bool kHeadMajor = false, bool kDependent = false, bool kBarrier = false>
double rate(const Buffer& b, int threads, int prefetch, int reps, int rounds) {
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::thread> pool;
    std::vector<uint64_t> sink(threads);
    const double t0 = now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (int i = 0; i < reps; ++i) {
          sink[t] += pass<W, kHeadMajor, kDependent, kBarrier>(b.data, b.orders[t].data(),
                                                               b.orders[t].size(), prefetch);
        }
      });
    }
    for (auto& th : pool) th.join();
    const double s = now() - t0;
    const double bytes = static_cast<double>(b.orders[0].size()) * kPage * threads * reps;
    best = std::max(best, bytes / s / 1e9);
    if (sink[0] == 42) std::printf(" ");
  }
  return best;
}

// One line of the table: GB/s and (of bound) per way of reading.
template <int W>
void row(const Buffer& cache, const Buffer& dram, double read, int threads) {
  const double compute = rate<W>(cache, threads, false, 400, 3);
  const double dep_compute = rate<W, true, true>(cache, threads, false, 400, 3);
  auto cell = [&](double g, double c) { std::printf(" | %6.2f (%.2f)", g, g / std::min(c, read)); };
  std::printf("W %2d  %6.2f", W, compute);
  cell(rate<W>(dram, threads, false, 1, 3), compute);
  cell(rate<W>(dram, threads, true, 1, 3), compute);
  cell(rate<W, true>(dram, threads, false, 1, 3), compute);
  cell(rate<W, true>(dram, threads, true, 1, 3), compute);
  std::printf(" | %6.2f", dep_compute);
  cell(rate<W, false, true>(dram, threads, true, 1, 3), dep_compute);
  cell(rate<W, true, true>(dram, threads, true, 1, 3), dep_compute);
  cell(rate<W, true, true>(dram, threads, 2, 1, 3), dep_compute);
  cell(rate<W, true, true>(dram, threads, 3, 1, 3), dep_compute);
  const double bar_compute = rate<W, true, true, true>(cache, threads, 0, 400, 3);
  std::printf(" | %6.2f", bar_compute);
  cell(rate<W, true, true, true>(dram, threads, 2, 1, 3), bar_compute);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  g_burst = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  const bool huge = argc > 3 && std::atoi(argv[3]) != 0;
  const Buffer cache(size_t{256} * 1024 * threads, threads, huge);  // 256 KiB a thread: L2
  const Buffer dram(size_t{1} << 30, threads, huge);
  const double read = rate<0>(dram, threads, false, 1, 5);
  std::printf("%d threads, prefetch %d lines a visit, %s; GB/s (of bound); DRAM read: %.2f\n",
              threads, g_burst, huge ? "THP" : "4 KiB pages", read);
  std::printf(
      "      independent FMAs:                                                   | "
      "dependent FMAs:\n");
  std::printf(
      "W     cache  | in order      | + prefetch    | by heads      | + prefetch    | "
      "cache  | in order + pf | by heads + pf | + walk        | + pf in reads' order | barrier: "
      "cache, + walk\n");
  row<0>(cache, dram, read, threads);
  row<8>(cache, dram, read, threads);
  row<16>(cache, dram, read, threads);
  row<32>(cache, dram, read, threads);
  return 0;
}
