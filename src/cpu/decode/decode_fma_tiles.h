// The fp32-FMA QK and PV tiles of the decode kernel (decode_kernel.h), every ISA level and
// dtype: stored K/V rows widened to f32 ("raw", see simd_avx512.h) and FMAs with the f32 queries.
// Also the tile policy that wraps them (FmaTiles), the interface decode_task takes; the AVX2 tiles
// of blocks of 4 query rows by parity / quads it takes are in decode_fma_blocks.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cpu/decode/decode.h"
#include "cpu/decode/decode_fma_blocks.h"
#include "cpu/decode/decode_prefetch.h"

namespace kvattn::cpu::decode_detail {

template <DType T>
inline constexpr int kElemBytes = T == DType::kF32                          ? 4
                                  : (T == DType::kF16 || T == DType::kBF16) ? 2
                                                                            : 1;

// Two consecutive chunks of a row (the one at p, the next `step` bytes on) as raw f32: together
// where S widens two at once (load_raw_pair: FP8 on AVX2), else one by one.
template <class S, DType kKV>
inline void load_raw_two(const std::byte* p, int64_t step, typename S::Vec* a, typename S::Vec* b) {
  if constexpr (requires { S::template load_raw_pair<kKV>(p, a, b); }) {
    S::template load_raw_pair<kKV>(p, a, b);
  } else {
    *a = S::template load_raw<kKV>(p);
    *b = S::template load_raw<kKV>(p + step);
  }
}

// scores[g][kk] = q[g] . K row kk (raw), for n keys and every padded query row. Always inline
// (as pv_tile): called from both of decode_task's bodies (decode_task_by_steps), GCC kept both
// out of line, and the one-head walk then read 0.74x (f16 HND, one Zen 5 thread, cache-resident).
template <class S, DType kKV, int kD, int kNG>
[[gnu::always_inline]] inline void qk_tile(const float* q, int q_row, int group_padded,
                                           const std::byte* const* rows, int n, int d_runtime,
                                           int64_t elem_stride, float* scores,
                                           TilePrefetcher* prefetch) {
  using Vec = typename S::Vec;
  constexpr int W = S::kWidth;
  const int dim = kD > 0 ? kD : d_runtime;
  const int full = dim / W, tail = dim % W;
  const int64_t step = int64_t{W} * kElemBytes<kKV> * elem_stride;
  // Two accumulator chains a query row (even and odd chunks), summed per key, for 16-bit K rows
  // at blocks of up to 4 rows: one chain is 16 dependent FMAs a key at d 128 on AVX2. Zen 5 with
  // the AVX2 kernel forced (its class, Zen 3, not measured): cache-resident 1.08x (bf16 / f16
  // d128), from DRAM 1.02-1.07x (issue 23); the AVX-512 FMA kernel level. FP8 rows take two from
  // d 128 (the AVX2 kernel on Zen 5, cache-resident: e4m3 d128 1.02-1.04x, d256 1.04-1.07x, e5m2
  // d128 1.06x) and keep one below (their widening needs the registers: AVX2 e4m3 d64 ran 10 %
  // slower with two once, 1-2 % on Zen 5).
  constexpr bool kTwoChains =
      kNG <= 4 && (kElemBytes<kKV> == 2 || (kElemBytes<kKV> == 1 && kD >= 128));
  for (int g0 = 0; g0 < group_padded; g0 += kNG) {
    const float* qg = q + g0 * q_row;
    for (int kb = 0; kb < n; kb += W) {
      Vec parts[kNG][W];
      const int count = std::min(W, n - kb);
      for (int kk = 0; kk < count; ++kk) {
        const std::byte* row = rows[kb + kk];
        prefetch->tick();
        Vec acc[kNG], acc2[kNG];
        for (int g = 0; g < kNG; ++g) acc[g] = acc2[g] = S::zero();
        int c = 0;
        if constexpr (kTwoChains) {
          for (; c + 2 <= full; c += 2) {
            Vec k0, k1;
            load_raw_two<S, kKV>(row + c * step, step, &k0, &k1);
            for (int g = 0; g < kNG; ++g) {
              acc[g] = S::fma(S::load(qg + g * q_row + c * W), k0, acc[g]);
              acc2[g] = S::fma(S::load(qg + g * q_row + (c + 1) * W), k1, acc2[g]);
            }
          }
        }
        for (; c < full; ++c) {
          const Vec k = S::template load_raw<kKV>(row + c * step);
          for (int g = 0; g < kNG; ++g) acc[g] = S::fma(S::load(qg + g * q_row + c * W), k, acc[g]);
        }
        if constexpr (kTwoChains) {
          for (int g = 0; g < kNG; ++g) acc[g] = S::add(acc[g], acc2[g]);
        }
        if (tail) {
          const Vec k = S::template load_raw_tail<kKV>(row + full * step, tail);
          for (int g = 0; g < kNG; ++g) {
            acc[g] = S::fma(S::load(qg + g * q_row + full * W), k, acc[g]);
          }
        }
        for (int g = 0; g < kNG; ++g) parts[g][kk] = acc[g];
      }
      for (int kk = count; kk < W; ++kk) {
        for (int g = 0; g < kNG; ++g) parts[g][kk] = S::zero();
      }
      for (int g = 0; g < kNG; ++g)
        S::store(scores + (g0 + g) * kTile + kb, S::reduce_rows(parts[g]));
    }
  }
}

// QK of kHeads heads (head j's queries at q + j * q_head, its K rows at rows[kk] + j * head_step
// bytes, contiguous in dim; its scores j * group_padded rows on), 4 keys at a time over every
// head: the rows of 4 tokens are read head after head (2 KiB a token at 8 heads, d 128, 16-bit),
// where one head a step reads its rows 2 KiB apart across the tile. Per head, blocks of up to 4
// query rows x kKeys keys: chunk by chunk, each query vector loaded once for kKeys keys (kKeys *
// rows independent chains; qk_tile loads it once a key). Each key's partial sums are reduced 4
// keys at a time (S::reduce_four, then reduce_fours a vector of keys).
template <class S, DType kKV, int kD, int kNG, int kHeads>
[[gnu::noinline]] void qk_heads(const float* q, int q_row, int q_head, int group_padded,
                                const std::byte* const* rows, int64_t head_step, int n,
                                int d_runtime, float* scores, TilePrefetcher* prefetch) {
  using Vec = typename S::Vec;
  constexpr int W = S::kWidth;
  static_assert(W % 4 == 0);
  constexpr int kRows = std::min(kNG, 4);
  // Accumulators, queries and a K vector within the registers (32 on AVX-512, 16 on AVX2).
  constexpr int kKeys = W >= 16 ? 4 : 2;
  const int dim = kD > 0 ? kD : d_runtime;
  const int full = dim / W, tail = dim % W;
  const int64_t step = int64_t{W} * kElemBytes<kKV>;
  for (int g0 = 0; g0 < group_padded; g0 += kRows) {
    for (int kb = 0; kb < n; kb += W) {
      Vec fours[kHeads][kRows][W / 4];
      for (int k4 = 0; k4 < W; k4 += 4) {
        const int count = std::clamp(n - kb - k4, 0, 4);
        if (count == 0) {
          for (int j = 0; j < kHeads; ++j) {
            for (int g = 0; g < kRows; ++g) fours[j][g][k4 / 4] = S::zero();
          }
          continue;
        }
        for (int j = 0; j < kHeads; ++j) {
          const float* qg = q + j * q_head + g0 * q_row;
          Vec parts[kRows][4];
          for (int k0 = 0; k0 < 4; k0 += kKeys) {
            // Keys past `count` read the first key's row again; their sums are dropped below.
            const std::byte* key_rows[kKeys];
            for (int kk = 0; kk < kKeys; ++kk) {
              const int key = k0 + kk < count ? k0 + kk : 0;
              key_rows[kk] = rows[kb + k4 + key] + j * head_step;
              if (k0 + kk < count) prefetch->tick();
            }
            Vec acc[kKeys][kRows];
            for (int kk = 0; kk < kKeys; ++kk) {
              for (int g = 0; g < kRows; ++g) acc[kk][g] = S::zero();
            }
            for (int c = 0; c < full + (tail ? 1 : 0); ++c) {
              Vec qc[kRows];
              for (int g = 0; g < kRows; ++g) qc[g] = S::load(qg + g * q_row + c * W);
              for (int kk = 0; kk < kKeys; ++kk) {
                const std::byte* k = key_rows[kk] + c * step;
                const Vec kv = c < full ? S::template load_raw<kKV>(k)
                                        : S::template load_raw_tail<kKV>(k, tail);
                for (int g = 0; g < kRows; ++g) acc[kk][g] = S::fma(qc[g], kv, acc[kk][g]);
              }
            }
            for (int kk = 0; kk < kKeys; ++kk) {
              for (int g = 0; g < kRows; ++g) {
                parts[g][k0 + kk] = k0 + kk < count ? acc[kk][g] : S::zero();
              }
            }
          }
          for (int g = 0; g < kRows; ++g) fours[j][g][k4 / 4] = S::reduce_four(parts[g]);
        }
      }
      for (int j = 0; j < kHeads; ++j) {
        for (int g = 0; g < kRows; ++g) {
          S::store(scores + (j * group_padded + g0 + g) * kTile + kb, S::reduce_fours(fours[j][g]));
        }
      }
    }
  }
}

// og[g][chunks c .. c + kCols) += sum_kk pg[g][kk] * those chunks of V row kk (raw), keys [k0,
// k1) (rows[kk] + offset bytes); kTail: the one chunk c is the dim's last, `tail` values.
template <class S, DType kKV, int kNG, int kCols, bool kTail, bool kParity = false>
[[gnu::always_inline]] inline void pv_block(const float* pg, const std::byte* const* rows,
                                            int64_t offset, int k0, int k1, int c, int tail,
                                            int64_t step, float* og, int o_row,
                                            TilePrefetcher* prefetch) {
  using Vec = typename S::Vec;
  constexpr int W = S::kWidth;
  static_assert(!kTail || kCols == 1);
  Vec acc[kNG][kCols];
  for (int g = 0; g < kNG; ++g) {
    for (int i = 0; i < kCols; ++i) acc[g][i] = S::load(og + g * o_row + (c + i) * W);
  }
  for (int kk = k0; kk < k1; ++kk) {
    if (c == 0) prefetch->tick();
    const std::byte* v = rows[kk] + offset + c * step;
    Vec x[kCols];
    if constexpr (kTail) {
      x[0] = S::template load_raw_tail<kKV>(v, tail);
    } else {
      for (int i = 0; i + 2 <= kCols; i += 2) {
        if constexpr (kParity) {
          S::load_bf16_parity(v + i * step, &x[i], &x[i + 1]);
        } else {
          load_raw_two<S, kKV>(v + i * step, step, &x[i], &x[i + 1]);
        }
      }
      if constexpr (kCols % 2) x[kCols - 1] = S::template load_raw<kKV>(v + (kCols - 1) * step);
    }
    for (int g = 0; g < kNG; ++g) {
      const Vec w = S::set1(pg[g * kTile + kk]);
      for (int i = 0; i < kCols; ++i) acc[g][i] = S::fma(w, x[i], acc[g][i]);
    }
  }
  for (int g = 0; g < kNG; ++g) {
    for (int i = 0; i < kCols; ++i) S::store(og + g * o_row + (c + i) * W, acc[g][i]);
  }
}

// og[g] += sum_kk pg[g][kk] * V row kk (raw) for keys [k0, k1) (rows[kk] + offset bytes), kCols
// column chunks at a time (kNG * kCols FMA chains side by side, each weight broadcast once per
// kCols chunks): 4 on AVX-512 up to 4 rows, else 2; then the rest one by one. One tick() per key.
template <class S, DType kKV, int kD, int kNG>
[[gnu::always_inline]] inline void pv_keys(const float* pg, const std::byte* const* rows,
                                           int64_t offset, int k0, int k1, int d_runtime,
                                           int64_t elem_stride, float* og, int o_row,
                                           TilePrefetcher* prefetch) {
  constexpr int W = S::kWidth;
  constexpr int kCols = W >= 16 && kNG <= 4 ? 4 : 2;
  const int dim = kD > 0 ? kD : d_runtime;
  const int full = dim / W, tail = dim % W;
  const int64_t step = int64_t{W} * kElemBytes<kKV> * elem_stride;
  int c = 0;
  // By parity (kParityRows: the output columns in parity order) the blocks are pairs of chunks,
  // each pair one block of 16 values (kCols is 2 on AVX2, the dim a multiple of 16).
  constexpr bool kParity = kParityRows<S, kKV, kD, kNG>;
  static_assert(!kParity || kCols == 2);
  for (; c + kCols <= full; c += kCols) {
    pv_block<S, kKV, kNG, kCols, false, kParity>(pg, rows, offset, k0, k1, c, 0, step, og, o_row,
                                                 prefetch);
  }
  for (; c < full; ++c) {
    pv_block<S, kKV, kNG, 1, false>(pg, rows, offset, k0, k1, c, 0, step, og, o_row, prefetch);
  }
  if (tail) {
    pv_block<S, kKV, kNG, 1, true>(pg, rows, offset, k0, k1, c, tail, step, og, o_row, prefetch);
  }
}

// o[g] += sum_kk p[g][kk] * V row kk (raw), for n keys and every padded query row.
template <class S, DType kKV, int kD, int kNG>
[[gnu::always_inline]] inline void pv_tile(const float* p, int group_padded,
                                           const std::byte* const* rows, int n, int d_runtime,
                                           int64_t elem_stride, float* o, int o_row,
                                           TilePrefetcher* prefetch) {
  for (int g0 = 0; g0 < group_padded; g0 += kNG) {
    pv_keys<S, kKV, kD, kNG>(p + g0 * kTile, rows, 0, 0, n, d_runtime, elem_stride, o + g0 * o_row,
                             o_row, prefetch);
  }
}

// PV of kHeads heads (head j's weights at p + j * group_padded * kTile, its V rows at rows[kk] +
// j * head_step, its output at o + j * o_head), sub-tile by sub-tile of kSubKeys keys: the V rows
// of those keys are read head after head (as qk_heads reads K), each head's accumulators loaded
// and stored once a sub-tile.
template <class S, DType kKV, int kD, int kNG, int kHeads, int kSubKeys>
[[gnu::noinline]] void pv_heads(const float* p, int group_padded, const std::byte* const* rows,
                                int64_t head_step, int n, int d_runtime, int64_t elem_stride,
                                float* o, int o_row, int o_head, TilePrefetcher* prefetch) {
  for (int g0 = 0; g0 < group_padded; g0 += kNG) {
    for (int k0 = 0; k0 < n; k0 += kSubKeys) {
      const int k1 = std::min(n, k0 + kSubKeys);
      for (int j = 0; j < kHeads; ++j) {
        pv_keys<S, kKV, kD, kNG>(p + (j * group_padded + g0) * kTile, rows, j * head_step, k0, k1,
                                 d_runtime, elem_stride, o + j * o_head + g0 * o_row, o_row,
                                 prefetch);
      }
    }
  }
}

// How a task's QK and PV tiles are computed: the fp32-FMA tiles (every ISA level, every dtype)
// below; decode_fp8_table.h has bf16 dot-product tiles for FP8 caches. A policy:
//   prepare_q(q, rows, q_row, dqk)  once per head, after the queries are in f32 (in place);
//   fold_q(q, rows, q_row, dqk)     FmaTiles only: once per task after prepare_q, returns the
//                                   scores' raw-to-real factor (else kKRaw);
//   qk(...) / pv(...)               one tile, as qk_tile / pv_tile;
//   finish_o(o, rows, o_row, dvo)   once per head, before the epilogue (in place);
//   kKRaw / kVRaw                   the raw-to-real factors of K and V;
//   kPoisonE4m3Nans                 whether the e4m3 NaN codes must be restored after PV.
template <class S, DType kKV, int kDqk, int kDvo, int kNG>
struct FmaTiles {
  // e4m3 K rows by quads on AVX2 (kQuadRows): q in quad order, folded (fold_q).
  static constexpr bool kQuadK = kQuadRows<S, kKV, kDqk, kNG>;
  // (By quads: the factor before fold_q, which returns the one after it.)
  static constexpr float kKRaw = kQuadK ? 0x1p120f : S::template raw_to_real<kKV>();
  // e4m3 V rows by quads on AVX2 (kQuadRows): the output in quad order, the weights folded.
  static constexpr bool kQuadV = kQuadRows<S, kKV, kDvo, kNG>;
  static constexpr float kVRaw =
      kQuadV ? 0x1p120f / kQuadWeightFold : S::template raw_to_real<kKV>();
  static constexpr bool kPoisonE4m3Nans = kKV == DType::kE4M3 && S::kWidth > 1;
  // bf16 rows by parity on AVX2 (kParityRows): q stored in parity order, K read so.
  static constexpr bool kParityK = kParityRows<S, kKV, kDqk, kNG>;
  static constexpr bool kParityV = kParityRows<S, kKV, kDvo, kNG>;
  static void prepare_q(float* q, int rows, int q_row, int dqk) {
    if constexpr (kParityK) {
      for (int g = 0; g < rows; ++g) {
        for (int b = 0; b < dqk; b += 16) S::to_parity(q + g * q_row + b);
      }
    }
    if constexpr (kQuadK) {
      for (int g = 0; g < rows; ++g) {
        for (int b = 0; b < dqk; b += 32) S::to_quads(q + g * q_row + b);
      }
    }
  }
  // Once per task, after prepare_q: the queries of all its heads (`rows` rows) multiplied by
  // 2^quad_query_fold_exponent of their largest |value|; returns the scores' raw-to-real factor
  // (kKRaw where K is not read by quads: nothing is folded).
  static float fold_q(float* q, int rows, int q_row, int dqk) {
    if constexpr (kQuadK) {
      using Vec = typename S::Vec;
      Vec most = S::zero();
      for (int g = 0; g < rows; ++g) {
        for (int d = 0; d < dqk; d += S::kWidth) {
          const Vec x = S::load(q + g * q_row + d);
          most = S::max(S::max(x, S::sub(S::zero(), x)), most);
        }
      }
      const int e = quad_query_fold_exponent(S::reduce_max(most));
      const Vec fold = S::set1(std::ldexp(1.0f, e));
      for (int g = 0; g < rows; ++g) {
        for (int d = 0; d < dqk; d += S::kWidth) {
          S::store(q + g * q_row + d, S::mul(S::load(q + g * q_row + d), fold));
        }
      }
      return std::ldexp(1.0f, 120 - e);
    } else {
      return kKRaw;
    }
  }
  // qk and pv return whether the tile's rows may hold the e4m3 NaN code (poison_e4m3_nans scans
  // them where they may): false only where the quads probed them all and found none.
  static bool qk(const float* q, int q_row, int group_padded, const std::byte* const* rows, int n,
                 int d_runtime, int64_t elem_stride, float* scores, TilePrefetcher* prefetch) {
    if constexpr (kParityK) {
      qk_tile_parity<S, kDqk, kNG>(q, q_row, group_padded, rows, 0, n, scores, prefetch);
    } else if constexpr (kQuadK) {
      bool nan_code = false;
      S::with_denormal_inputs([&] __attribute__((always_inline)) {
        nan_code = qk_tile_quads<S, kDqk, kNG>(q, q_row, group_padded, rows, n, scores, prefetch);
      });
      return nan_code;
    } else {
      qk_tile<S, kKV, kDqk, kNG>(q, q_row, group_padded, rows, n, d_runtime, elem_stride, scores,
                                 prefetch);
    }
    return true;
  }
  static bool pv(const float* p, int group_padded, const std::byte* const* rows, int n,
                 int d_runtime, int64_t elem_stride, float* o, int o_row,
                 TilePrefetcher* prefetch) {
    if constexpr (kQuadV) {
      return pv_tile_quads<S, kDvo, kNG>(p, group_padded, rows, n, o, o_row, prefetch);
    } else {
      pv_tile<S, kKV, kDvo, kNG>(p, group_padded, rows, n, d_runtime, elem_stride, o, o_row,
                                 prefetch);
      return true;
    }
  }
  // Where column d of an output row is kept until finish_o (poison_e4m3_nans writes there).
  static int o_position(int d) {
    if constexpr (kQuadV) {
      return S::quad_position(d);
    } else {
      return d;
    }
  }
  static void finish_o(float* o, int rows, int o_row, int dvo) {
    if constexpr (kQuadV) {
      for (int g = 0; g < rows; ++g) {
        for (int b = 0; b < dvo; b += 32) S::from_quads(o + g * o_row + b);
      }
    }
    if constexpr (kParityV) {
      for (int g = 0; g < rows; ++g) {
        for (int b = 0; b < dvo; b += 16) S::from_parity(o + g * o_row + b);
      }
    }
  }

  // Heads a step of the decode task may take together (decode_task, NHD caches, where the CPU
  // class takes them: DecodeParams::fma_head_steps; see DotTiles::kStepHeads), on the vector ISAs:
  // 8, and 4 at blocks of 8 query rows on AVX-512 (a step covers twice the query rows there).
  // Zen 5, f16, 64 query heads over 8 (one thread, B 16 x 4k from DRAM): 4 heads a step
  // 15.4-15.8 GB/s, 8 14.8-14.9, one 13.9-14.0. One head a step at blocks of 8 rows on AVX2 (16
  // registers; on Zen 3 the gqa7 case ran 1.08-1.10x slower in steps, issue 23's Zen 3 note of
  // 2026-12-07). Not by quads (qk_heads reads K chunk by chunk, pv_heads V); by parity, QK head
  // after head over the step (qk_step) and PV by pv_heads.
  static constexpr int kStepHeads =
      S::kWidth > 1 && !kQuadK && !kQuadV && !(S::kWidth == 8 && kNG > 4) ? std::min(8, 32 / kNG)
                                                                          : 1;
  template <int kHeads = kStepHeads>
  static void qk_step(const float* q, int q_row, int q_head, int group_padded,
                      const std::byte* const* rows, int64_t head_step, int n, int d_runtime,
                      float* scores, TilePrefetcher* prefetch) {
    if constexpr (kHeads > 1 && kParityK) {
      // Head after head, each head's rows as one head a step reads them (two keys a pass). On Zen
      // 3 the order of qk_heads (4 tokens' rows of every head, then the next 4) ran the bf16
      // llama3 case one thread cache-resident at 1.04x this order's time, and two threads from
      // DRAM at 1.06x the time of one head a step (this order: 0.97-1.00x).
      for (int j = 0; j < kHeads; ++j) {
        qk_tile_parity<S, kDqk, kNG>(q + j * q_head, q_row, group_padded, rows, j * head_step, n,
                                     scores + j * group_padded * kTile, prefetch);
      }
    } else if constexpr (kHeads > 1) {
      qk_heads<S, kKV, kDqk, kNG, kHeads>(q, q_row, q_head, group_padded, rows, head_step, n,
                                          d_runtime, scores, prefetch);
    }
  }
  // (The weights are f32: per-token V scales need no split, `split` is not used.)
  template <int kHeads = kStepHeads>
  static void pv_step(const float* p, int group_padded, const std::byte* const* rows,
                      int64_t head_step, int n, int d_runtime, int64_t elem_stride, float* o,
                      int o_row, int o_head, TilePrefetcher* prefetch, bool /*split*/) {
    pv_heads<S, kKV, kDvo, kNG, kHeads, 8>(p, group_padded, rows, head_step, n, d_runtime,
                                           elem_stride, o, o_row, o_head, prefetch);
  }
  // tick() calls of a step of `heads` heads: one per key and head in each QK pass over a block of
  // up to 4 rows (qk_heads) and in each PV pass over a block of kNG rows.
  static int step_ticks(int group_padded, int heads) {
    const int qk_rows = std::min(kNG, 4);
    return kTile * heads * (group_padded / qk_rows + group_padded / kNG);
  }
};

}  // namespace kvattn::cpu::decode_detail
