// The AVX2 decode tiles for blocks of 4 query rows (GQA groups of 3 and 4) that read a row's
// values out of order: bf16 rows by parity, e4m3 rows by quads (simd_avx2.h's loads), QK two keys
// a pass. The fp32-FMA tile policy (FmaTiles, decode_fma_tiles.h) takes them where kParityRows /
// kQuadRows hold, the generic qk_tile / pv_tile elsewhere.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/numeric.h"
#include "cpu/decode/decode.h"
#include "cpu/decode/decode_prefetch.h"

namespace kvattn::cpu::decode_detail {

inline constexpr int kTile = kDecodeTileKeys;

// Whether the tiles read bf16 rows of dim kD by parity (S::load_bf16_parity, AVX2 only) for
// blocks of kNG query rows: each block of 16 values as its even-indexed values, then its
// odd-indexed ones, where kD is a multiple of 16 known at compile time. The dot products and the
// output columns then run in that order: q is stored in it (FmaTiles::prepare_q), the output
// accumulators come out in it (finish_o puts them back). One 256-bit load and two ALU operations
// a pair of vectors, where load_raw takes a widening load and a shift each, and QK takes two keys
// a pass (qk_tile_parity). Blocks of 4 rows only (GQA groups of 3 and 4): on Zen 3 they ran the
// bf16 cases from DRAM 0.89-0.97x the time (B 16 x 4k at d 64 / 128, B 1 x 32k, B 64 x 512; d 256
// 0.97-1.00; issue 23's Zen 3 note of 2026-12-06); blocks of 1, 2 and 8 rows read so ran 1.04-1.10x
// cache-resident.
template <class S>
inline constexpr bool kHasParityLoads = requires(const void* p, typename S::Vec* v) {
  S::load_bf16_parity(p, v, v);
};
template <class S, DType kKV, int kD, int kNG>
inline constexpr bool kParityRows = kHasParityLoads<S> &&
                                    (kKV == DType::kBF16 && kD > 0 && kD % 16 == 0 && kNG == 4);

// Whether the tiles read e4m3 K or V rows of dim kD by quads (S::load_e4m3_quads, AVX2 only) for
// blocks of kNG query rows: each block of 32 codes as 4 vectors, vector k the codes k, k + 4, ..,
// k + 28, by shifts and masks where load_raw_pair converts through f16 (vcvtph2ps): q is stored in
// that order (FmaTiles::prepare_q), the output accumulators run in it (finish_o puts them back). A
// code's raw value is 2^-120 of its value (exponent-0 codes f32 denormals), so the other operand
// is multiplied by a power of two on the way in, every product that matters then an f32 normal
// (FTZ or not): the weights by kQuadWeightFold (products down to 2^-66 of the weights' scale;
// kVRaw is 2^120 / kQuadWeightFold), the queries by 2^quad_query_fold_exponent (FmaTiles::fold_q:
// the scores' factor then depends on the task's queries). Blocks of 4 rows (GQA groups of 3 and
// 4), as the bf16 parity tiles.
template <class S>
inline constexpr bool kHasQuadLoads = requires(const void* p, typename S::Vec* v) {
  S::template load_e4m3_quads<0>(p, v, v);
};
template <class S, DType kKV, int kD, int kNG>
inline constexpr bool kQuadRows = kHasQuadLoads<S> &&
                                  (kKV == DType::kE4M3 && kD > 0 && kD % 32 == 0 && kNG == 4);
inline constexpr float kQuadWeightFold = 0x1p60f;
// Weights above this (per-token V scales past 2^56) would overflow once folded: such a tile takes
// the scalar path.
inline constexpr float kQuadMaxWeight = 0x1p64f;
// The exponent e of the power of two the queries of a task are multiplied by where K is read by
// quads (FmaTiles::fold_q), from the largest |q|: that one brought into [2^63, 2^64), so every
// product of a query and a code above 2^-70 of the largest query's is an f32 normal whatever the
// queries' scale; e within [-7, 120], so that the scores' factor 2^(120 - e) is an f32.
inline int quad_query_fold_exponent(float largest) {
  if (!(largest > 0.0f)) return 60;  // all zero, or a NaN (the scores are NaN whatever the fold)
  return std::clamp(63 - std::ilogb(largest), -7, 120);
}

// The QK tiles that take two keys a pass, blocks of 4 query rows (qk_tile_parity, qk_tile_quads),
// over the rows at rows[kk] + offset bytes (offset: the head within a step, FmaTiles::qk_step):
// for each pair of keys, pair(qg, first, second, acc) adds the keys' products with the block's
// queries (qg, q_row apart) into acc[0] (the first key's 4 rows) and acc[1]; the sums are reduced
// 8 keys at a time into scores. Past `count` the pair's first key is read again (its sums are
// dropped).
template <class S, int kNG, class Pair>
[[gnu::always_inline]] inline void qk_tile_pairs(const float* q, int q_row, int group_padded,
                                                 const std::byte* const* rows, int64_t offset,
                                                 int n, float* scores, TilePrefetcher* prefetch,
                                                 Pair&& pair) {
  using Vec = typename S::Vec;
  constexpr int W = S::kWidth;
  static_assert(W == 8 && kNG == 4);
  for (int g0 = 0; g0 < group_padded; g0 += kNG) {
    const float* qg = q + g0 * q_row;
    for (int kb = 0; kb < n; kb += W) {
      Vec parts[kNG][W];
      const int count = std::min(W, n - kb);
      for (int k0 = 0; k0 < count; k0 += 2) {
        const std::byte* first = rows[kb + k0] + offset;
        const std::byte* second = k0 + 1 < count ? rows[kb + k0 + 1] + offset : first;
        prefetch->tick();
        if (k0 + 1 < count) prefetch->tick();
        Vec acc[2][kNG];
        for (int g = 0; g < kNG; ++g) acc[0][g] = acc[1][g] = S::zero();
        pair(qg, first, second, acc);
        for (int g = 0; g < kNG; ++g) {
          parts[g][k0] = acc[0][g];
          parts[g][k0 + 1] = acc[1][g];  // k0 is even, W = 8
        }
      }
      for (int kk = count; kk < W; ++kk) {
        for (int g = 0; g < kNG; ++g) parts[g][kk] = S::zero();
      }
      for (int g = 0; g < kNG; ++g)
        S::store(scores + (g0 + g) * kTile + kb, S::reduce_rows(parts[g]));
    }
  }
}

// acc[0][g] += qg row g's vectors at `at` and at + 8 times k0[0] and k0[1], acc[1][g] the same
// with k1: each query vector loaded into a register once for both keys (the empty asm keeps GCC
// from folding its load into each FMA).
template <class S, int kNG>
[[gnu::always_inline]] inline void fma_two_keys(const float* qg, int q_row, int at,
                                                const typename S::Vec* k0,
                                                const typename S::Vec* k1,
                                                typename S::Vec (&acc)[2][kNG]) {
  for (int g = 0; g < kNG; ++g) {
    auto qa = S::load(qg + g * q_row + at);
    S::in_register(qa);
    acc[0][g] = S::fma(qa, k0[0], acc[0][g]);
    acc[1][g] = S::fma(qa, k1[0], acc[1][g]);
    auto qb = S::load(qg + g * q_row + at + 8);
    S::in_register(qb);
    acc[0][g] = S::fma(qb, k0[1], acc[0][g]);
    acc[1][g] = S::fma(qb, k1[1], acc[1][g]);
  }
}

// qk_tile over bf16 K rows read by parity (kParityRows; q in parity order; rows[kk] + offset
// bytes), blocks of 4 query rows: two keys a pass (8 accumulators), each 16-value block of the
// keys' rows loaded once and each query vector once for both keys (qk_tile loads every query
// vector once a key).
template <class S, int kD, int kNG>
[[gnu::always_inline]] inline void qk_tile_parity(const float* q, int q_row, int group_padded,
                                                  const std::byte* const* rows, int64_t offset,
                                                  int n, float* scores, TilePrefetcher* prefetch) {
  using Vec = typename S::Vec;
  static_assert(kD % 16 == 0);
  qk_tile_pairs<S, kNG>(
      q, q_row, group_padded, rows, offset, n, scores, prefetch,
      [&](const float* qg, const std::byte* first, const std::byte* second,
          Vec(&acc)[2][kNG]) __attribute__((always_inline)) {
        for (int b = 0; b < kD / 16; ++b) {
          Vec k0[2], k1[2];  // even, odd
          S::load_bf16_parity(first + b * 32, &k0[0], &k0[1]);
          S::load_bf16_parity(second + b * 32, &k1[0], &k1[1]);
          fma_two_keys<S, kNG>(qg, q_row, b * 16, k0, k1, acc);
        }
      });
}

// qk_tile over e4m3 K rows read by quads (kQuadRows; q in quad order and folded: fold_q), blocks
// of 4 query rows: two keys a pass (8 accumulators), each 32-code block in two halves (quads 0
// and 1, then 2 and 3: 4 K vectors and 2 query vectors a half, within AVX2's 16 registers), each
// query vector loaded once for both keys. The caller clears DAZ (the codes' denormals). Returns
// whether one of the n rows holds the e4m3 NaN code (probed on the way: poison_e4m3_nans).
template <class S, int kD, int kNG>
[[gnu::always_inline]] inline bool qk_tile_quads(const float* q, int q_row, int group_padded,
                                                 const std::byte* const* rows, int n,
                                                 float* scores, TilePrefetcher* prefetch) {
  using Vec = typename S::Vec;
  static_assert(kD % 32 == 0);
  Vec nan_probe = S::zero();
  qk_tile_pairs<S, kNG>(
      q, q_row, group_padded, rows, 0, n, scores, prefetch,
      [&](const float* qg, const std::byte* first, const std::byte* second,
          Vec(&acc)[2][kNG]) __attribute__((always_inline)) {
        for (int b = 0; b < kD / 32; ++b) {
          Vec k0[2], k1[2];  // quads 0 and 1, then 2 and 3
          S::template load_e4m3_quads<0>(first + b * 32, &k0[0], &k0[1], &nan_probe);
          S::template load_e4m3_quads<0>(second + b * 32, &k1[0], &k1[1], &nan_probe);
          fma_two_keys<S, kNG>(qg, q_row, b * 32, k0, k1, acc);
          S::template load_e4m3_quads<1>(first + b * 32, &k0[0], &k0[1]);
          S::template load_e4m3_quads<1>(second + b * 32, &k1[0], &k1[1]);
          fma_two_keys<S, kNG>(qg, q_row, b * 32 + 16, k0, k1, acc);
        }
      });
  return S::e4m3_nan_probed(nan_probe);
}

// og[g][the half's two quads of each 32-code block] += sum_kk w[g][kk] * those quads of V row kk
// (raw), w the folded weights (kTile a row), one 32-byte load a key and block; the first half
// folds the rows' codes into *nan_probe (S::load_e4m3_quads).
template <class S, int kD, int kNG, int kHalf>
[[gnu::always_inline]] inline void pv_quads_half(const float* w, const std::byte* const* rows,
                                                 int n, float* og, int o_row,
                                                 TilePrefetcher* prefetch,
                                                 typename S::Vec* nan_probe) {
  using Vec = typename S::Vec;
  for (int c = 0; c < kD / 32; ++c) {
    float* at = og + c * 32 + kHalf * 16;
    Vec acc[kNG][2];
    for (int g = 0; g < kNG; ++g) {
      acc[g][0] = S::load(at + g * o_row);
      acc[g][1] = S::load(at + g * o_row + 8);
    }
    for (int kk = 0; kk < n; ++kk) {
      if (kHalf == 0 && c == 0) prefetch->tick();
      Vec a, b;
      if constexpr (kHalf == 0) {
        S::template load_e4m3_quads<0>(rows[kk] + c * 32, &a, &b, nan_probe);
      } else {
        S::template load_e4m3_quads<1>(rows[kk] + c * 32, &a, &b);
      }
      for (int g = 0; g < kNG; ++g) {
        const Vec x = S::set1(w[g * kTile + kk]);
        acc[g][0] = S::fma(x, a, acc[g][0]);
        acc[g][1] = S::fma(x, b, acc[g][1]);
      }
    }
    for (int g = 0; g < kNG; ++g) {
      S::store(at + g * o_row, acc[g][0]);
      S::store(at + g * o_row + 8, acc[g][1]);
    }
  }
}

// pv_tile over e4m3 V rows read by quads (kQuadRows; o in quad order, in units of 2^-60 of the
// value): the weights folded (kQuadWeightFold) into a copy, then each block of 32 codes in two
// passes over the keys (quads 0 and 1, then 2 and 3: 8 accumulators, as the parity tiles).
// Returns whether the n rows may hold the e4m3 NaN code (probed by the passes; the scalar path's
// columns are NaN already).
template <class S, int kD, int kNG>
[[gnu::always_inline]] inline bool pv_tile_quads(const float* p, int group_padded,
                                                 const std::byte* const* rows, int n, float* o,
                                                 int o_row, TilePrefetcher* prefetch) {
  using Vec = typename S::Vec;
  constexpr int W = S::kWidth;
  static_assert(W == 8 && kD % 32 == 0 && kNG == 4);
  const int n_vec = (n + W - 1) / W * W;  // softmax_rows wrote the lanes past n (weight 0)
  Vec nan_probe = S::zero();
  for (int g0 = 0; g0 < group_padded; g0 += kNG) {
    const float* pg = p + g0 * kTile;
    float* og = o + g0 * o_row;
    alignas(32) float w[kNG * kTile];
    // The largest |weight|: a NaN weight is passed over (max takes its second operand where one
    // is NaN), and propagates through the FMAs as the reference's does.
    Vec most = S::zero();
    for (int g = 0; g < kNG; ++g) {
      for (int kb = 0; kb < n_vec; kb += W) {
        const Vec x = S::load(pg + g * kTile + kb);
        most = S::max(S::max(x, S::sub(S::zero(), x)), most);
        S::store(w + g * kTile + kb, S::mul(x, S::set1(kQuadWeightFold)));
      }
    }
    if (S::reduce_max(most) > kQuadMaxWeight) {
      // Scalar: o += weight * value * 2^-60 (a NaN code's column NaN, as poison_e4m3_nans makes
      // it).
      for (int kk = 0; kk < n; ++kk) {
        prefetch->tick();
        const auto* codes = reinterpret_cast<const uint8_t*>(rows[kk]);
        for (int d = 0; d < kD; ++d) {
          const float v = num::e4m3_to_f32(codes[d]) * (1.0f / kQuadWeightFold);
          const int at = S::quad_position(d);
          for (int g = 0; g < kNG; ++g) og[g * o_row + at] += pg[g * kTile + kk] * v;
        }
      }
      continue;
    }
    S::with_denormal_inputs([&] {
      pv_quads_half<S, kD, kNG, 0>(w, rows, n, og, o_row, prefetch, &nan_probe);
      pv_quads_half<S, kD, kNG, 1>(w, rows, n, og, o_row, prefetch, &nan_probe);
    });
  }
  return S::e4m3_nan_probed(nan_probe);
}

}  // namespace kvattn::cpu::decode_detail
