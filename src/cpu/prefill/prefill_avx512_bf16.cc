// The prefill kernel for bf16 queries over bf16 or fp8 K/V on AVX-512 with AVX512_BF16: both
// products, S = Q K^T and O = P V, run on vdpbf16ps, two exact bf16 x bf16 products per f32 lane
// and instruction, accumulated in f32 (twice the f32 FMA rate). The pair layout, the packed
// softmax and the tile loop are bf16_pairs.h's (shared with the AMX kernel); here K rows are
// broadcast straight from the cache (bf16) or from a bf16 copy of the tile (fp8, exact); with
// per-(token, head) scales V is staged times its scale as two bf16 (SplitDotProducts).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/numeric.h"
#include "cpu/common/simd_avx512.h"
#include "cpu/prefill/params.h"

namespace kvattn::cpu::prefill::avx512_bf16 {
namespace {

#include "cpu/prefill/avx512_vec.h"  // before the kernel body, which uses Vec
#include "cpu/prefill/kernel.h"
#include "cpu/prefill/bf16_pairs.h"

// The products' functions are always inlined: with two tile loops calling them (DotProducts and
// SplitDotProducts below) GCC kept them out of line, and the plain bf16 prefill ran 0.92x on
// Zen 5.

// S^T[kb][rows] = sum_p dot2(K[kb] pair p, Q^T pair p) for KB keys and RV row vectors.
template <int KB, int RV>
[[gnu::always_inline]] inline void score_block(const unsigned char* const* k_rows, int pairs,
                                               const uint32_t* qp, int64_t rows_pad, float* st) {
  __m512 acc[KB][RV];
  for (int kb = 0; kb < KB; ++kb) {
    for (int rv = 0; rv < RV; ++rv) acc[kb][rv] = _mm512_setzero_ps();
  }
  for (int pr = 0; pr < pairs; ++pr) {
    __m512bh q[RV];
    for (int rv = 0; rv < RV; ++rv) {
      q[rv] = (__m512bh)_mm512_loadu_si512(qp + pr * rows_pad + rv * Vec::W);
    }
    for (int kb = 0; kb < KB; ++kb) {
      const __m512bh k =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(load_u32(k_rows[kb] + 4 * pr)));
      for (int rv = 0; rv < RV; ++rv) acc[kb][rv] = _mm512_dpbf16_ps(acc[kb][rv], q[rv], k);
    }
  }
  for (int kb = 0; kb < KB; ++kb) {
    for (int rv = 0; rv < RV; ++rv) Vec::store(st + kb * rows_pad + rv * Vec::W, acc[kb][rv]);
  }
}

// O^T[db][rows] += sum_p dot2(P^T pair p, V pair p column db) for DB columns, RV row vectors.
template <int DB, int RV>
[[gnu::always_inline]] inline void value_block(const uint32_t* vp, int dim_vo, const uint32_t* pp,
                                               int64_t rows_pad, int pairs, float* ot) {
  __m512 acc[DB][RV];
  for (int db = 0; db < DB; ++db) {
    for (int rv = 0; rv < RV; ++rv) acc[db][rv] = Vec::load(ot + db * rows_pad + rv * Vec::W);
  }
  for (int pr = 0; pr < pairs; ++pr) {
    __m512bh pv[RV];
    for (int rv = 0; rv < RV; ++rv) {
      pv[rv] = (__m512bh)_mm512_loadu_si512(pp + pr * rows_pad + rv * Vec::W);
    }
    for (int db = 0; db < DB; ++db) {
      const __m512bh v = (__m512bh)_mm512_set1_epi32(static_cast<int>(vp[pr * dim_vo + db]));
      for (int rv = 0; rv < RV; ++rv) acc[db][rv] = _mm512_dpbf16_ps(acc[db][rv], pv[rv], v);
    }
  }
  for (int db = 0; db < DB; ++db) {
    for (int rv = 0; rv < RV; ++rv) Vec::store(ot + db * rows_pad + rv * Vec::W, acc[db][rv]);
  }
}

// Key blocks of KB, then the rest of the keys in one smaller block.
template <int RV>
[[gnu::always_inline]] inline void score_rows(const unsigned char* const* k_rows, int pairs,
                                              const uint32_t* qp, int64_t rows_pad, int keys,
                                              float* st, NextTilePrefetch& pf) {
  constexpr int KB = Vec::kKeyBlock;
  static_assert(KB == 6, "the tail switch below covers blocks of 6 keys");
  int j = 0;
  for (; j + KB <= keys; j += KB) {
    pf.step();
    score_block<KB, RV>(k_rows + j, pairs, qp, rows_pad, st + j * rows_pad);
  }
  float* s = st + j * rows_pad;
  switch (keys - j) {
    case 5:
      return score_block<5, RV>(k_rows + j, pairs, qp, rows_pad, s);
    case 4:
      return score_block<4, RV>(k_rows + j, pairs, qp, rows_pad, s);
    case 3:
      return score_block<3, RV>(k_rows + j, pairs, qp, rows_pad, s);
    case 2:
      return score_block<2, RV>(k_rows + j, pairs, qp, rows_pad, s);
    case 1:
      return score_block<1, RV>(k_rows + j, pairs, qp, rows_pad, s);
    default:
      return;
  }
}

[[gnu::always_inline]] inline void scores(const unsigned char* const* k_rows, int pairs,
                                          const uint32_t* qp, int64_t rows_pad, int row_vecs,
                                          int keys, float* st, NextTilePrefetch& pf) {
  constexpr int RV = Vec::kRowVecs;
  int rv = 0;
  for (; rv + RV <= row_vecs; rv += RV) {
    score_rows<RV>(k_rows, pairs, qp + rv * Vec::W, rows_pad, keys, st + rv * Vec::W, pf);
  }
  for (; rv < row_vecs; ++rv) {
    score_rows<1>(k_rows, pairs, qp + rv * Vec::W, rows_pad, keys, st + rv * Vec::W, pf);
  }
}

[[gnu::always_inline]] inline void accumulate_values(const uint32_t* vp, int dim_vo,
                                                     const uint32_t* pp, int64_t rows_pad,
                                                     int row_vecs, int pairs, float* ot,
                                                     NextTilePrefetch& pf) {
  constexpr int RV = Vec::kRowVecs, DB = Vec::kDvBlock;
  int rv = 0;
  for (; rv + RV <= row_vecs; rv += RV) {
    int d = 0;
    for (; d + DB <= dim_vo; d += DB) {
      pf.step();
      value_block<DB, RV>(vp + d, dim_vo, pp + rv * Vec::W, rows_pad, pairs,
                          ot + d * rows_pad + rv * Vec::W);
    }
    for (; d + 2 <= dim_vo; d += 2) {
      value_block<2, RV>(vp + d, dim_vo, pp + rv * Vec::W, rows_pad, pairs,
                         ot + d * rows_pad + rv * Vec::W);
    }
    for (; d < dim_vo; ++d) {
      value_block<1, RV>(vp + d, dim_vo, pp + rv * Vec::W, rows_pad, pairs,
                         ot + d * rows_pad + rv * Vec::W);
    }
  }
  for (; rv < row_vecs; ++rv) {
    int d = 0;
    for (; d + DB <= dim_vo; d += DB) {
      value_block<DB, 1>(vp + d, dim_vo, pp + rv * Vec::W, rows_pad, pairs,
                         ot + d * rows_pad + rv * Vec::W);
    }
    for (; d < dim_vo; ++d) {
      value_block<1, 1>(vp + d, dim_vo, pp + rv * Vec::W, rows_pad, pairs,
                        ot + d * rows_pad + rv * Vec::W);
    }
  }
}

// Per-(token, head) V scales: each V row times its token's scale in f32 (as the f32 kernel
// stages it), taken as two bf16, hi = bf16(x) and lo = bf16(x - hi) (0 where hi is inf or NaN,
// which hi carries alone), paired over keys like stage_value_pairs: the hi pairs at `hi`, the lo
// pairs at `lo`. P V then runs once over each (twice the products): x to ~2^-17 of it, where one
// bf16 would round the scale (up to 2^-9 of the dominant key's value; the tolerance's baseline,
// P rounded and V dequantized in f32, does not err there).
inline void stage_split_value_pairs(const PrefillParams& p, const RequestInfo& req, int kv_head,
                                    int64_t j0, int keys, float* scratch, uint32_t* hi,
                                    uint32_t* lo) {
  float* row = scratch + p.scratch.row_tmp;
  const int dvo = p.head_dim_vo;
  auto* first = reinterpret_cast<uint16_t*>(scratch + p.scratch.pair_rows);  // [2][dvo]: hi, lo
  // x as (hi, lo) bf16 words, for 16 values.
  auto split = [](__m512 x, __m256i* h, __m256i* l) {
    *h = (__m256i)_mm512_cvtneps_pbh(x);
    const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(*h), 16));
    *l = (__m256i)_mm512_cvtneps_pbh(
        _mm512_maskz_sub_ps(~_mm512_fpclass_ps_mask(back, 0x99), x, back));
  };
  auto split_one = [](float x, uint16_t* h, uint16_t* l) {
    *h = num::f32_to_bf16(x);
    const float back = num::bf16_to_f32(*h);
    *l = std::isfinite(back) ? num::f32_to_bf16(x - back) : 0;
  };
  for (int jj = 0; jj < keys; jj += 2) {
    const float scale_a = token_scale(p, p.v_token_scale, req, j0 + jj, kv_head);
    load_row_as_f32<Vec>(kv_row(p, p.v, req, j0 + jj, kv_head), p.kv_dtype, dvo, p.v.strides.dim,
                         scale_a, row);
    int d = 0;
    for (; d + Vec::W <= dvo; d += Vec::W) {
      __m256i h, l;
      split(Vec::load(row + d), &h, &l);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(first + d), h);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(first + dvo + d), l);
    }
    for (; d < dvo; ++d) split_one(row[d], first + d, first + dvo + d);
    if (jj + 1 < keys) {
      const float scale_b = token_scale(p, p.v_token_scale, req, j0 + jj + 1, kv_head);
      load_row_as_f32<Vec>(kv_row(p, p.v, req, j0 + jj + 1, kv_head), p.kv_dtype, dvo,
                           p.v.strides.dim, scale_b, row);
    } else {
      std::memset(row, 0, sizeof(float) * dvo);
    }
    uint32_t* out_hi = hi + (jj / 2) * dvo;
    uint32_t* out_lo = lo + (jj / 2) * dvo;
    auto pair = [](const uint16_t* a, __m256i b) {
      return _mm512_or_si512(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    };
    d = 0;
    for (; d + Vec::W <= dvo; d += Vec::W) {
      __m256i h, l;
      split(Vec::load(row + d), &h, &l);
      _mm512_storeu_si512(out_hi + d, pair(first + d, h));
      _mm512_storeu_si512(out_lo + d, pair(first + dvo + d, l));
    }
    for (; d < dvo; ++d) {
      uint16_t h, l;
      split_one(row[d], &h, &l);
      out_hi[d] = uint32_t(first[d]) | (uint32_t(h) << 16);
      out_lo[d] = uint32_t(first[dvo + d]) | (uint32_t(l) << 16);
    }
  }
}

// The vdpbf16ps products: K as row pointers (into the cache for bf16, else into the bf16 copy in
// the K tile buffer).
struct DotProducts {
  const unsigned char* k_rows[kMaxKVTile];
  NextTilePrefetch pf;

  void prefetch_next(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0,
                     int keys) {
    pf.plan(p, req, kv_head, j0, keys);
  }

  void stage_keys(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0, int keys,
                  float* scratch) {
    auto* k_copy = reinterpret_cast<uint16_t*>(scratch + p.scratch.kf);
    float* tmp = scratch + p.scratch.row_tmp;
    const int dqk = p.head_dim_qk;
    for (int jj = 0; jj < keys; ++jj) {
      k_rows[jj] = reinterpret_cast<const unsigned char*>(
          bf16_row(p, kv_row(p, p.k, req, j0 + jj, kv_head), dqk, tmp, k_copy + jj * dqk));
    }
  }
  void stage(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0, int keys,
             float* scratch) {
    stage_keys(p, req, kv_head, j0, keys, scratch);
    stage_value_pairs(p, req, kv_head, j0, keys, scratch);
  }
  void scores(const PrefillParams& p, const TileRows& t, int keys, float* scratch) {
    pf.spread(register_blocks(t.row_vecs, keys, p.head_dim_vo));
    ::kvattn::cpu::prefill::avx512_bf16::scores(
        k_rows, p.head_dim_qk / 2, reinterpret_cast<const uint32_t*>(scratch + p.scratch.qt),
        t.rows_pad, t.row_vecs, keys, scratch + p.scratch.st, pf);
  }
  void values(const PrefillParams& p, const TileRows& t, int keys, float* scratch) {
    accumulate_values(reinterpret_cast<const uint32_t*>(scratch + p.scratch.vf), p.head_dim_vo,
                      reinterpret_cast<const uint32_t*>(scratch + p.scratch.st), t.rows_pad,
                      t.row_vecs, (keys + 1) / 2, scratch + p.scratch.ot, pf);
    pf.finish();
  }
};

// The same products over per-(token, head) scales (a type of its own, so that DotProducts' code
// stays as it was). K's scales multiply the tile's scores per key (the products see the stored
// K); V's are staged into the V pairs split in two (stage_split_value_pairs: the hi pairs where
// the V pairs go, the lo pairs in the rest of the V tile buffer, which holds kv_tile + 32 f32
// rows where the pairs take kv_tile / 2), and P V runs over both.
struct SplitDotProducts : DotProducts {
  float key_scale[kMaxKVTile];

  static uint32_t* lo_pairs(const PrefillParams& p, float* scratch) {
    return reinterpret_cast<uint32_t*>(scratch + p.scratch.vf) +
           int64_t{(p.tile.kv_tile + 1) / 2} * p.head_dim_vo;
  }
  void stage(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0, int keys,
             float* scratch) {
    stage_keys(p, req, kv_head, j0, keys, scratch);
    for (int jj = 0; jj < keys; ++jj) {
      key_scale[jj] = token_scale(p, p.k_token_scale, req, j0 + jj, kv_head);
    }
    stage_split_value_pairs(p, req, kv_head, j0, keys, scratch,
                            reinterpret_cast<uint32_t*>(scratch + p.scratch.vf),
                            lo_pairs(p, scratch));
  }
  void scores(const PrefillParams& p, const TileRows& t, int keys, float* scratch) {
    DotProducts::scores(p, t, keys, scratch);
    float* st = scratch + p.scratch.st;
    for (int jj = 0; jj < keys; ++jj) {
      const __m512 ks = Vec::set1(key_scale[jj]);
      for (int rv = 0; rv < t.row_vecs; ++rv) {
        float* x = st + jj * t.rows_pad + rv * Vec::W;
        Vec::store(x, Vec::mul(Vec::load(x), ks));
      }
    }
  }
  void values(const PrefillParams& p, const TileRows& t, int keys, float* scratch) {
    const auto* pp = reinterpret_cast<const uint32_t*>(scratch + p.scratch.st);
    accumulate_values(reinterpret_cast<const uint32_t*>(scratch + p.scratch.vf), p.head_dim_vo, pp,
                      t.rows_pad, t.row_vecs, (keys + 1) / 2, scratch + p.scratch.ot, pf);
    accumulate_values(lo_pairs(p, scratch), p.head_dim_vo, pp, t.rows_pad, t.row_vecs,
                      (keys + 1) / 2, scratch + p.scratch.ot, pf);
    pf.finish();
  }
};

inline void run_item_bf16(const PrefillParams& p, const WorkItem& item, float* scratch) {
  if (p.v_token_scale.base != nullptr) {
    run_tiles<&run_tile_pairs<SplitDotProducts>>(p, item, scratch);
  } else {
    run_tiles<&run_tile_pairs<DotProducts>>(p, item, scratch);
  }
}

}  // namespace
}  // namespace kvattn::cpu::prefill::avx512_bf16

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_avx512_bf16() { return &avx512_bf16::run_item_bf16; }
}  // namespace kvattn::cpu::prefill
