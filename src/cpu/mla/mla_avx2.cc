// The MLA item kernel on AVX2 + FMA (f32 arithmetic, 8 lanes). Compiled with only its ISA's
// flags (src/cpu/CMakeLists.txt).
//
// As the AVX-512 kernels, lanes are heads for the scores and every head of the item shares each
// latent tile, read once per sub-tile of kSubKeys keys (widened to f32 once, so the FMAs take
// a broadcast from L1 and the tile plus the item's accumulators stay in a 512 KiB L2):
//   scores  S^T[key][head] = sum_d Q^T[d][head] * K[key][d]  (3 head vectors x 4 keys of
//           accumulators; d in chunks so the query slice stays in L1),
//   softmax vertical over the keys of each head vector (no horizontal reductions),
//   output  O[head][dim] = alpha O + sum_key P[key][head] * V[key][dim]  (4 heads x 3 dim
//           vectors; the value slice stays in L1 while every head block passes over it).
// Everything is f32, as the portable kernel (no rounding of P): only faster.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/element_io.h"
#include "core/math_constants.h"
#include "core/numeric.h"
#include "cpu/common/epilogue.h"
#include "cpu/common/simd_avx2.h"
#include "cpu/mla/mla.h"
#include "cpu/mla/mla_softmax.h"

namespace kvattn::cpu {
namespace {

using avx2::Simd;
constexpr int kSubKeys = 64;   // keys per sub-tile: 64 x 576 f32 = 144 KiB
constexpr int kDimChunk = 192; // query dims per score pass: 3 x 8 heads x 192 x 4 B = 18 KiB
constexpr int kKB = 4;         // keys per score block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
static_assert(kMlaTileKeys % kSubKeys == 0);

// This file's own copy of the element loader (core/element_io.h).
struct Avx2;
float load_one(const std::byte* base, DType dtype, int64_t i) {
  return io::load_f32<Avx2>(base, dtype, i);
}

// n values (n % 8 == 0) of a cache row as f32.
template <DType KV>
inline void widen_row(const std::byte* src, int n, float* dst) {
  for (int i = 0; i < n; i += 8) {
    const std::byte* at = src + static_cast<std::size_t>(i) * dtype_size(KV);
    __m256 v = Simd::load_raw<KV>(at);
    if constexpr (KV == DType::kE4M3) {
      // load_raw reads the NaN code S.1111.111 as 480 * 2^-8: it must stay NaN.
      const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at));
      v = _mm256_mul_ps(v, _mm256_set1_ps(Simd::raw_to_real<KV>()));
      v = _mm256_blendv_ps(v, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                           Simd::e4m3_nan_lanes(codes));
    }
    _mm256_storeu_ps(dst + i, v);
  }
}

// st[k][v-block] for keys [k0, k0 + kKB) += (or =) Q^T[d0, d1) . K[k][d0, d1).
template <int VB>
inline void score_block(const float* qt, int heads, int v0, const float* tile, int dqk, int k0,
                        int d0, int d1, float* st) {
  __m256 acc[kKB][VB];
  for (int k = 0; k < kKB; ++k) {
    for (int v = 0; v < VB; ++v) {
      acc[k][v] = d0 == 0 ? _mm256_setzero_ps()
                          : _mm256_loadu_ps(st + (k0 + k) * heads + (v0 + v) * 8);
    }
  }
  const float* key = tile + static_cast<std::size_t>(k0) * dqk;
  for (int d = d0; d < d1; ++d) {
    __m256 q[VB];
    for (int v = 0; v < VB; ++v) q[v] = _mm256_loadu_ps(qt + d * heads + (v0 + v) * 8);
    for (int k = 0; k < kKB; ++k) {
      const __m256 kk = _mm256_broadcast_ss(key + k * dqk + d);
      for (int v = 0; v < VB; ++v) acc[k][v] = _mm256_fmadd_ps(q[v], kk, acc[k][v]);
    }
  }
  for (int k = 0; k < kKB; ++k) {
    for (int v = 0; v < VB; ++v) _mm256_storeu_ps(st + (k0 + k) * heads + (v0 + v) * 8, acc[k][v]);
  }
}

template <int VB>
void score_heads(const float* qt, int heads, int v0, const float* tile, int dqk, int keys,
                 float* st) {
  for (int d0 = 0; d0 < dqk; d0 += kDimChunk) {
    const int d1 = std::min(dqk, d0 + kDimChunk);
    for (int k0 = 0; k0 < keys; k0 += kKB) score_block<VB>(qt, heads, v0, tile, dqk, k0, d0, d1, st);
  }
}

// O rows [h0, h0 + 4) x dim vectors [z0, z0 + ZB), rescaled by alpha, += P V over `keys` keys.
template <int ZB>
inline void output_block(float* acc, int d_ckv, const float* st, int heads, const float* tile,
                         int dqk, const float* alpha, int h0, int z0, int keys) {
  __m256 o[4][ZB];
  for (int h = 0; h < 4; ++h) {
    const __m256 a = _mm256_set1_ps(alpha[h0 + h]);
    for (int z = 0; z < ZB; ++z) {
      o[h][z] = _mm256_mul_ps(a, _mm256_loadu_ps(acc + (h0 + h) * d_ckv + (z0 + z) * 8));
    }
  }
  for (int j = 0; j < keys; ++j) {
    __m256 v[ZB];
    for (int z = 0; z < ZB; ++z) v[z] = _mm256_loadu_ps(tile + j * dqk + (z0 + z) * 8);
    for (int h = 0; h < 4; ++h) {
      const __m256 p = _mm256_broadcast_ss(st + j * heads + h0 + h);
      for (int z = 0; z < ZB; ++z) o[h][z] = _mm256_fmadd_ps(p, v[z], o[h][z]);
    }
  }
  for (int h = 0; h < 4; ++h) {
    for (int z = 0; z < ZB; ++z) _mm256_storeu_ps(acc + (h0 + h) * d_ckv + (z0 + z) * 8, o[h][z]);
  }
}

template <DType KV>
void item(const MlaParams& p, const WorkItem& w, float* o, float* lse, std::byte* scratch) {
  const int heads = p.heads, d_ckv = p.d_ckv, d_kpe = p.d_kpe, dqk = d_ckv + d_kpe;
  const int nv = heads / 8, nz = d_ckv / 8;
  const int b = w.request;
  const int64_t tokens = w.qo_end - w.qo_begin, rows = tokens * heads;
  const MlaScratch<float, float> s(scratch, d_ckv, d_kpe);

  // Q^T[token][d][head] in f32.
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t row = p.qo_begin[b] + w.qo_begin + t;
    float* qt = s.q + t * dqk * heads;
    for (int h = 0; h < heads; ++h) {
      for (int d = 0; d < d_ckv; ++d) {
        qt[d * heads + h] = load_one(p.q_nope, p.q_dtype, row * p.qn_row + h * p.qn_head + d);
      }
      for (int d = 0; d < d_kpe; ++d) {
        qt[(d_ckv + d) * heads + h] =
            load_one(p.q_pe, p.q_dtype, row * p.qp_row + h * p.qp_head + d);
      }
    }
  }
  std::fill(s.acc, s.acc + rows * d_ckv, 0.0f);
  std::fill(s.m, s.m + rows, kNegInf);
  std::fill(s.l, s.l + rows, 0.0f);

  for (int64_t j0 = w.kv_begin; j0 < w.kv_end; j0 += kSubKeys) {
    const int n = static_cast<int>(std::min<int64_t>(kSubKeys, w.kv_end - j0));
    for (int jj = 0; jj < n; ++jj) {
      float* dst = s.tile + static_cast<std::size_t>(jj) * dqk;
      widen_row<KV>(p.ckv_row(b, j0 + jj), d_ckv, dst);
      widen_row<KV>(p.kpe_row(b, j0 + jj), d_kpe, dst + d_ckv);
    }
    // Score blocks run over whole groups of kKB keys: the rows past n are zeros (their scores
    // are computed and never used).
    const int padded = (n + kKB - 1) / kKB * kKB;
    std::fill(s.tile + static_cast<std::size_t>(n) * dqk,
              s.tile + static_cast<std::size_t>(padded) * dqk, 0.0f);

    for (int64_t t = 0; t < tokens; ++t) {
      const int visible = p.visible_keys(b, w.qo_begin + t, j0, n);
      if (visible == 0) continue;
      const int keys = (visible + kKB - 1) / kKB * kKB;
      const float* qt = s.q + t * dqk * heads;
      int v0 = 0;
      for (; v0 + 3 <= nv; v0 += 3) score_heads<3>(qt, heads, v0, s.tile, dqk, keys, s.st);
      if (nv - v0 == 2) score_heads<2>(qt, heads, v0, s.tile, dqk, keys, s.st);
      if (nv - v0 == 1) score_heads<1>(qt, heads, v0, s.tile, dqk, keys, s.st);

      softmax_columns<Simd>(s.st, heads, visible, visible, p.score_scale_log2, s.m + t * heads,
                            s.l + t * heads, s.alpha);

      float* acc = s.acc + t * heads * d_ckv;
      int z0 = 0;
      for (; z0 + 3 <= nz; z0 += 3) {
        for (int h0 = 0; h0 < heads; h0 += 4) {
          output_block<3>(acc, d_ckv, s.st, heads, s.tile, dqk, s.alpha, h0, z0, visible);
        }
      }
      for (; z0 < nz; ++z0) {
        for (int h0 = 0; h0 < heads; h0 += 4) {
          output_block<1>(acc, d_ckv, s.st, heads, s.tile, dqk, s.alpha, h0, z0, visible);
        }
      }
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    const math::RowFinish fin = finish_row(s.m[r], s.l[r], p.k_scale, false, nullptr);
    const float* a = s.acc + r * d_ckv;
    float* out = o + r * d_ckv;
    for (int d = 0; d < d_ckv; ++d) out[d] = a[d] * fin.o_scale;
    lse[r] = fin.lse;
  }
}

}  // namespace

MlaItemFn find_mla_kernel_avx2(const MlaParams& p) {
  if (p.heads % 8 != 0 || p.heads > kMlaMaxRows || p.d_ckv % 8 != 0 || p.d_kpe % 8 != 0) {
    return nullptr;
  }
  if (p.q_dtype != DType::kBF16 && p.q_dtype != DType::kF16 && p.q_dtype != DType::kF32) {
    return nullptr;
  }
  if (!p.unit_stride_rows()) return nullptr;
  switch (p.kv_dtype) {
    case DType::kBF16:
      return item<DType::kBF16>;
    case DType::kF16:
      return item<DType::kF16>;
    case DType::kE4M3:
      return item<DType::kE4M3>;
    case DType::kE5M2:
      return item<DType::kE5M2>;
    default:
      return nullptr;
  }
}

}  // namespace kvattn::cpu
