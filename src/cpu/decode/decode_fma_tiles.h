// The fp32-FMA QK and PV tiles of the decode kernel (decode_kernel.h), every ISA level and
// dtype: stored K/V rows widened to f32 ("raw", see simd_avx512.h) and FMAs with the f32 queries.
// Also the tile policy that wraps them (FmaTiles), the interface decode_task takes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cpu/decode/decode.h"
#include "cpu/decode/decode_prefetch.h"

namespace kvattn::cpu::decode_detail {

inline constexpr int kTile = kDecodeTileKeys;

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

// scores[g][kk] = q[g] . K row kk (raw), for n keys and every padded query row.
template <class S, DType kKV, int kD, int kNG>
void qk_tile(const float* q, int q_row, int group_padded, const std::byte* const* rows, int n,
             int d_runtime, int64_t elem_stride, float* scores, TilePrefetcher* prefetch) {
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

// o[g] += sum_kk p[g][kk] * V row kk (raw), two column chunks at a time so that 2*kNG FMA chains
// run side by side.
template <class S, DType kKV, int kD, int kNG>
void pv_tile(const float* p, int group_padded, const std::byte* const* rows, int n, int d_runtime,
             int64_t elem_stride, float* o, int o_row, TilePrefetcher* prefetch) {
  using Vec = typename S::Vec;
  constexpr int W = S::kWidth;
  const int dim = kD > 0 ? kD : d_runtime;
  const int full = dim / W, tail = dim % W;
  const int64_t step = int64_t{W} * kElemBytes<kKV> * elem_stride;
  for (int g0 = 0; g0 < group_padded; g0 += kNG) {
    const float* pg = p + g0 * kTile;
    float* og = o + g0 * o_row;
    int c = 0;
    for (; c + 2 <= full; c += 2) {
      Vec acc0[kNG], acc1[kNG];
      for (int g = 0; g < kNG; ++g) {
        acc0[g] = S::load(og + g * o_row + c * W);
        acc1[g] = S::load(og + g * o_row + (c + 1) * W);
      }
      for (int kk = 0; kk < n; ++kk) {
        if (c == 0) prefetch->tick();
        Vec v0, v1;
        load_raw_two<S, kKV>(rows[kk] + c * step, step, &v0, &v1);
        for (int g = 0; g < kNG; ++g) {
          const Vec w = S::set1(pg[g * kTile + kk]);
          acc0[g] = S::fma(w, v0, acc0[g]);
          acc1[g] = S::fma(w, v1, acc1[g]);
        }
      }
      for (int g = 0; g < kNG; ++g) {
        S::store(og + g * o_row + c * W, acc0[g]);
        S::store(og + g * o_row + (c + 1) * W, acc1[g]);
      }
    }
    for (; c < full + (tail ? 1 : 0); ++c) {
      Vec acc[kNG];
      for (int g = 0; g < kNG; ++g) acc[g] = S::load(og + g * o_row + c * W);
      for (int kk = 0; kk < n; ++kk) {
        const Vec v = c < full ? S::template load_raw<kKV>(rows[kk] + c * step)
                               : S::template load_raw_tail<kKV>(rows[kk] + c * step, tail);
        for (int g = 0; g < kNG; ++g) acc[g] = S::fma(S::set1(pg[g * kTile + kk]), v, acc[g]);
      }
      for (int g = 0; g < kNG; ++g) S::store(og + g * o_row + c * W, acc[g]);
    }
  }
}

// How a task's QK and PV tiles are computed: the fp32-FMA tiles (every ISA level, every dtype)
// below; decode_fp8_table.h has bf16 dot-product tiles for FP8 caches. A policy:
//   prepare_q(q, rows, q_row, dqk)  once per head, after the queries are in f32 (in place);
//   qk(...) / pv(...)               one tile, as qk_tile / pv_tile;
//   finish_o(o, rows, o_row, dvo)   once per head, before the epilogue (in place);
//   kKRaw / kVRaw                   the raw-to-real factors of K and V;
//   kPoisonE4m3Nans                 whether the e4m3 NaN codes must be restored after PV.
template <class S, DType kKV, int kDqk, int kDvo, int kNG>
struct FmaTiles {
  static constexpr float kKRaw = S::template raw_to_real<kKV>();
  static constexpr float kVRaw = S::template raw_to_real<kKV>();
  static constexpr bool kPoisonE4m3Nans = kKV == DType::kE4M3 && S::kWidth > 1;
  static void prepare_q(float*, int, int, int) {}
  static void qk(const float* q, int q_row, int group_padded, const std::byte* const* rows, int n,
                 int d_runtime, int64_t elem_stride, float* scores, TilePrefetcher* prefetch) {
    qk_tile<S, kKV, kDqk, kNG>(q, q_row, group_padded, rows, n, d_runtime, elem_stride, scores,
                               prefetch);
  }
  static void pv(const float* p, int group_padded, const std::byte* const* rows, int n,
                 int d_runtime, int64_t elem_stride, float* o, int o_row,
                 TilePrefetcher* prefetch) {
    pv_tile<S, kKV, kDvo, kNG>(p, group_padded, rows, n, d_runtime, elem_stride, o, o_row,
                               prefetch);
  }
  static void finish_o(float*, int, int, int) {}
};

}  // namespace kvattn::cpu::decode_detail
