// Whether this CPU overlaps a decode's arithmetic with its DRAM reads (issue 23, Zen 4 note of
// 2026-12-03): a model of the decode kernel's memory walk (decode_kernel.h) with a chosen amount
// of arithmetic per 64-byte line, timed from DRAM and from L2, so that the two can be compared
// with the sum and the max of their times.
//
// The walk: per thread, tiles of 32 tokens (two pages of 16) of an NHD cache of 8 KV heads x 256
// bytes a token (d 128 bf16), K and V pages apart, the pages shuffled over 1 GiB on huge pages;
// per tile and head the 32 K rows, then the 32 V rows, each row's 4 lines loaded (two 256-bit
// loads a line) and given W FMAs a line on 8 independent accumulators. The next tile's 4 pages
// are prefetched (prefetcht0) 4 lines per row visited, spread over the tile as the kernel's
// TilePrefetcher does, either in address order (line j of each page in turn: the kernel's order)
// or in the order the next tile will read them (head by head).
//
// Not part of the build (a one-off measurement, every CPU class with AVX2 + FMA):
//   g++ -O2 -mavx2 -mfma -std=c++20 -pthread bench/probes/decode_overlap.cc -o /tmp/decode_overlap
//   /tmp/decode_overlap [rounds=5] [threads=2]
// -DPF_HINT=_MM_HINT_T1 (or _MM_HINT_NTA) asks for the next tile's lines with that hint instead of
// prefetcht0. -DTILE_KEYS=16|64 walks tiles of 16 or 64 tokens instead (2 or 8 pages a tile, as
// many prefetch streams). -DROW_BYTES=128|512 sets a head's row (d 64 / d 256 bf16, or d 128 e4m3
// at 128; the pages keep 16 tokens of 8 heads), -DVISIT_HEADS=2|4 reads that many adjacent heads'
// rows at each visit of the kernel-order walk ("dram", "compute"; at most 512 bytes a visit).
// Prints, per W, the median GB/s over the rounds of: the walk over 16 pages that stay in L2
// ("compute"), from DRAM with the address-order prefetch ("dram"), from DRAM with the
// read-order prefetch ("dram, read order"), and the sum model 1 / (1/compute + 1/dram at W=0):
// a "dram" figure near min(compute, dram at W=0) means the core overlaps, near the sum model
// that it does not; then the token-major walk with and without the prefetch and the contiguous
// read, then the prefetch stream alone, the copied walk and the near prefetch (the Prefetch
// modes below). The variants alternate within each round.
//
// Zen 4 VM (2 vCPUs, 2026-12-03, three runs of `decode_overlap 5|9|9 2`, GB/s):
//   W=0   compute 64.0-65.8  dram 20.0-24.4  read order 13.4-14.4
//   W=8   compute 36.5-46.6  dram 18.8-25.7  read order 11.5-13.5  sum model 14.0-15.7
//   W=16  compute 24.7-34.3  dram 19.3-27.4  read order 10.4-14.3  sum model 12.3-12.6
// The core overlaps: at W=16 (compute alone near the DRAM rate) the walk from DRAM keeps the
// DRAM rate of W=0 where the sum model would halve it; the prefetch in read order costs ~0.55x.
// (An earlier model that kept its accumulators in a stack array, indexed at run time, spent its
// time in store forwarding and seemed to show the opposite.) The decode kernel itself, same VM
// and day: decode_llama3_8b_bf16 16.4-19.6 GB/s, 0.87-0.93 of its paged-read ceiling.
//
// Same VM, the next session (2026-12-03 from 16:15 UTC; nine runs of 5-9 rounds, GB/s):
//   contiguous   W=0 31.7-51.5 (the host's DRAM rate moved that much between runs),
//                W=8 19.3-22.5, W=16 11.4-12.7: read without a software prefetch, the arithmetic
//                between the loads does not overlap the misses (below the sum model), so no
//                decode reaches the contiguous read by the hardware prefetchers alone
//   token-major / dram (the kernel's head-major walk), same round: W=0 1.09-1.27,
//                W=8 0.99-1.31, W=16 1.04-1.18: reading each page in address order while the
//                next tile is prefetched gains 0-30 %; without the prefetch it reads at
//                0.64-1.05 of the head-major walk's rate (W=8-16)
//   the walks with the prefetch (dram, token-major) at W=8-16: 19.5-34.3, 0.47-1.02 of the
//                same run's contiguous W=0 read
//
// Same VM, 2026-12-04 (`decode_overlap 3 2`, built with TILE_KEYS 16, 32 and 64, two rounds each,
// alternated): the prefetched walk ("dram") 18.0-24.3 at W=0 and 20.4-29.6 at W=8 for every tile
// size (contiguous W=0 27.9-48.7): the number of streams a tile is not what limits the walk.
// The same day, the modes added after it (`decode_overlap 3 2`, four runs, GB/s at W = 0 / 8):
//   dram 19.8-26.8 / 22.5-29.6; prefetch only 38.4-54.7 / 34.5-55.4; copy 16.1-22.1 /
//   18.1-23.4 (cached 41.6-44.0 / 36.7-45.4); near 22.7-22.8 / 25.3-29.3. The next tile's
//   prefetch stream alone reads 1.5-2x what it reads while the walk takes its rows back from L2
//   (by demand, by a near prefetch or by a copy alike). Either those L2 -> L1 fills hold the
//   miss buffers the DRAM stream needs, or prefetches dropped when the buffers are full cost
//   nothing when no load reads their lines; without counters the probe cannot tell which.
//   Then kSubTile (`-DSUB_KEYS=4|8|16 -DSUB_AHEAD=1|2`, two runs each): 16.5-26.6 GB/s at W = 0
//   and 17.0-25.9 at W = 8, the "dram" walk of the same runs 17.2-27.6 / 18.5-26.1: with its
//   rows in L1 the walk reads no faster, so the fills from L2 are not what holds it, and the
//   prefetch stream's own figure is most simply prefetches dropped at no cost. Every walk here
//   that reads its lines runs at 16-30 GB/s on this VM; only the contiguous read exceeds it.
//
// Same VM, 2026-12-04 from 03:18 UTC (`decode_overlap 5 2`, three runs of each build alternated,
// medians GB/s at W = 0 / 8 / 16): the kernel-order walk ("dram") over 128-byte rows 17.8-19.8
// / 18.9-19.9 / 20.7-21.8, the same rows two heads a visit (VISIT_HEADS=2) 20.2-21.2 / 21.2-23.6
// / 21.8-22.4, 256-byte rows 21.7-23.0 / 24.0-24.5 / 25.5-26.9: a visit of 128 bytes reads the
// same bytes ~20 % slower than one of 256, and two heads a visit win back about half of it.
// Tiles of 64 keys at 128-byte rows did not help (17.3-20.2 / 17.7-19.0 / 17.9-20.9). This is
// what the decode kernel's steps of several heads (decode_dot_tiles.h, kStepHeads) act on.
//
// AMD Zen 5 VM (2 vCPUs, 2026-12-04 from 20:00 UTC, `decode_overlap 3 2`, one run built with each
// hint, GB/s, T1 / T0): W=0 compute 91.1 / 118.7, dram 32.8 / 33.9, contiguous 46.2 / 45.6;
// W=8 compute 84.9 / 86.3, dram 33.9 / 33.6, token-major 37.5 / 36.5; W=16 compute 48.1 / 48.6,
// dram 36.7 / 39.6, token-major 40.1 / 38.0, contiguous 17.6 / 17.5. Zen 5 overlaps as Zen 4
// does (at W=16 the walk from DRAM keeps ~0.8 of the compute rate, the sum model would give
// 0.4), and the walk's hint does not matter in this model.
// The same VM, 2026-12-04 from 22:20 UTC (`decode_overlap 5 1` and `5 2`, one run each, GB/s at
// W = 0 / 8 / 16): one thread, dram 19.4 / 19.9 / 21.5, token-major 27.3 / 29.5 / 23.4, sub-tiles
// 28.0 / 31.9 / 22.6, contiguous 34.8 / 15.9 / 9.0; two threads, dram 32.9 / 34.5 / 38.5,
// token-major 37.0 / 36.0 / 38.3, sub-tiles 33.9 / 36.2 / 39.1, contiguous 44.4 / 31.3 / 17.8.
// One core reads the head-major walk 1.4-1.6x slower than an address-order walk; with both
// reading, the orders come within ~10 %. The decode kernel, same session, one thread from DRAM:
// 16.5-17.5 GB/s, and 15.4-16.1 with its products taken out (README, issue 23's third Zen 5
// pass): like this walk at W = 0, it is bound by the walk, not by its arithmetic.
//
// AMD Zen 3 VM (2 vCPUs, family 25 model 1, 2026-12-07 from 02:20 UTC, `decode_overlap 5 2`, one
// run built with each hint, GB/s, T1 / T0): W=0 compute 45.9 / 46.6, dram 23.4 / 20.9,
// contiguous 28.1 / 23.8; W=8 compute 35.7 / 34.2, dram 24.6 / 22.0, token-major 32.1 / 22.3;
// W=16 compute 26.7 / 26.7, dram 19.9 / 20.4 (sum model 12.5 / 11.7), token-major 23.8 / 26.0,
// contiguous 10.7 / 10.6. Zen 3 overlaps as Zen 4 and Zen 5 do: at W=16 (the decode's own FMAs a
// line at group 4) the walk from DRAM keeps ~0.75 of its compute rate where the sum model gives
// 0.47. The decode kernel, same session, two threads: cache-resident (B 4 x 256 keys, 4 MiB)
// ~20.8 GB/s, from DRAM (decode_llama3_8b_bf16) 13.5 GB/s, 0.70 of its paged-read ceiling (19.3)
// and 0.52 of the paired read (24.6): its arithmetic runs slower than this walk's at W=16 and
// overlaps the DRAM reads less (0.70 of min(compute, paged read), the walk 0.85).
//
// Zen 4 VM again, 2026-12-08 from 01:29 UTC (`decode_overlap 5 2` four times, the last three each
// followed by `kvattn bench --filter '^decode_(llama3_8b_bf16|d64_bf16)$'`, GB/s at W = 0 / 8 /
// 16): dram 21.5-31.2 / 29.3-31.5 / 28.6-36.3, read order 15.6-17.0 / 15.2-17.6 / 16.6-17.7;
// the kernel (decode_llama3_8b_bf16) 23.2-24.5, 0.75-0.83 of the walk at W = 8-16. A throwaway
// variant of this walk with its FMAs taking the loaded line, and with a dependent chain between
// each head's K and V rows that the V FMAs wait on (a softmax's place), read level with the
// independent FMAs within the runs' noise (README, block "Zen 4, 2026-12-08").
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

#ifndef TILE_KEYS
#define TILE_KEYS 32
#endif
#ifndef ROW_BYTES
#define ROW_BYTES 256
#endif
constexpr std::size_t kRow = ROW_BYTES, kHeads = 8, kTokens = 16, kTileKeys = TILE_KEYS;
static_assert(kRow == 128 || kRow == 256 || kRow == 512);
constexpr std::size_t kPage = kTokens * kHeads * kRow;  // 32 KiB at 256-byte rows
constexpr std::size_t kP = 2 * kTileKeys / kTokens;
constexpr std::size_t kTileLines = kP * kPage / 64;  // K and V pages of kP / 2 page slots
constexpr int kLinesPerVisit = kRow / 64;            // kTileLines / (heads x (K + V) x keys)
static_assert(kTileLines == kLinesPerVisit * kHeads * 2 * kTileKeys);

// How a tile is read (all but kContiguous over the shuffled pages):
//   kAddressOrder  per head, its K rows then its V rows (the kernel's order); the next
//                  tile prefetched in address order (the kernel's TilePrefetcher)
//   kReadOrder     the same walk; the next tile prefetched in the order it will be read
//   kTokenMajor    K then V, per key all heads' rows in turn (each page in address order); the
//                  next tile prefetched in address order
//   kTokenMajorNoPf  the same walk, no software prefetch (the hardware prefetchers alone)
//   kContiguous    the same bytes as a tile, one run of kP consecutive pages, no prefetch: the
//                  contiguous DRAM read with the same arithmetic per line
//   kPrefetchOnly  kAddressOrder's prefetch of the next tile, the walk's loads from a 4 KiB
//                  buffer that stays in L1 (the prefetch stream without the tile's fills)
//   kCopy          each tile copied into a head-major scratch in address order, then the
//                  head-major walk over the scratch; the next tile prefetched as kAddressOrder
//   kNear          kAddressOrder plus, at each row, the same row of the next head step
//                  prefetched into L1 (4 lines)
//   kSubTile       the head-major walk over sub-tiles of SUB_KEYS tokens (default 4: 16 KiB of
//                  all heads), the sub-tile SUB_AHEAD (default 1) ahead prefetched in address
//                  order (K and V in turn): the rows read from L1, the DRAM reads still in
//                  address order
enum class Prefetch {
  kAddressOrder,
  kReadOrder,
  kTokenMajor,
  kTokenMajorNoPf,
  kContiguous,
  kPrefetchOnly,
  kCopy,
  kNear,
  kSubTile
};
#ifndef VISIT_HEADS
#define VISIT_HEADS 1
#endif
static_assert(kHeads % VISIT_HEADS == 0 && VISIT_HEADS * kRow <= 512);
#ifndef SUB_KEYS
#define SUB_KEYS 4
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif
#ifndef SUB_AHEAD
#define SUB_AHEAD 1
#endif
alignas(64) thread_local char g_scratch[kTileLines * 64];
alignas(64) char g_l1[16 * kRow];

// Line offsets (page slot, bytes) of a tile in the order the walk reads them.
struct ReadOrder {
  uint8_t page[kTileLines];
  uint32_t offset[kTileLines];
  ReadOrder() {
    std::size_t i = 0;
    for (std::size_t h = 0; h < kHeads; ++h) {
      for (int kv = 0; kv < 2; ++kv) {
        for (std::size_t k = 0; k < kTileKeys; ++k) {
          for (int l = 0; l < kLinesPerVisit; ++l, ++i) {
            page[i] = static_cast<uint8_t>(kv * (kP / 2) + k / kTokens);
            offset[i] = static_cast<uint32_t>((k % kTokens) * kHeads * kRow + h * kRow + 64 * l);
          }
        }
      }
    }
  }
};
const ReadOrder kReadOrder;

// One 64-byte line: two 256-bit loads added into the accumulators, then W FMAs.
template <int W>
inline void consume(const char* line, int l, __m256* acc) {
  const __m256 x = _mm256_loadu_ps(reinterpret_cast<const float*>(line));
  const __m256 y = _mm256_loadu_ps(reinterpret_cast<const float*>(line + 32));
  acc[l] = _mm256_add_ps(acc[l], x);
  acc[l + 4] = _mm256_add_ps(acc[l + 4], y);
#pragma GCC unroll 32
  for (int w = 0; w < W; ++w) acc[(l + w + 1) % 8] = _mm256_fmadd_ps(x, y, acc[(l + w + 1) % 8]);
}

// Where token k's rows of all heads start in a tile's pages: K (kv 0) or V (kv 1).
inline const char* token(const char* const* pages, int kv, std::size_t k) {
  return pages[kv * (kP / 2) + k / kTokens] + (k % kTokens) * kHeads * kRow;
}

template <int W>
float walk(const char* buf, const uint32_t* pages, std::size_t tiles, Prefetch order) {
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (std::size_t t = 0; t < tiles; ++t) {
    const char* page[kP];
    const char* next[kP];
    for (std::size_t i = 0; i < kP; ++i) {
      page[i] = buf + std::size_t{pages[kP * t + i]} * kPage;
      next[i] = t + 1 < tiles ? buf + std::size_t{pages[kP * (t + 1) + i]} * kPage : nullptr;
    }
    std::size_t issued = next[0] ? 0 : kTileLines;
    auto prefetch = [&](std::size_t n) {
      for (; n > 0 && issued < kTileLines; --n, ++issued) {
        const char* line = order != Prefetch::kReadOrder
                               ? next[issued % kP] + (issued / kP) * 64
                               : next[kReadOrder.page[issued]] + kReadOrder.offset[issued];
        _mm_prefetch(line, PF_HINT);
      }
    };
    if (order == Prefetch::kContiguous) {
      const char* base = buf + std::size_t{pages[kP * t]} * kPage;  // pages kP t .. kP t + kP - 1
      for (std::size_t i = 0; i < kTileLines; ++i) consume<W>(base + 64 * i, i % 4, acc);
      continue;
    }
    if (order == Prefetch::kSubTile) {
      constexpr std::size_t G = SUB_KEYS, kSubs = kTileKeys / G;
      static_assert(kTileKeys % G == 0 && SUB_AHEAD >= 1 && SUB_AHEAD <= kSubs);
      constexpr std::size_t kTokLines = kHeads * kRow / 64;  // a token's K (or V) lines
      constexpr std::size_t kSubLines = 2 * G * kTokLines;
      for (std::size_t s = 0; s < kSubs; ++s) {
        std::size_t s2 = s + SUB_AHEAD;
        const char* const* pg = page;
        if (s2 >= kSubs) {
          s2 -= kSubs;
          pg = next;
        }
        std::size_t done = pg[0] ? 0 : kSubLines;
        auto pf = [&](std::size_t n) {
          for (; n > 0 && done < kSubLines; --n, ++done) {
            const std::size_t kv = done % 2, j = done / 2;
            const std::size_t tok = s2 * G + j / kTokLines;
            _mm_prefetch(token(pg, kv, tok) + (j % kTokLines) * 64, PF_HINT);
          }
        };
        for (std::size_t h = 0; h < kHeads; ++h) {
          for (int kv = 0; kv < 2; ++kv) {
            for (std::size_t k = s * G; k < s * G + G; ++k) {
              pf(kLinesPerVisit);
              const char* row = token(page, kv, k) + h * kRow;
#pragma GCC unroll 8
              for (int l = 0; l < kLinesPerVisit; ++l) consume<W>(row + 64 * l, l % 4, acc);
            }
          }
        }
        pf(kSubLines);
      }
      continue;
    }
    if (order == Prefetch::kCopy) {
      // The tile copied head-major into scratch in address order (token-major), then the
      // head-major walk over the scratch, the next tile prefetched through the walk.
      for (int kv = 0; kv < 2; ++kv) {
        for (std::size_t k = 0; k < kTileKeys; ++k) {
          const char* tok = token(page, kv, k);
          for (std::size_t h = 0; h < kHeads; ++h) {
            char* dst = g_scratch + ((h * 2 + kv) * kTileKeys + k) * kRow;
            const __m256* srcv = reinterpret_cast<const __m256*>(tok + h * kRow);
            __m256* dstv = reinterpret_cast<__m256*>(dst);
#pragma GCC unroll 16
            for (std::size_t i = 0; i < kRow / 32; ++i) {
              _mm256_store_ps(reinterpret_cast<float*>(dstv + i),
                              _mm256_loadu_ps(reinterpret_cast<const float*>(srcv + i)));
            }
          }
        }
      }
      for (std::size_t h = 0; h < kHeads; ++h) {
        for (int kv = 0; kv < 2; ++kv) {
          for (std::size_t k = 0; k < kTileKeys; ++k) {
            prefetch(kLinesPerVisit);
            const char* row = g_scratch + ((h * 2 + kv) * kTileKeys + k) * kRow;
#pragma GCC unroll 8
            for (int l = 0; l < kLinesPerVisit; ++l) consume<W>(row + 64 * l, l % 4, acc);
          }
        }
      }
      prefetch(kTileLines);
      continue;
    }
    if (order == Prefetch::kTokenMajor || order == Prefetch::kTokenMajorNoPf) {
      if (order == Prefetch::kTokenMajorNoPf) issued = kTileLines;
      for (int kv = 0; kv < 2; ++kv) {
        for (std::size_t k = 0; k < kTileKeys; ++k) {
          for (std::size_t h = 0; h < kHeads; ++h) {
            prefetch(kLinesPerVisit);
            const char* row = token(page, kv, k) + h * kRow;
#pragma GCC unroll 8
            for (int l = 0; l < kLinesPerVisit; ++l) consume<W>(row + 64 * l, l % 4, acc);
          }
        }
      }
      continue;
    }
    // VISIT_HEADS adjacent heads' rows read at each visit (one head step of VISIT_HEADS heads).
    for (std::size_t h = 0; h < kHeads; h += VISIT_HEADS) {
      for (int kv = 0; kv < 2; ++kv) {
        for (std::size_t k = 0; k < kTileKeys; ++k) {
          prefetch(kLinesPerVisit * VISIT_HEADS);
          const char* row = order == Prefetch::kPrefetchOnly ? g_l1 + (k % 16) * kRow
                                                             : token(page, kv, k) + h * kRow;
          if (order == Prefetch::kNear && h + 1 < kHeads) {
            // The same row of the next head step, from L2 into L1.
            for (int l = 0; l < kLinesPerVisit; ++l) _mm_prefetch(row + kRow + 64 * l, _MM_HINT_T0);
          }
#pragma GCC unroll 8
          for (int l = 0; l < kLinesPerVisit * VISIT_HEADS; ++l) {
            consume<W>(row + 64 * l, l % 4, acc);
          }
        }
      }
    }
    prefetch(kTileLines);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  return lanes[0];
}

float walk_w(int w, const char* buf, const uint32_t* pages, std::size_t tiles, Prefetch order) {
  switch (w) {
    case 0:
      return walk<0>(buf, pages, tiles, order);
    case 8:
      return walk<8>(buf, pages, tiles, order);
    default:
      return walk<16>(buf, pages, tiles, order);
  }
}

// GB/s of one walk by `threads` threads over their shares of `pages` (kP a tile).
double run(int w, const char* buf, const std::vector<uint32_t>& pages, int threads,
           Prefetch order) {
  const std::size_t tiles = pages.size() / kP / threads;
  std::vector<std::thread> pool;
  std::vector<float> sinks(threads);
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(
        [&, t] { sinks[t] = walk_w(w, buf, pages.data() + kP * tiles * t, tiles, order); });
  }
  for (std::thread& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sinks[0] == 42.0f) std::printf(" ");  // the sums are used, so the loads stay
  return static_cast<double>(tiles * threads * kP * kPage) / s / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const int threads = argc > 2 ? std::max(1, std::atoi(argv[2])) : 2;
  const std::size_t bytes = std::size_t{1} << 30;
  auto* buf = static_cast<char*>(std::aligned_alloc(2 << 20, bytes));
  madvise(buf, bytes, MADV_HUGEPAGE);
  std::memset(buf, 1, bytes);
  std::vector<uint32_t> dram(bytes / kPage);
  std::iota(dram.begin(), dram.end(), 0u);
  std::shuffle(dram.begin(), dram.end(), std::mt19937(1));
  std::vector<uint32_t> in_order(dram.size());
  std::iota(in_order.begin(), in_order.end(), 0u);
  // The same number of tiles over 16 distinct pages per thread: 512 KiB, resident in L2.
  std::vector<uint32_t> cached(dram.size());
  const std::size_t share = dram.size() / threads;
  for (std::size_t i = 0; i < cached.size(); ++i) cached[i] = dram[(i / share) * share + i % 16];
  std::printf("%d threads, %d rounds, GB/s (median)\n", threads, rounds);
  double dram_w0 = 0;
  for (const int w : {0, 8, 16}) {
    // Each variant: the pages it walks and how; m[v] its median over the rounds.
    const struct {
      const std::vector<uint32_t>* pages;
      Prefetch order;
    } variants[] = {
        {&cached, Prefetch::kAddressOrder}, {&dram, Prefetch::kAddressOrder},
        {&dram, Prefetch::kReadOrder},      {&dram, Prefetch::kTokenMajor},
        {&dram, Prefetch::kTokenMajorNoPf}, {&in_order, Prefetch::kContiguous},
        {&dram, Prefetch::kPrefetchOnly},   {&dram, Prefetch::kCopy},
        {&cached, Prefetch::kCopy},         {&dram, Prefetch::kNear},
        {&cached, Prefetch::kNear},         {&dram, Prefetch::kSubTile},
        {&cached, Prefetch::kSubTile},
    };
    constexpr int kVariants = sizeof(variants) / sizeof(variants[0]);
    std::vector<double> gbps[kVariants];
    for (int i = 0; i < rounds; ++i) {
      for (int v = 0; v < kVariants; ++v) {
        gbps[v].push_back(run(w, buf, *variants[v].pages, threads, variants[v].order));
      }
    }
    double m[kVariants];
    for (int v = 0; v < kVariants; ++v) m[v] = median(gbps[v]);
    if (w == 0) dram_w0 = m[1];
    std::printf("W=%2d  compute %6.1f  dram %6.1f  dram, read order %6.1f  sum model %6.1f\n", w,
                m[0], m[1], m[2], 1.0 / (1.0 / m[0] + 1.0 / dram_w0));
    std::printf("      token-major %6.1f  token-major, no prefetch %6.1f  contiguous %6.1f\n", m[3],
                m[4], m[5]);
    std::printf("      prefetch only %6.1f  copy %6.1f  copy, cached %6.1f\n", m[6], m[7], m[8]);
    std::printf("      near %6.1f  near, cached %6.1f\n", m[9], m[10]);
    std::printf("      sub-tiles %6.1f  sub-tiles, cached %6.1f\n", m[11], m[12]);
  }
  std::free(buf);
  return 0;
}
