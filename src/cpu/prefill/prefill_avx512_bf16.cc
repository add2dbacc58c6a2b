// The prefill kernel for bf16 queries over bf16 or fp8 K/V on AVX-512 with AVX512_BF16: both
// products, S = Q K^T and O = P V, run on vdpbf16ps, two exact bf16 x bf16 products per f32 lane
// and instruction, accumulated in f32 (twice the f32 FMA rate). P is rounded to bf16 before P V,
// as a 16-bit MMA consumes it on a GPU (and as the tolerance's baseline does); the row sums use
// the unrounded P. Everything else (masks, soft cap, ALiBi, online softmax, epilogue) is the
// f32 kernel's code from kernel.h (with the numerics policy's guard, masked_values.h).
//
// Layout: the pairs of a dot product sit in one dword. Q^T holds (q[r][2p], q[r][2p+1]) at
// [p][r], which a bf16 row already stores side by side, so K rows are broadcast straight from
// the cache (bf16) or from a bf16 copy of the tile (fp8, exact). P and V pair keys instead:
// P^T (P[r][2p], P[r][2p+1]) at [p][r], V (V[2p][d], V[2p+1][d]) at [p][d].
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/prefill/params.h"
#include "cpu/common/simd_avx512.h"

namespace kvattn::cpu::prefill::avx512_bf16 {
namespace {

#include "cpu/prefill/avx512_vec.h"  // before the kernel body, which uses Vec
#include "cpu/prefill/kernel.h"

inline uint32_t load_u32(const unsigned char* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

// S^T[kb][rows] = sum_p dot2(K[kb] pair p, Q^T pair p) for KB keys and RV row vectors.
template <int KB, int RV>
inline void score_block(const unsigned char* const* k_rows, int pairs, const uint32_t* qp,
                        int64_t rows_pad, float* st) {
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
inline void value_block(const uint32_t* vp, int dim_vo, const uint32_t* pp, int64_t rows_pad,
                        int pairs, float* ot) {
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
inline void score_rows(const unsigned char* const* k_rows, int pairs, const uint32_t* qp,
                       int64_t rows_pad, int keys, float* st) {
  constexpr int KB = Vec::kKeyBlock;
  static_assert(KB == 6, "the tail switch below covers blocks of 6 keys");
  int j = 0;
  for (; j + KB <= keys; j += KB)
    score_block<KB, RV>(k_rows + j, pairs, qp, rows_pad, st + j * rows_pad);
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

inline void scores(const unsigned char* const* k_rows, int pairs, const uint32_t* qp,
                   int64_t rows_pad, int row_vecs, int keys, float* st) {
  constexpr int RV = Vec::kRowVecs;
  int rv = 0;
  for (; rv + RV <= row_vecs; rv += RV) {
    score_rows<RV>(k_rows, pairs, qp + rv * Vec::W, rows_pad, keys, st + rv * Vec::W);
  }
  for (; rv < row_vecs; ++rv) {
    score_rows<1>(k_rows, pairs, qp + rv * Vec::W, rows_pad, keys, st + rv * Vec::W);
  }
}

inline void accumulate_values(const uint32_t* vp, int dim_vo, const uint32_t* pp, int64_t rows_pad,
                              int row_vecs, int pairs, float* ot) {
  constexpr int RV = Vec::kRowVecs, DB = Vec::kDvBlock;
  int rv = 0;
  for (; rv + RV <= row_vecs; rv += RV) {
    int d = 0;
    for (; d + DB <= dim_vo; d += DB) {
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

// Q^T pairs for the tile (bf16 queries: a pair is one dword of the row); padding rows are 0.
inline void stage_query_pairs(const PrefillParams& p, const RequestInfo& req, int kv_head,
                              const TileRows& t, float* scratch) {
  auto* qp = reinterpret_cast<uint32_t*>(scratch + p.scratch.qt);
  const int pairs = p.head_dim_qk / 2;
  for (int r = 0; r < t.rows_pad; ++r) {
    if (r >= t.rows) {
      for (int pr = 0; pr < pairs; ++pr) qp[pr * t.rows_pad + r] = 0;
      continue;
    }
    const unsigned char* q = query_row(p, req, t, r / p.group, kv_head * p.group + r % p.group);
    for (int pr = 0; pr < pairs; ++pr) qp[pr * t.rows_pad + r] = load_u32(q + 4 * pr);
  }
}

// Top halves of f32 values that are exactly bf16 (widened fp8): the bf16 bits.
inline void f32_to_bf16_exact(const float* src, int n, uint16_t* dst) {
  int i = 0;
  for (; i + Vec::W <= n; i += Vec::W) {
    const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(Vec::load(src + i)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(bits));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512i bits =
        _mm512_srli_epi32(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i)), 16);
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(bits));
  }
}

// A K or V row as bf16 bits: the cache row itself for bf16, else widened (exactly) into `buffer`.
inline const uint16_t* bf16_row(const PrefillParams& p, const void* row, int dim, float* tmp,
                                uint16_t* buffer) {
  if (p.kv_dtype == DType::kBF16) return static_cast<const uint16_t*>(row);
  load_row(row, p.kv_dtype, dim, 1, 1.0f, tmp);
  f32_to_bf16_exact(tmp, dim, buffer);
  return buffer;
}

// The K row pointers of the tile (into the cache for bf16, else into the bf16 copy in the K
// tile buffer) and the V pairs.
inline void stage_kv_tile_bf16(const PrefillParams& p, const RequestInfo& req, int kv_head,
                               int64_t j0, int keys, const unsigned char** k_rows, float* scratch) {
  auto* k_copy = reinterpret_cast<uint16_t*>(scratch + p.scratch.kf);
  auto* vp = reinterpret_cast<uint32_t*>(scratch + p.scratch.vf);
  float* tmp = scratch + p.scratch.row_tmp;
  const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  for (int jj = 0; jj < keys; ++jj) {
    k_rows[jj] = reinterpret_cast<const unsigned char*>(
        bf16_row(p, kv_row(p, p.k, req, j0 + jj, kv_head), dqk, tmp, k_copy + jj * dqk));
  }
  // Rows 2p and 2p + 1 interleaved; an odd tail pairs with zeros.
  auto* row_a = reinterpret_cast<uint16_t*>(scratch + p.scratch.pair_rows);
  uint16_t* row_b = row_a + dvo;
  uint16_t* zeros = row_b + dvo;
  if (keys % 2 != 0) std::memset(zeros, 0, sizeof(uint16_t) * dvo);
  for (int jj = 0; jj < keys; jj += 2) {
    const uint16_t* a = bf16_row(p, kv_row(p, p.v, req, j0 + jj, kv_head), dvo, tmp, row_a);
    const uint16_t* b =
        jj + 1 < keys ? bf16_row(p, kv_row(p, p.v, req, j0 + jj + 1, kv_head), dvo, tmp, row_b)
                      : zeros;
    uint32_t* out = vp + (jj / 2) * dvo;
    int d = 0;
    for (; d + Vec::W <= dvo; d += Vec::W) {
      const __m512i lo =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d)));
      const __m512i hi =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d)));
      _mm512_storeu_si512(out + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    for (; d < dvo; ++d) out[d] = uint32_t(a[d]) | (uint32_t(b[d]) << 16);
  }
}

// The online softmax of kernel.h's softmax_update fused with the score scale (c > 0, so the
// max of c * s is c times the max of s) and with the packing of P into bf16 pairs over keys,
// written in place: pair row p is stored after rows 2p and 2p + 1 of S were read, and no later
// step reads them. The row sums add the unrounded P.
inline void softmax_pack(const PrefillParams& p, const TileRows& t, int keys, float scale,
                         float* scratch) {
  using R = Vec::Reg;
  float* st = scratch + p.scratch.st;
  float* ot = scratch + p.scratch.ot;
  float* row_max = scratch + p.scratch.row_max;
  float* row_sum = scratch + p.scratch.row_sum;
  const R c = Vec::set1(scale);
  const __m512i round_bias = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  // Round to nearest even (P is finite and >= 0), the bf16 in the top half.
  auto rounded = [&](R x) {
    const __m512i u = _mm512_castps_si512(x);
    return _mm512_add_epi32(
        u, _mm512_add_epi32(round_bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
  };
  for (int rv = 0; rv < t.row_vecs; ++rv) {
    float* s = st + rv * Vec::W;
    const R old_max = Vec::load(row_max + rv * Vec::W);
    R raw_max = Vec::set1(kNegInf);
    for (int jj = 0; jj < keys; ++jj) raw_max = Vec::max(raw_max, Vec::load(s + jj * t.rows_pad));
    const R new_max = Vec::max(old_max, Vec::mul(raw_max, c));
    const R base = Vec::zero_if_neg_inf(new_max);
    const R neg_base = Vec::sub(Vec::zero(), base);
    R sum = Vec::load(row_sum + rv * Vec::W);
    if (Vec::any_greater(new_max, old_max)) {
      const R alpha = Vec::exp2(Vec::sub(old_max, base));
      sum = Vec::mul(sum, alpha);
      for (int d = 0; d < p.head_dim_vo; ++d) {
        float* o = ot + d * t.rows_pad + rv * Vec::W;
        Vec::store(o, Vec::mul(Vec::load(o), alpha));
      }
    }
    for (int jj = 0; jj < keys; jj += 2) {
      const R a = Vec::exp2(Vec::fma(Vec::load(s + jj * t.rows_pad), c, neg_base));
      const R b = jj + 1 < keys
                      ? Vec::exp2(Vec::fma(Vec::load(s + (jj + 1) * t.rows_pad), c, neg_base))
                      : Vec::zero();
      sum = Vec::add(sum, Vec::add(a, b));
      const __m512i pair = _mm512_or_si512(_mm512_srli_epi32(rounded(a), 16),
                                           _mm512_and_si512(rounded(b), high_half));
      _mm512_storeu_si512(s + (jj / 2) * t.rows_pad, pair);
    }
    Vec::store(row_sum + rv * Vec::W, sum);
    Vec::store(row_max + rv * Vec::W, new_max);
  }
}

inline void scale_scores(const TileRows& t, int keys, float scale, float* st) {
  const __m512 s = Vec::set1(scale);
  for (int jj = 0; jj < keys; ++jj) {
    for (int rv = 0; rv < t.row_vecs; ++rv) {
      float* x = st + jj * t.rows_pad + rv * Vec::W;
      Vec::store(x, Vec::mul(Vec::load(x), s));
    }
  }
}

inline void run_tile_bf16(const PrefillParams& p, const RequestInfo& req, int kv_head,
                          const TileRows& t, float* scratch) {
  init_rows(p, req, kv_head, t, scratch);
  stage_query_pairs(p, req, kv_head, t, scratch);
  const KeyRange keys = key_range(p, req, t);
  const bool transform = p.soft_cap > 0.0f || p.alibi_slopes_log2e;
  // The dot products see stored q and k: their scales join the score scale.
  const float k_scale = p.k_head_scale ? p.k_head_scale[kv_head] : p.k_scale;
  const float v_scale = p.v_head_scale ? p.v_head_scale[kv_head] : p.v_scale;
  const float score_scale = p.q_scale * k_scale * p.qk_scale;
  const int kv_tile = p.tile.kv_tile;
  const unsigned char* k_rows[kMaxKVTile];
  float* st = scratch + p.scratch.st;
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kv_tile) {
    const int n = static_cast<int>(imin(kv_tile, keys.end - j0));
    stage_kv_tile_bf16(p, req, kv_head, j0, n, k_rows, scratch);
    if (j0 + kv_tile < keys.end) {
      prefetch_kv_tile(p, req, kv_head, j0 + kv_tile,
                       static_cast<int>(imin(kv_tile, keys.end - j0 - kv_tile)));
    }
    scores(k_rows, p.head_dim_qk / 2, reinterpret_cast<const uint32_t*>(scratch + p.scratch.qt),
           t.rows_pad, t.row_vecs, n, st);
    // The soft cap and ALiBi act on scaled scores; otherwise the scale rides along the softmax.
    float softmax_scale = score_scale;
    if (transform) {
      scale_scores(t, n, score_scale, st);
      transform_scores(p, t, j0, n, scratch);
      softmax_scale = 1.0f;
    }
    const bool full = j0 >= keys.full_begin && j0 + n <= keys.full_end;
    if (!full) mask_scores(p, req, t, j0, n, scratch);
    softmax_pack(p, t, n, softmax_scale, scratch);
    // The numerics policy (masked_values.h): only a tile that masks a key checks its V.
    auto* vp = reinterpret_cast<uint32_t*>(scratch + p.scratch.vf);
    if (!full && any_non_finite_pairs(vp, int64_t{(n + 1) / 2} * p.head_dim_vo)) {
      add_non_finite_pair_values(n, t.rows, t.rows_pad, p.head_dim_vo,
                                 reinterpret_cast<uint32_t*>(st), vp, scratch + p.scratch.ot);
    }
    accumulate_values(vp, p.head_dim_vo, reinterpret_cast<const uint32_t*>(st), t.rows_pad,
                      t.row_vecs, (n + 1) / 2, scratch + p.scratch.ot);
  }
  store_tile(p, req, kv_head, t, v_scale, scratch);
}

inline void run_item_bf16(const PrefillParams& p, const WorkItem& item, float* scratch) {
  run_tiles<&run_tile_bf16>(p, item, scratch);
}

}  // namespace
}  // namespace kvattn::cpu::prefill::avx512_bf16

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_avx512_bf16() { return &avx512_bf16::run_item_bf16; }
}  // namespace kvattn::cpu::prefill
