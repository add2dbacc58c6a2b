// The prefill kernel for bf16 queries over bf16 or fp8 K/V on AVX-512 with AVX512_BF16: both
// products, S = Q K^T and O = P V, run on vdpbf16ps, two exact bf16 x bf16 products per f32 lane
// and instruction, accumulated in f32 (twice the f32 FMA rate). The pair layout, the packed
// softmax and the tile loop are bf16_pairs.h's (shared with the AMX kernel); here K rows are
// broadcast straight from the cache (bf16) or from a bf16 copy of the tile (fp8, exact); with
// per-(token, head) scales P carries V's scales, as two bf16 (SplitDotProducts).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/common/bf16_split.h"
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

// acc + dot2(x, the pair at `pair` broadcast): one vdpbf16ps with an embedded broadcast, for a
// single row vector, where each broadcast pair meets one product (GCC keeps a separate
// vpbroadcastd; folded, a 16-row tile ran 0.91-0.98x on Zen 4).
[[gnu::always_inline]] inline __m512 dot_broadcast(__m512 acc, __m512bh x, const void* pair) {
  __asm__("vdpbf16ps %2%{1to16%}, %1, %0"
          : "+v"(acc)
          : "v"(x), "m"(*static_cast<const uint32_t*>(pair)));
  return acc;
}

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
      if constexpr (RV == 1) {
        acc[kb][0] = dot_broadcast(acc[kb][0], q[0], k_rows[kb] + 4 * pr);
        continue;
      }
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
      if constexpr (RV == 1) {
        acc[db][0] = dot_broadcast(acc[db][0], pv[0], vp + pr * dim_vo + db);
        continue;
      }
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

// Each block of rows over the keys it can see (VisibleKeys, f32_products.h).
[[gnu::always_inline]] inline void scores(const unsigned char* const* k_rows, int pairs,
                                          const uint32_t* qp, int64_t rows_pad, int row_vecs,
                                          int keys, float* st, NextTilePrefetch& pf,
                                          const VisibleKeys& visible) {
  constexpr int RV = Vec::kRowVecs, W = Vec::W;
  int rv = 0;
  for (; rv + RV <= row_vecs; rv += RV) {
    score_rows<RV>(k_rows, pairs, qp + rv * W, rows_pad, visible.of((rv + RV) * W - 1, keys),
                   st + rv * W, pf);
  }
  for (; rv < row_vecs; ++rv) {
    score_rows<1>(k_rows, pairs, qp + rv * W, rows_pad, visible.of((rv + 1) * W - 1, keys),
                  st + rv * W, pf);
  }
}

// P pairs of `keys` keys; each block of rows over the pairs of the keys it can see.
[[gnu::always_inline]] inline void accumulate_values(const uint32_t* vp, int dim_vo,
                                                     const uint32_t* pp, int64_t rows_pad,
                                                     int row_vecs, int keys, float* ot,
                                                     NextTilePrefetch& pf,
                                                     const VisibleKeys& visible) {
  constexpr int RV = Vec::kRowVecs, DB = Vec::kDvBlock, W = Vec::W;
  int rv = 0;
  for (; rv + RV <= row_vecs; rv += RV) {
    const int pairs = (visible.of((rv + RV) * W - 1, keys) + 1) / 2;
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
    const int pairs = (visible.of((rv + 1) * W - 1, keys) + 1) / 2;
    int d = 0;
    for (; d + DB <= dim_vo; d += DB) {
      pf.step();
      value_block<DB, 1>(vp + d, dim_vo, pp + rv * Vec::W, rows_pad, pairs,
                         ot + d * rows_pad + rv * Vec::W);
    }
    for (; d < dim_vo; ++d) {
      value_block<1, 1>(vp + d, dim_vo, pp + rv * Vec::W, rows_pad, pairs,
                        ot + d * rows_pad + rv * Vec::W);
    }
  }
}

// The vdpbf16ps products: K as row pointers (into the cache for bf16, else into the bf16 copy in
// the K tile buffer).
struct DotProducts {
  const unsigned char* k_rows[kMaxKVTile];

  int steps(const PrefillParams& p, const TileRows& t, int keys) const {
    return register_blocks(t.row_vecs, keys, p.head_dim_vo);
  }

  void stage(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0, int keys,
             float* scratch) {
    auto* k_copy = reinterpret_cast<uint16_t*>(scratch + p.scratch.kf);
    float* tmp = scratch + p.scratch.row_tmp;
    const int dqk = p.head_dim_qk;
    KeyCursor key(p, req, j0);
    for (int jj = 0; jj < keys; ++jj, key.next()) {
      k_rows[jj] = reinterpret_cast<const unsigned char*>(
          bf16_row(p, key.row(p.k, kv_head), dqk, tmp, k_copy + jj * dqk));
    }
    stage_value_pairs(p, req, kv_head, j0, keys, scratch);
  }
  void scores(const PrefillParams& p, const TileRows& t, int keys, float* scratch,
              const VisibleKeys& visible, NextTilePrefetch& pf) {
    ::kvattn::cpu::prefill::avx512_bf16::scores(
        k_rows, p.head_dim_qk / 2, reinterpret_cast<const uint32_t*>(scratch + p.scratch.qt),
        t.rows_pad, t.row_vecs, keys, scratch + p.scratch.st, pf, visible);
  }
  void values(const PrefillParams& p, const TileRows& t, int keys, float* scratch,
              const VisibleKeys& visible, NextTilePrefetch& pf) {
    accumulate_values(reinterpret_cast<const uint32_t*>(scratch + p.scratch.vf), p.head_dim_vo,
                      reinterpret_cast<const uint32_t*>(scratch + p.scratch.st), t.rows_pad,
                      t.row_vecs, keys, scratch + p.scratch.ot, pf, visible);
  }
};

// The same products over per-(token, head) scales (a type of its own, so that DotProducts' code
// stays as it was): K's scales multiply the tile's scores per key (the products see the stored
// K); V's are folded into P, split in two by softmax_pack<true> (bf16_pairs.h), and P V runs over
// both parts.
struct SplitDotProducts : DotProducts {
  float value_scale[kMaxKVTile];
  float key_scale[kMaxKVTile];

  const float* value_scales() const { return value_scale; }
  void stage(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0, int keys,
             float* scratch) {
    DotProducts::stage(p, req, kv_head, j0, keys, scratch);
    for (int jj = 0; jj < keys; ++jj) {
      key_scale[jj] = token_scale(p, p.k_token_scale, req, j0 + jj, kv_head);
      value_scale[jj] = token_scale(p, p.v_token_scale, req, j0 + jj, kv_head);
    }
  }
  void scores(const PrefillParams& p, const TileRows& t, int keys, float* scratch,
              const VisibleKeys& visible, NextTilePrefetch& pf) {
    DotProducts::scores(p, t, keys, scratch, visible, pf);
    float* st = scratch + p.scratch.st;
    for (int jj = 0; jj < keys; ++jj) {
      const __m512 ks = Vec::set1(key_scale[jj]);
      for (int rv = 0; rv < t.row_vecs; ++rv) {
        float* x = st + jj * t.rows_pad + rv * Vec::W;
        Vec::store(x, Vec::mul(Vec::load(x), ks));
      }
    }
  }
  void values(const PrefillParams& p, const TileRows& t, int keys, float* scratch,
              const VisibleKeys& visible, NextTilePrefetch& pf) {
    auto* vp = reinterpret_cast<uint32_t*>(scratch + p.scratch.vf);
    const int pairs = (keys + 1) / 2;
    auto pass = [&](int64_t pairs_at) {
      accumulate_values(vp, p.head_dim_vo, reinterpret_cast<const uint32_t*>(scratch + pairs_at),
                        t.rows_pad, t.row_vecs, keys, scratch + p.scratch.ot, pf, visible);
    };
    pass(p.scratch.st);
    // The low parts meet V with its infinities zeroed (split_bf16; the tile's V is not read
    // after this), where the cache can hold any (e5m2; e4m3 has none).
    if (p.kv_dtype == DType::kE5M2) {
      const int64_t words = int64_t{pairs} * p.head_dim_vo;  // u32: two bf16 each
      for (int64_t i = 0; i < words; i += 16) {
        const __mmask16 m = words - i >= 16 ? 0xFFFF : (1u << (words - i)) - 1;
        _mm512_mask_storeu_epi32(vp + i, m,
                                 without_infinities(_mm512_maskz_loadu_epi32(m, vp + i)));
      }
    }
    pass(p.scratch.p_lo);
  }
};

inline void run_item_bf16(const PrefillParams& p, const WorkItem* items, int heads,
                          float* scratch) {
  if (p.v_token_scale.base != nullptr) {
    run_task<&run_tile_pairs<SplitDotProducts>>(p, items, heads, scratch);
  } else {
    run_task<&run_tile_pairs<DotProducts>>(p, items, heads, scratch);
  }
}

}  // namespace
}  // namespace kvattn::cpu::prefill::avx512_bf16

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_avx512_bf16() { return &avx512_bf16::run_item_bf16; }
}  // namespace kvattn::cpu::prefill
