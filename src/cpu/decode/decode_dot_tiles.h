// The bf16 dot-product QK and PV tiles of the decode kernel (decode_kernel.h), over any way of
// turning a 64-value chunk of a K/V row into bf16 words (a Loader): the FP8 table widening
// (decode_fp8_table.h) and plain bf16 rows (decode_bf16_dot_avx512bf16.cc). Include
// only from files compiled with the AVX512_BF16 flags.
//
// vdpbf16ps does two products per f32 lane: QK pairs adjacent words of q and K (q stored once
// per task in the Loader's word order), PV pairs two keys' probabilities with the same word of
// their V rows (16-bit unpacks of the two rows). The probabilities are rounded to bf16, the
// queries' type, as the baseline rule allows (testing/baseline.h; the bf16 prefill kernel does
// the same); q and K/V are exact in bf16, the sums f32. The unpacks work inside 128-bit lanes, so
// the output accumulators come out permuted (Loader::pv_lane) and are put back in order once per
// task (finish_o). NaN and inf in K/V propagate through the products as the reference's do, so
// no scan is needed; the kernels are used without a custom mask only (a masked key's zero
// probability times a NaN V would otherwise reach the output).
//
// A Loader:
//   Loader()                               once per tile (e.g. the table registers)
//   kChunkBytes                            bytes of a 64-value chunk of a row
//   operator()(chunk, &w0, &w1)            the chunk as 64 bf16 words, w0 first
//   kMayHoldInf                            whether its words can be +-inf (bf16, e5m2)
//   pairs(chunk_a, chunk_b, v[4])          the chunks of two keys as bf16 pairs (a, b) of the
//                                          same value: 16-bit unpacks of their words, or what
//                                          gives the same order for less
//   static constexpr int word(int v)       where value v of a chunk sits among the 64 words
//   static constexpr int pv_lane(int v)    where output dim v of a chunk sits among the 64 f32
//                                          accumulators of the PV tile
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/numeric.h"
#include "cpu/common/bf16_split.h"
#include "cpu/common/simd_avx512.h"
#include "cpu/decode/decode_kernel.h"

namespace kvattn::cpu::decode_detail {
// Internal linkage, as simd_avx512.h: each including file has its own ISA flags.
namespace {

// QK of one tile: per key, each 64-value chunk of the K row is loaded as bf16 words (Loader),
// turned into the policy's Chunk once and accumulated into every query row of the block
// (Tiles::accumulate, two partial sums per row); 16 keys' sums are reduced together. Of kHeads
// heads per key (a head step, DotTiles::qk_step): head j's queries at q + j * q_head (floats), its
// K rows at rows[kk] + j * head_step (bytes), its scores j * group_padded rows on.
template <class Loader, int kChunks, int kNG, class Tiles, int kHeads = 1>
void qk_chunks(const float* q, int q_row, int group_padded, const std::byte* const* rows, int n,
               float* scores, TilePrefetcher* prefetch, int q_head = 0, int64_t head_step = 0) {
  const Loader load;
  for (int g0 = 0; g0 < group_padded; g0 += kNG) {
    for (int kb = 0; kb < n; kb += 16) {
      __m512 parts[kHeads][kNG][16];
      const int count = std::min(16, n - kb);
      for (int kk = 0; kk < count; ++kk) {
        for (int j = 0; j < kHeads; ++j) {
          prefetch->tick();
          const auto* row = reinterpret_cast<const uint8_t*>(rows[kb + kk]) + j * head_step;
          const float* qj = q + j * q_head;
          __m512 acc0[kNG], acc1[kNG];
          for (int g = 0; g < kNG; ++g) acc0[g] = acc1[g] = _mm512_setzero_ps();
          for (int c = 0; c < kChunks; ++c) {
            __m512i w0, w1;
            load(row + c * Loader::kChunkBytes, &w0, &w1);
            const typename Tiles::Chunk k = Tiles::chunk(w0, w1);
            for (int g = 0; g < kNG; ++g) {
              Tiles::accumulate(k, qj + (g0 + g) * q_row, c, &acc0[g], &acc1[g]);
            }
          }
          for (int g = 0; g < kNG; ++g) parts[j][g][kk] = _mm512_add_ps(acc0[g], acc1[g]);
        }
      }
      for (int j = 0; j < kHeads; ++j) {
        for (int g = 0; g < kNG; ++g) {
          for (int kk = count; kk < 16; ++kk) parts[j][g][kk] = _mm512_setzero_ps();
          _mm512_storeu_ps(scores + (j * group_padded + g0 + g) * kTile + kb,
                           avx512::Simd::reduce_rows(parts[j][g]));
        }
      }
    }
  }
}

// Whether `place` (of a chunk's 64 values) keeps each run of N values, starting at a multiple of
// N, together and in order.
template <int N, class Place>
constexpr bool runs_of(Place place) {
  for (int v = 0; v < 64; ++v) {
    if (place(v) != place(v - v % N) + v % N) return false;
  }
  return true;
}

template <class Loader, int kD, int kNG>
struct DotTiles {
  static_assert(kD % 64 == 0);
  static constexpr int kChunks = kD / 64;
  static constexpr float kKRaw = 1.0f;
  static constexpr float kVRaw = 1.0f;
  static constexpr bool kPoisonE4m3Nans = false;

  // QK with the 4 query rows of a block in the lanes (qk_query_lanes), for every Loader, at
  // blocks of 4 rows. At head dim 256 its 64 query vectors are loaded per key (they no longer
  // stay in registers); it still ran ~3 % faster than qk_chunks there on Zen 4 for bf16, where
  // the earlier broadcast form (bf16 rows only) ran ~3 % slower.
  static constexpr bool kQueryLanes = kNG == 4;
  // Whether one head a step keeps a block's query vectors in registers (query lanes over rows of
  // one or two chunks: 16 vectors at d 128): then the steps of several heads, which reload them
  // from L1 per key and head, are the CPU class's choice (CpuFeatures::decode_lane_head_steps:
  // not on Zen 3 / Zen 4). At d 256 they are reloaded either way, and the steps stay: one Zen 4
  // thread from DRAM read 13.3-13.9 GB/s with them, 11.3-11.9 one head a step.
  static constexpr bool kLaneQueriesInRegisters = kQueryLanes && kChunks <= 2;

  // The value of a chunk at word 8 * run (the first of a run of 8 words).
  static constexpr int first_value(int run) {
    for (int v = 0; v < 64; v += 8) {
      if (Loader::word(v) == 8 * run) return v;
    }
    return -1;
  }

  // Each query row in f32 -> bf16 (q is bf16 here: exact), in the Loader's word order, written
  // over the start of the row; for kQueryLanes, each block of 4 rows as qk_query_lanes reads it,
  // written over the block's first rows. The rows are rounded in order (a loop the compiler
  // vectorizes) and then moved in runs of 8 words, which both orders keep together.
  static void prepare_q(float* q, int rows, int q_row, int dqk) {
    static_assert(runs_of<8>([](int v) { return Loader::word(v); }));
    static_assert([] {
      for (int run = 0; run < 8; ++run) {
        if (first_value(run) < 0) return false;
      }
      return true;
    }());
    alignas(64) uint16_t bf16[4][kD];
    auto round_row = [&](const float* row, uint16_t* out) {
      for (int d = 0; d < dqk; ++d) out[d] = num::f32_to_bf16(row[d]);
    };
    if constexpr (kQueryLanes) {
      for (int g0 = 0; g0 < rows; g0 += 4) {
        float* block = q + g0 * q_row;
        for (int g = 0; g < 4; ++g) round_row(block + g * q_row, bf16[g]);
        auto* words = reinterpret_cast<uint16_t*>(block);
        // K vector 2c + h is words [32h, 32h + 32) of chunk c; its lane L holds words
        // 32h + 8L .. + 8, i.e. values first_value(4h + L) .. + 8 of the chunk.
        for (int c = 0; c < kChunks; ++c) {
          for (int h = 0; h < 2; ++h) {
            for (int r = 0; r < 4; ++r) {
              for (int lane = 0; lane < 4; ++lane) {
                std::memcpy(words + 32 * (4 * (2 * c + h) + r) + 8 * lane,
                            bf16[(lane + r) % 4] + 64 * c + first_value(4 * h + lane), 16);
              }
            }
          }
        }
      }
      return;
    }
    for (int g = 0; g < rows; ++g) {
      float* row = q + g * q_row;
      round_row(row, bf16[0]);
      auto* words = reinterpret_cast<uint16_t*>(row);
      for (int c = 0; c < kChunks; ++c) {
        for (int v = 0; v < 64; v += 8) {
          std::memcpy(words + c * 64 + Loader::word(v), bf16[0] + c * 64 + v, 16);
        }
      }
    }
  }

  // One chunk of a K row: the words as they are.
  struct Chunk {
    __m512i w0, w1;
  };
  static Chunk chunk(__m512i w0, __m512i w1) { return {w0, w1}; }
  static void accumulate(const Chunk& k, const float* q_row, int c, __m512* acc0, __m512* acc1) {
    const auto* qc = reinterpret_cast<const uint16_t*>(q_row) + c * 64;
    *acc0 = _mm512_dpbf16_ps(*acc0, (__m512bh)_mm512_loadu_si512(qc), (__m512bh)k.w0);
    *acc1 = _mm512_dpbf16_ps(*acc1, (__m512bh)_mm512_loadu_si512(qc + 32), (__m512bh)k.w1);
  }
  static void qk(const float* q, int q_row, int group_padded, const std::byte* const* rows, int n,
                 int, int64_t, float* scores, TilePrefetcher* prefetch) {
    if constexpr (kQueryLanes) {
      qk_query_lanes<1>(q, q_row, 0, group_padded, rows, 0, n, scores, prefetch);
    } else {
      qk_chunks<Loader, kChunks, kNG, DotTiles>(q, q_row, group_padded, rows, n, scores, prefetch);
    }
  }

  // Heads a step of the decode task may take together (decode_task, NHD caches). A step reads
  // each token's rows of its heads side by side: QK per key over every head of the step (the
  // queries loaded from L1 past the registers), PV per sub-tile of keys over every head
  // (pv_step). On AMD Zen 5 (issue 23's third pass there) this read order is what a core's walk
  // from DRAM needed: one head a step read each head's rows 2 KiB apart, and the prefetched
  // lines it missed came in at full latency. With 8 heads a step (all of the llama3 8B task's)
  // bf16 d128 decode read 1.29-1.34x the GB/s of one head a step on one thread from DRAM and ran
  // 1.05-1.16x faster on two (`kvattn bench`; long_b1, d64, d256 1.08-1.15x), level in cache.
  // Rows of one 64-value chunk (bf16 d64, FP8 d64) keep the 4-head steps measured on Zen 4 for
  // QK alone (the step's query vectors stay in the 32 registers; 8 there ran 0.84x-1.06x on Zen 5
  // from DRAM, set to set). FP8 d128 (two chunks, 128-byte rows) took 2 heads a step until
  // issue 23's fifth Zen 5 pass (their query vectors alone filled the registers, so they were
  // reloaded anyway) and takes 8 since: cache-resident 1.08-1.10x (e4m3 and e5m2), from DRAM e4m3
  // 1.01-1.10x in three sets. d256 (512-byte rows) took 8 (1.12x against 1 on Zen 5). Since
  // issue 23's eighth Zen 5 pass every query-lane step takes 4 heads: a task of 4-7 heads (Qwen2.5
  // 7B's 4 KV heads, group 7) then steps where 8 left it one head a step (two threads,
  // decode_gqa7_bf16 1.23x; one thread from DRAM 16.0 -> 19.0 GB/s), padded groups of 8 read
  // 1.04-1.07x, d256 1.10-1.15x from DRAM on one thread (1.02x on two), bf16 / e4m3 d128 level on
  // two threads (one thread bf16 1.00-1.07x, e4m3 0.98x; cache-resident 0.97-0.98x). On AMD Zen 4
  // (issue 23, 2026-12-05) those 4-head steps cost d128 what 8 had gained there (two threads,
  // `kvattn bench`, separate builds alternated: llama3 bf16 15.6-16.1 -> 18.2-19.3 ms, long_b1
  // 8.2 -> 9.3-9.7, e4m3 8.8 -> 9.4-10.4; cache-resident bf16 0.93x), so rows of two chunks take 8
  // again, with a last step of 4 (kTailStepHeads) where 4-7 heads remain: llama3 bf16 16.4-17.1,
  // long_b1 8.3, e4m3 9.2-9.5 ms, cache-resident level with 8 alone, and decode_gqa7_bf16 (tasks of
  // 4 heads) 19.8-20.0 ms one head a step -> 17.5-19.0. d256 keeps 4 (level on Zen 4). Later the
  // same day, once Zen 4's prefetch took merged streams, one head a step beat the query-lane steps
  // there at d 64 and d 128 (the head's queries stay in registers): Zen 3 / Zen 4 take none there
  // (kLaneQueriesInRegisters; the steps of d 256 and of groups 1 and 2 stay). A task's
  // heads past the steps go one a step, in the same walk of its keys (decode_task; a step of
  // fewer, chosen at run time, made GCC build the full step's loops 1.2x slower cache-resident:
  // the tail step is an instance of its own). Groups of 1 and 2 rows (no query lanes) take 8 and 4
  // heads a step through qk_chunks (issue 23, Zen 5, bf16 d128, one thread, B16 from DRAM, with the
  // tasks of whole NHD token rows (decode_max_task_heads): MHA 32 heads 14.5 -> 19.6-21.3 GB/s,
  // group 2 17.8 -> 25.0; cache-resident MHA 29 -> 40.5; 8 heads at group 2 read 0.94x from DRAM
  // and left the 4-head tasks of 8 / 4 heads one a step, 0.68x).
  static constexpr int kRowBytes = kChunks * Loader::kChunkBytes;
  static constexpr int kStepHeads = !kQueryLanes ? 8 / kNG : kChunks == 2 ? 8 : 4;
  // A step of fewer heads after the full steps, where its heads remain (decode_task_by_steps):
  // the query-lane steps of 8 heads take a last step of 4, so that a task of 4-7 heads steps.
  static constexpr int kTailStepHeads = kQueryLanes && kStepHeads == 8 ? 4 : 1;
  // QK of a step of kHeads heads: head j's queries at q + j * q_head (floats), its K rows at
  // rows[kk] + j * head_step (bytes), its scores at scores + j * group_padded * kTile.
  template <int kHeads = kStepHeads>
  static void qk_step(const float* q, int q_row, int q_head, int group_padded,
                      const std::byte* const* rows, int64_t head_step, int n, int, float* scores,
                      TilePrefetcher* prefetch) {
    if constexpr (kQueryLanes) {
      qk_query_lanes<kHeads>(q, q_row, q_head, group_padded, rows, head_step, n, scores, prefetch);
    } else {
      qk_chunks<Loader, kChunks, kNG, DotTiles, kHeads>(q, q_row, group_padded, rows, n, scores,
                                                        prefetch, q_head, head_step);
    }
  }
  // tick() calls of a step: one per key and head in each QK pass over a block of kNG rows (so that
  // the next tile's lines stay spread over the whole step: ticked once a key, a step of 8 heads
  // left most of them to PV and read DRAM 0.88-0.90x as fast) and two per pair of keys and head
  // in each PV pass (pv, pv_step).
  static int step_ticks(int group_padded, int heads) {
    return 2 * kTile * (group_padded / kNG) * heads;
  }

  // QK of 4 query rows at once, of kHeads heads (head j's queries at q + j * q_head, its K rows
  // at rows[kk] + j * head_step, its scores j * group_padded rows on). Each 64-value chunk of a
  // K row is loaded as the Loader gives
  // it, two vectors of 32 words (vector 2c + h: words [32h, 32h + 32) of chunk c, their runs of
  // 8 words in 128-bit lanes L = 0..3). Query vector 4(2c + h) + r (prepare_q) holds, in lane L,
  // row (L + r) % 4's values of the same words, so the four vdpbf16ps of a K vector serve all 4
  // rows, and summing over the K vectors leaves, in accumulator r, row (L + r) % 4's partial
  // sums in lane L. Rotating accumulator r's lanes by r puts row g's sums in lane g for every r:
  // a key's sums then need 4 lanes reduced, not 16 (a third of the shuffles and adds of reducing
  // one vector per row and key, as qk_chunks does). Broadcasting 8 words of a bf16 K row to the
  // 4 lanes instead (the rows in fixed lanes) took a shuffle per vdpbf16ps: ~24 cycles a key on
  // Zen 4 where these loads, 16 products and 3 rotations take ~16. Where the query vectors do not
  // stay in registers (kLaneQueriesInRegisters false: d 256, and the head steps of the classes
  // that take them) the keys go two at a time (qk_lane_pair), each query vector loaded once for
  // both: half the query loads (at d 256, 32 query and 8 K loads per 32 vdpbf16ps, one key at a
  // time) and 8 accumulators in place of 4. Zen 4, 2026-12-07, against 94fc6be's binary
  // (separate processes alternated, `kvattn bench`, median per-round ratio of the times, two
  // threads from DRAM): decode_d256_bf16 0.82 / 0.85 / 0.89x in three sets of 4-8 rounds (the
  // unchanged d128 cases in the same rounds 0.92-1.06x: the noise); one thread cache-resident
  // 0.96-0.97x (B1 x 128 keys: 20.2-20.4 against 21.0 GB/s). Where the queries stay in registers
  // (d 64 / d 128, one head a step) two keys a pass ran slower cache-resident (bf16 d128 22.2
  // against 24.4 GB/s, e4m3 12.4 against 12.8, d64 18.5 against 19.8) and no faster from DRAM
  // (bf16 d128 1.05-1.06x, e4m3 0.92-1.01x), so those keep one key a pass. Not measured on
  // Zen 5, whose d128 head steps take this path.
  template <int kHeads>
  static void qk_query_lanes(const float* q, int q_row, int q_head, int group_padded,
                             const std::byte* const* rows, int64_t head_step, int n, float* scores,
                             TilePrefetcher* prefetch) {
    const Loader load;
    for (int g0 = 0; g0 < group_padded; g0 += 4) {
      for (int kb = 0; kb < n; kb += 16) {
        __m512 parts[kHeads][16];
        const int count = std::min(16, n - kb);
        int kk = 0;
        if constexpr (!kLaneQueriesInRegisters) {
          for (; kk + 2 <= count; kk += 2) {
            qk_lane_pair<kHeads>(load, q, q_row, q_head, g0, rows + kb + kk, head_step, parts, kk,
                                 prefetch);
          }
        }
        // One key a pass (an odd last key after the pairs).
        for (; kk < count; ++kk) {
          for (int j = 0; j < kHeads; ++j) {
            prefetch->tick();
            const auto* qv = reinterpret_cast<const uint8_t*>(q + j * q_head + g0 * q_row);
            const auto* row = reinterpret_cast<const uint8_t*>(rows[kb + kk]) + j * head_step;
            __m512 acc[4];
            for (int r = 0; r < 4; ++r) acc[r] = _mm512_setzero_ps();
            for (int c = 0; c < kChunks; ++c) {
              __m512i k[2];
              load(row + c * Loader::kChunkBytes, &k[0], &k[1]);
              for (int h = 0; h < 2; ++h) {
                for (int r = 0; r < 4; ++r) {
                  acc[r] = _mm512_dpbf16_ps(
                      acc[r], (__m512bh)_mm512_loadu_si512(qv + 64 * (4 * (2 * c + h) + r)),
                      (__m512bh)k[h]);
                }
              }
            }
            parts[j][kk] = rotate_lanes(acc);
          }
        }
        for (int j = 0; j < kHeads; ++j) {
          for (int kk = count; kk < 16; ++kk) parts[j][kk] = _mm512_setzero_ps();
          store_lane_sums(parts[j], scores + (j * group_padded + g0) * kTile + kb);
        }
      }
    }
  }

  // Two keys of qk_query_lanes (rows[0], rows[1]) for each of kHeads heads: each query vector
  // loaded once for both (an empty asm keeps GCC from folding the load into each vdpbf16ps);
  // their sums to parts[j][at], parts[j][at + 1].
  template <int kHeads>
  [[gnu::always_inline]] static void qk_lane_pair(const Loader& load, const float* q, int q_row,
                                                  int q_head, int g0, const std::byte* const* rows,
                                                  int64_t head_step, __m512 (*parts)[16], int at,
                                                  TilePrefetcher* prefetch) {
    for (int j = 0; j < kHeads; ++j) {
      prefetch->tick();
      prefetch->tick();
      const auto* qv = reinterpret_cast<const uint8_t*>(q + j * q_head + g0 * q_row);
      __m512 acc[2][4];
      for (int x = 0; x < 2; ++x) {
        for (int r = 0; r < 4; ++r) acc[x][r] = _mm512_setzero_ps();
      }
      for (int c = 0; c < kChunks; ++c) {
        __m512i k[2][2];
        for (int x = 0; x < 2; ++x) {
          load(reinterpret_cast<const uint8_t*>(rows[x]) + j * head_step + c * Loader::kChunkBytes,
               &k[x][0], &k[x][1]);
        }
        for (int h = 0; h < 2; ++h) {
          for (int r = 0; r < 4; ++r) {
            __m512i qq = _mm512_loadu_si512(qv + 64 * (4 * (2 * c + h) + r));
            asm("" : "+v"(qq));
            for (int x = 0; x < 2; ++x) {
              acc[x][r] = _mm512_dpbf16_ps(acc[x][r], (__m512bh)qq, (__m512bh)k[x][h]);
            }
          }
        }
      }
      for (int x = 0; x < 2; ++x) parts[j][at + x] = rotate_lanes(acc[x]);
    }
  }
  // A key's 4 accumulators summed with lane L of accumulator r moved to lane (L + r) % 4.
  static __m512 rotate_lanes(const __m512* acc) {
    return _mm512_add_ps(_mm512_add_ps(acc[0], _mm512_shuffle_f32x4(acc[1], acc[1], 0x93)),
                         _mm512_add_ps(_mm512_shuffle_f32x4(acc[2], acc[2], 0x4E),
                                       _mm512_shuffle_f32x4(acc[3], acc[3], 0x39)));
  }

  // Lane 4g + i of parts[k]: row g's partial sum i of key k, for 16 keys; each row's 16 sums to
  // out + g * kTile. Two levels of pairwise sums leave w[m] with keys 4m .. 4m + 3 of row g in
  // 128-bit lane g; a 4 x 4 transpose of the 128-bit lanes then gives each row its 16 keys.
  static void store_lane_sums(const __m512* parts, float* out) {
    __m512 u[8], w[4];
    for (int i = 0; i < 8; ++i) {
      u[i] = _mm512_add_ps(_mm512_unpacklo_ps(parts[2 * i], parts[2 * i + 1]),
                           _mm512_unpackhi_ps(parts[2 * i], parts[2 * i + 1]));
    }
    for (int m = 0; m < 4; ++m) {
      w[m] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * m], u[2 * m + 1], 0x44),
                           _mm512_shuffle_ps(u[2 * m], u[2 * m + 1], 0xEE));
    }
    const __m512 x0 = _mm512_shuffle_f32x4(w[0], w[1], 0x44);
    const __m512 x1 = _mm512_shuffle_f32x4(w[0], w[1], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(w[2], w[3], 0x44);
    const __m512 y1 = _mm512_shuffle_f32x4(w[2], w[3], 0xEE);
    _mm512_storeu_ps(out, _mm512_shuffle_f32x4(x0, y0, 0x88));
    _mm512_storeu_ps(out + kTile, _mm512_shuffle_f32x4(x0, y0, 0xDD));
    _mm512_storeu_ps(out + 2 * kTile, _mm512_shuffle_f32x4(x1, y1, 0x88));
    _mm512_storeu_ps(out + 3 * kTile, _mm512_shuffle_f32x4(x1, y1, 0xDD));
  }

  // PV of one head (kSplit, and pv_step's `split`: per-token V scales in the weights, below).
  template <bool kSplit = false>
  static void pv(const float* p, int group_padded, const std::byte* const* rows, int n, int,
                 int64_t, float* o, int o_row, TilePrefetcher* prefetch) {
    pv_heads<1, kTile / 2, kSplit>(p, group_padded, rows, 0, n, o, o_row, 0, prefetch);
  }
  // PV of a step of kStepHeads heads, sub-tile by sub-tile of 4 pairs of keys: the V rows are read
  // 8 tokens at a time, every head's (16 KiB of all 8 heads at d 128 bf16), where pv reads one
  // head's rows of the whole tile 2 KiB apart. (On Zen 4 an earlier PV of 2 heads a pass, by rows
  // or by half dims, ran 1.04-1.12x slower than head by head; this one, by sub-tiles, is not
  // measured there.) Out of line, as GCC left it while decode_task had one body: inlined into
  // decode_task_by_steps, bf16 d256 read 0.96x from DRAM (one Zen 5 thread).
  template <int kHeads = kStepHeads>
  [[gnu::noinline]] static void pv_step(const float* p, int group_padded,
                                        const std::byte* const* rows, int64_t head_step, int n, int,
                                        int64_t, float* o, int o_row, int o_head,
                                        TilePrefetcher* prefetch, bool split) {
    if (split) {
      pv_heads<kHeads, 4, true>(p, group_padded, rows, head_step, n, o, o_row, o_head, prefetch);
    } else {
      pv_heads<kHeads, 4, false>(p, group_padded, rows, head_step, n, o, o_row, o_head, prefetch);
    }
  }
  // With per-(token, head) V scales the weights are p * scale (softmax_rows), which one bf16
  // would round, scale and all: the key of weight 1 would then err by up to 2^-9 of its value
  // where the baseline (P rounded to bf16, V dequantized in f32) does not err at all. kSplit
  // takes each weight as two bf16, hi + lo (split_bf16, cpu/common/bf16_split.h), both against
  // the same V pair (twice PV's products): w to 2^-16 of it at worst, inside the bound; the
  // low parts meet V with its infinities zeroed (e5m2), so an inf in V gives w's infinity.
  static constexpr bool kSplitWeights = true;
  // PV of kHeads heads (head j's weights at p + j * group_padded * kTile, its V rows at rows[kk] +
  // j * head_step, its output at o + j * o_head), sub-tile by sub-tile of kSubPairs pairs of keys:
  // per sub-tile, each head's accumulators loaded, its pairs taken, stored.
  template <int kHeads, int kSubPairs, bool kSplit>
  static void pv_heads(const float* p, int group_padded, const std::byte* const* rows,
                       int64_t head_step, int n, float* o, int o_row, int o_head,
                       TilePrefetcher* prefetch) {
    static_assert(kTile == 32);
    alignas(64) static constexpr uint8_t kZeroRow[kChunks * Loader::kChunkBytes] = {};
    const Loader load;
    const int pairs = (n + 1) / 2;
    for (int g0 = 0; g0 < group_padded; g0 += kNG) {
      // Probabilities of two keys as one bf16 pair per 32 bits: pair t = keys 2t, 2t + 1.
      alignas(64) uint32_t pp[kHeads][kNG][kTile / 2];
      alignas(64) uint32_t lo[kSplit ? kHeads : 1][kNG][kTile / 2];  // kSplit: w - hi
      for (int j = 0; j < kHeads; ++j) {
        for (int g = 0; g < kNG; ++g) {
          const float* pg = p + (j * group_padded + g0 + g) * kTile;
          const __m512 w0 = _mm512_loadu_ps(pg), w1 = _mm512_loadu_ps(pg + 16);
          if constexpr (kSplit) {
            __m256i h0, l0, h1, l1;
            split_bf16(w0, &h0, &l0);
            split_bf16(w1, &h1, &l1);
            _mm512_store_si512(pp[j][g], _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1));
            _mm512_store_si512(lo[j][g], _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1));
          } else {
            const __m512bh b = _mm512_cvtne2ps_pbh(w1, w0);
            _mm512_store_si512(pp[j][g], (__m512i)b);
          }
        }
      }
      for (int t0 = 0; t0 < pairs; t0 += kSubPairs) {
        const int t1 = std::min(pairs, t0 + kSubPairs);
        for (int j = 0; j < kHeads; ++j) {
          float* og = o + j * o_head + g0 * o_row;
          for (int c = 0; c < kChunks; ++c) {
            __m512 acc[kNG][4];
            for (int g = 0; g < kNG; ++g) {
              for (int r = 0; r < 4; ++r) {
                acc[g][r] = _mm512_loadu_ps(og + g * o_row + c * 64 + 16 * r);
              }
            }
            for (int t = t0; t < t1; ++t) {
              // The pair's two ticks, one in each half of the chunks (both in the one chunk of
              // d 64). Both at chunk 0, the first chunk's pass of a bf16 d128 tile ran the walk's
              // ~100 instructions a pair beside its 16 products, the second none: one Zen 4
              // thread (2026-12-05) then read 22.7-23.1 GB/s cache-resident where this reads
              // 23.7-24.2 (e4m3 11.7-12.1 -> 12.6-12.8, d256 20.0-20.3 -> 20.9-21.1), from DRAM
              // bf16 level to 1.13x, e4m3 1.07-1.13x; two threads (`kvattn bench`, four sets)
              // bf16 1.01-1.09x, e4m3 0.93-1.12x, d256 0.91-1.06x: the noise of the host.
              if (c == 0 || c == kChunks / 2) prefetch->tick();
              if constexpr (kChunks == 1) prefetch->tick();
              const auto* r0 = reinterpret_cast<const uint8_t*>(rows[2 * t]) + j * head_step;
              const auto* r1 =
                  2 * t + 1 < n ? reinterpret_cast<const uint8_t*>(rows[2 * t + 1]) + j * head_step
                                : kZeroRow;
              __m512i v[4];
              load.pairs(r0 + c * Loader::kChunkBytes, r1 + c * Loader::kChunkBytes, v);
              // The low weights' V (split_bf16): infinities zeroed where the cache holds any.
              __m512i v_lo[4];
              for (int r = 0; r < 4; ++r) {
                v_lo[r] = kSplit && Loader::kMayHoldInf ? without_infinities(v[r]) : v[r];
              }
              for (int g = 0; g < kNG; ++g) {
                const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pp[j][g][t]));
                for (int r = 0; r < 4; ++r) {
                  acc[g][r] = _mm512_dpbf16_ps(acc[g][r], (__m512bh)v[r], w);
                }
                if constexpr (kSplit) {
                  const __m512bh wl =
                      (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(lo[j][g][t]));
                  for (int r = 0; r < 4; ++r) {
                    acc[g][r] = _mm512_dpbf16_ps(acc[g][r], (__m512bh)v_lo[r], wl);
                  }
                }
              }
            }
            for (int g = 0; g < kNG; ++g) {
              for (int r = 0; r < 4; ++r) {
                _mm512_storeu_ps(og + g * o_row + c * 64 + 16 * r, acc[g][r]);
              }
            }
          }
        }
      }
    }
  }

  // The accumulators back in dim order, in runs of 4 (pv_lane keeps them together).
  static void finish_o(float* o, int rows, int o_row, int) {
    static_assert(runs_of<4>([](int v) { return Loader::pv_lane(v); }));
    alignas(64) float tmp[64];
    for (int g = 0; g < rows; ++g) {
      for (int c = 0; c < kChunks; ++c) {
        float* chunk = o + g * o_row + c * 64;
        std::memcpy(tmp, chunk, sizeof(tmp));
        for (int v = 0; v < 64; v += 4) std::memcpy(chunk + v, tmp + Loader::pv_lane(v), 16);
      }
    }
  }
};

// The decode task over DotTiles for a padded GQA group: blocks of up to 4 query rows (8 rows x 4
// accumulators would not fit the registers: two blocks of 4).
template <class Loader, DType kKV, int kD>
DecodeItemFn pick_dot_group(int group_padded) {
  switch (std::min(group_padded, 8)) {
    case 1:
      return &decode_task<avx512::Simd, kKV, kD, kD, 1, DotTiles<Loader, kD, 1>>;
    case 2:
      return &decode_task<avx512::Simd, kKV, kD, kD, 2, DotTiles<Loader, kD, 2>>;
    case 4:
    case 8:
      return &decode_task<avx512::Simd, kKV, kD, kD, 4, DotTiles<Loader, kD, 4>>;
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace kvattn::cpu::decode_detail
