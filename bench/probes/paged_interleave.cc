// How fast one reader per core takes shuffled KV pages from DRAM, by how many pages it reads at
// once (issue 23, Zen 4 note of 2026-12-06): the question behind the decode goals' "of the DRAM
// read" on a paged cache.
//
// 1 GiB on huge pages, cut into pages of PAGE bytes (32 KiB: 16 tokens x 8 KV heads x 256 bytes,
// a K or V page of bf16 d 128; 16 KiB is d 64's) in a shuffled order. Each thread reads its share
// of the order, N pages at a time, line l of each of the N pages in turn (one 512-bit load a
// line), then the next N. Per line W FMAs on 16 accumulators (W = 8: ~55 GB/s on two Zen 4 cores
// from L3, the decode kernel's cache-resident rate at d 128 is ~45). Modes: "contiguous" (the same
// walk over the pages in address order: the DRAM read the bench pairs with), "nN" (N pages at a
// time, demand loads only: whatever prefetching the hardware does), "n4 pf1" / "n4 pf2" (n4 plus
// a prefetcht0 per line of the group after / two after, at the pace of the loads).
//
// Not part of the build (a one-off measurement; AVX-512):
//   g++ -O2 -mavx512f -std=c++20 -pthread bench/probes/paged_interleave.cc -o /tmp/paged_interleave
//   /tmp/paged_interleave [threads=2] [page_bytes=32768] [rounds=3] [W=0|4|8|12|16] [cached=0]
// cached=1 folds the order onto the first 8 MiB (L3): the arithmetic's own rate.
// (Until 2026-12-06 09:50 UTC the walks' loops stored their 16 accumulators to the stack every
// line (GCC kept the array in memory: fold's loop was not unrolled), so the figures below ran
// their W FMAs at a store-bound rate: W = 8 ~55 GB/s from L3, as stated. The fold is unrolled
// since (line_work.h, with the zeroing), and the same W now runs faster: compare the rates.)
//
// AMD Zen 4 VM (2 vCPUs, 1 MiB L2 each, 32 MiB L3; 2026-12-06, two threads, medians of 3-5
// rounds, GB/s; the host's DRAM rate moves between runs, compare within a line):
//   page  W  contiguous  n1    n2    n4    n8    n16   n4 pf1  n4 pf2
//   32K   0  32.4        22.3  28.7  30.2  31.3  30.4  25.9    27.6   (another run: 31.2 / 22.0 /
//                        25.9 / 27.9 / 29.1 / 27.7 / 26.0 / 25.8)
//   32K   8  33.6        22.9  27.9  29.9  31.5  30.0  29.7    29.6
//   32K  12  29.8        19.6  24.9  27.1  26.1  24.3  27.7    27.2
//   16K   0  34.4        16.6  22.8  27.3  29.6  30.0  26.9    27.3
//   16K   8  33.6        15.6  21.2  22.0  25.8  23.9  26.4    28.1
//    4K   0  29.4        11.4  15.6  18.5  23.7  23.5  20.1    20.7
//   cached (8 MiB), 32K: W=0 ~135-140, W=8 ~55, W=16 ~27-28 for every mode.
// The decode kernel's orders of a tile (walk_order; 32 KiB pages as 16 tokens x 8 heads x 256
// bytes; later the same day, 15 rounds, two threads, the fraction of that run's contiguous
// read; W = 12 from L3 reads ~36 GB/s, the kernel's bf16 d 128 ~45):
//   W  contiguous  n4    n2 headrows  n2 tokrows  n2 onehead  tile now  tile pv4  tile pvrows
//   0  37.1 GB/s   0.95  0.83         0.71        0.46        0.75      0.64      0.83
//   8  32.6        0.89  0.76         0.68        0.39        0.64      0.58      0.79
//  12  30.2        0.83  0.75         0.67        0.40        0.66      0.64      0.77
// Pages read a head row (4 lines) at a time in turn (headrows: QK over key pairs of two pages)
// keep 0.75-0.83; a token row (32 lines) at a time 0.67-0.71; one head's rows down a page (the
// kernel's one-head step without its software prefetch) ~0.4. The kernel's 8-head steps with no
// prefetch (tile now: K pages one after the other by token rows, then V) and PV's order (tile
// pv4: per 4 tokens, head, 2-line chunk, token) read 0.58-0.66 from demand loads with the
// arithmetic (W = 8, 12), about where the kernel stands with its prefetch; V by head rows as well
// (tile pvrows) 0.77-0.83, but PV's register blocking cannot take that order: a head's accumulators
// of 4 rows x 128 dims are 32 vectors, so PV runs chunk by chunk over a sub-tile of tokens. In the
// kernel (throwaway builds, `kvattn bench`, 3-4 rounds, 2026-12-06 from 06:10 UTC) QK by key pairs
// of two interleaved pages with the 8-head steps ran slower than today's walk, with the prefetch,
// without it, and with the prefetch asked for V's lines only (bf16 15.6-19.9 ms against 14.0-15.1).
// Read one page at a time, shuffled 32 KiB pages come at ~0.68 of the contiguous read and 16 KiB
// at ~0.47, with or without arithmetic; four to eight pages at a time line by line, at 0.77-0.94,
// arithmetic (W = 8) and all, from demand loads alone: the hardware prefetchers follow several
// sequential streams at once and run ahead of a computing reader. The decode kernel the same day
// (`kvattn bench`, two threads): decode_llama3_8b_bf16 0.63-0.66 of the paired DRAM read, d64
// 0.54-0.61, with its paced software prefetch of the next tile; with that prefetch switched off
// (a throwaway build) 0.22 / 0.29, with its 8-head steps (each token's K rows of all heads in
// address order, KVATTN_CPU_LANE_HEAD_STEPS=1) and no prefetch 0.47 / 0.36, with the prefetch
// asked for only the first 16 or 128 lines of each stream 0.35-0.39 / 0.28-0.35: the kernel's
// head-by-head walk of one tile (2 K pages, then 2 V pages) does not give the hardware the
// streams this probe does, and its software prefetch is what carries it. Two throwaway builds
// after the probe's lead, neither kept: the tile's keys taken two pages interleaved (keys 0, 16,
// 1, 17, ...: the demand walk of n2; the plain scores only) ran level (one thread from DRAM,
// `taskset -c 1 kvattn run --op batch_decode --threads 1 --batch-size 16 --num-qo-heads 32
// --num-kv-heads 8 --page-size 16 --kv-len 4096`, four alternations: d 128 13.6-13.8 GB/s either
// way, d 64 14.4-14.8 against 13.7-15.2; two threads, `kvattn bench`, 3 and 4 rounds: 1.10-1.18x
// in the first set, 0.93-1.07x by case in the second); tiles of 64 keys (4 pages of K and of V
// prefetched a tile, `kDecodeTileKeys` 64) ran level (3 rounds: bf16 12.5 / 12.9 ms, d64 6.7 /
// 6.7, long_b1 6.0 / 6.1, d256 27.6 / 27.0, e4m3 8.2 / 8.4).
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

#include "line_work.h"

namespace {

using probe::consume;
using probe::fold;
using probe::zero;

constexpr std::size_t kTotal = std::size_t{1} << 30;
constexpr int kMaxGroup = 16;
char* g_base;
std::size_t g_page;
std::vector<uint32_t> g_order;

// Pages [p0, p1) of the order, n at a time; pf > 0 prefetches the group pf groups on.
template <int W>
float walk(std::size_t p0, std::size_t p1, int n, int pf) {
  __m512 acc[16];
  zero(acc);
  const std::size_t lines = g_page / 64;
  for (std::size_t p = p0; p + n <= p1; p += n) {
    const char* page[kMaxGroup];
    const char* ahead[kMaxGroup];
    for (int s = 0; s < n; ++s) {
      page[s] = g_base + std::size_t{g_order[p + s]} * g_page;
      const std::size_t q = p + s + std::size_t(n) * pf;
      ahead[s] = pf > 0 && q < p1 ? g_base + std::size_t{g_order[q]} * g_page : nullptr;
    }
    for (std::size_t l = 0; l < lines; l += 2) {
      for (int s = 0; s < n; ++s) {
        if (ahead[s]) _mm_prefetch(ahead[s] + 64 * l, _MM_HINT_T0);
        consume<W, 0>(_mm512_load_ps(reinterpret_cast<const float*>(page[s] + 64 * l)), acc);
      }
      for (int s = 0; s < n; ++s) {
        if (ahead[s]) _mm_prefetch(ahead[s] + 64 * (l + 1), _MM_HINT_T0);
        consume<W, 1>(_mm512_load_ps(reinterpret_cast<const float*>(page[s] + 64 * (l + 1))), acc);
      }
    }
  }
  return fold(acc);
}

// The decode kernel's ways of reading a tile, on pages of 16 tokens x 8 heads x 256 bytes (a
// token row of 2 KiB, a head row of 4 lines, two chunks of 2 lines; page_bytes 32768): groups of
// n pages, the first half K, the second V (the tile orders) or all K (the QK orders).
enum class Order {
  kHeadRows,   // per token, per head, each page's head row in turn (QK over key pairs)
  kTokenRows,  // per token, each page's token row in turn (QK by keys, a step of 8 heads)
  kOneHead,    // per head, per page, per token: the head's row (one head a step)
  kTileNow,    // K pages one after the other by token rows, then V: 8-head steps today
  kTilePv4,    // K by head rows; V in PV's order: per 4 tokens, head, chunk, token, page
  kTilePvRows  // K and V both by head rows
};

template <int W>
float walk_order(std::size_t p0, std::size_t p1, int n, Order order) {
  __m512 acc[16];
  zero(acc);
  // Two lines from q: a 512-bit load each, into the two halves of the accumulators.
  auto two = [&acc](const char* q) __attribute__((always_inline)) {
    consume<W, 0>(_mm512_load_ps(reinterpret_cast<const float*>(q)), acc);
    consume<W, 1>(_mm512_load_ps(reinterpret_cast<const float*>(q + 64)), acc);
  };
  constexpr int kTokens = 16, kHeads = 8, kToken = 2048, kHead = 256;
  auto head_rows = [&](const char* const* page, int count) __attribute__((always_inline)) {
    for (int t = 0; t < kTokens; ++t) {
      for (int j = 0; j < kHeads; ++j) {
        for (int s = 0; s < count; ++s) {
          two(page[s] + t * kToken + j * kHead);
          two(page[s] + t * kToken + j * kHead + 128);
        }
      }
    }
  };
  for (std::size_t p = p0; p + n <= p1; p += n) {
    const char* page[kMaxGroup];
    for (int s = 0; s < n; ++s) page[s] = g_base + std::size_t{g_order[p + s]} * g_page;
    const int half = n / 2;
    switch (order) {
      case Order::kHeadRows:
        head_rows(page, n);
        break;
      case Order::kTokenRows:
        for (int t = 0; t < kTokens; ++t) {
          for (int s = 0; s < n; ++s) {
            for (int l = 0; l < kToken; l += 128) two(page[s] + t * kToken + l);
          }
        }
        break;
      case Order::kOneHead:
        for (int j = 0; j < kHeads; ++j) {
          for (int s = 0; s < n; ++s) {
            for (int t = 0; t < kTokens; ++t) {
              two(page[s] + t * kToken + j * kHead);
              two(page[s] + t * kToken + j * kHead + 128);
            }
          }
        }
        break;
      case Order::kTileNow:
        for (int s = 0; s < n; ++s) {
          for (std::size_t l = 0; l < g_page; l += 128) two(page[s] + l);
        }
        break;
      case Order::kTilePv4:
        head_rows(page, half);
        for (int t0 = 0; t0 < kTokens; t0 += 4) {
          for (int j = 0; j < kHeads; ++j) {
            for (int c = 0; c < 2; ++c) {
              for (int t = t0; t < t0 + 4; ++t) {
                for (int s = half; s < n; ++s) two(page[s] + t * kToken + j * kHead + 128 * c);
              }
            }
          }
        }
        break;
      case Order::kTilePvRows:
        head_rows(page, half);
        head_rows(page + half, n - half);
        break;
    }
  }
  return fold(acc);
}

float walk_w(int w, std::size_t p0, std::size_t p1, int n, int pf, const Order* order) {
  switch (w) {
    case 0:
      return order ? walk_order<0>(p0, p1, n, *order) : walk<0>(p0, p1, n, pf);
    case 4:
      return order ? walk_order<4>(p0, p1, n, *order) : walk<4>(p0, p1, n, pf);
    case 8:
      return order ? walk_order<8>(p0, p1, n, *order) : walk<8>(p0, p1, n, pf);
    case 12:
      return order ? walk_order<12>(p0, p1, n, *order) : walk<12>(p0, p1, n, pf);
    default:
      return order ? walk_order<16>(p0, p1, n, *order) : walk<16>(p0, p1, n, pf);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  g_page = argc > 2 ? std::atol(argv[2]) : 32768;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  const int work = argc > 4 ? std::atoi(argv[4]) : 0;
  const bool cached = argc > 5 && std::atoi(argv[5]) != 0;
  if (g_page < 128 || g_page % 128 != 0 || kTotal % g_page != 0) {
    std::fprintf(stderr, "page_bytes=%zu: must be a multiple of 128 that divides 1 GiB\n", g_page);
    return 2;
  }
  const std::size_t pages = kTotal / g_page;
  g_base = static_cast<char*>(std::aligned_alloc(std::size_t{2} << 20, kTotal));
  madvise(g_base, kTotal, MADV_HUGEPAGE);
  std::memset(g_base, 1, kTotal);
  std::vector<uint32_t> address_order(pages), shuffled;
  std::iota(address_order.begin(), address_order.end(), 0);
  shuffled = address_order;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(1));
  struct Mode {
    const char* name;
    bool contiguous;
    int n, pf;
    bool ordered = false;  // a decode-kernel order (walk_order), pages of 32 KiB only
    Order order = Order::kHeadRows;
  };
  const Mode modes[] = {{"contiguous", true, 1, 0},
                        {"n1", false, 1, 0},
                        {"n2", false, 2, 0},
                        {"n4", false, 4, 0},
                        {"n8", false, 8, 0},
                        {"n16", false, 16, 0},
                        {"n4 pf1", false, 4, 1},
                        {"n4 pf2", false, 4, 2},
                        {"n2 headrows", false, 2, 0, true, Order::kHeadRows},
                        {"n2 tokrows", false, 2, 0, true, Order::kTokenRows},
                        {"n2 onehead", false, 2, 0, true, Order::kOneHead},
                        {"tile now", false, 4, 0, true, Order::kTileNow},
                        {"tile pv4", false, 4, 0, true, Order::kTilePv4},
                        {"tile pvrows", false, 4, 0, true, Order::kTilePvRows}};
  constexpr int kModes = sizeof(modes) / sizeof(modes[0]);
  std::vector<double> gbps[kModes];
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int m = 0; m < kModes; ++m) {
      if (modes[m].ordered && g_page != 32768) continue;
      g_order = modes[m].contiguous ? address_order : shuffled;
      if (cached) {
        for (auto& o : g_order) o %= (std::size_t{8} << 20) / g_page;
      }
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> team;
      std::vector<float> out(threads);
      for (int t = 0; t < threads; ++t) {
        team.emplace_back([&, t] {
          out[t] = walk_w(work, pages * t / threads, pages * (t + 1) / threads, modes[m].n,
                          modes[m].pf, modes[m].ordered ? &modes[m].order : nullptr);
        });
      }
      for (auto& t : team) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (float o : out) sink = sink + o;
      gbps[m].push_back(kTotal / s / 1e9);
    }
  }
  std::printf("%d threads, pages of %zu bytes, W = %d%s\n", threads, g_page, work,
              cached ? ", cached (8 MiB)" : "");
  for (int m = 0; m < kModes; ++m) {
    if (gbps[m].empty()) continue;
    std::sort(gbps[m].begin(), gbps[m].end());
    std::printf("  %-12s %6.1f GB/s (%.1f-%.1f)\n", modes[m].name, gbps[m][gbps[m].size() / 2],
                gbps[m].front(), gbps[m].back());
  }
  return 0;
}
