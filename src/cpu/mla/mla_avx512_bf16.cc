// The MLA item kernel on AVX512_BF16 (vdpbf16ps: two exact bf16 x bf16 products per f32 lane,
// accumulated in f32). Compiled with only its ISA's flags (src/cpu/CMakeLists.txt).
//
// Lanes are heads. Scores: S^T[key][head] = sum over dim pairs of Qp[pair][head] . K[key][pair],
// where Qp holds each head's (q[2p], q[2p+1]) as one dword (packed once per item) and the key's
// pair is one dword of its cache row, broadcast straight from the cache (bf16) or from a bf16
// copy of the tile (fp8, widened exactly). So the tile is read once for all heads and needs no
// transpose, and the softmax over keys is vertical (no horizontal reductions).
// Output: O[head][dim] += sum over key pairs of (P[head][j], P[head][j+1]) . (V[j][dim],
// V[j+1][dim]): P packed into key pairs per head (one permute per pair of score vectors), V
// interleaved by key pairs once per tile (unpacklo/hi of two rows, so within each 32-dim block
// the accumulator lanes hold dims in a fixed permuted order, undone when the item is written).
// P is rounded to bf16 before P V, as a bf16 MMA kernel does (testing/baseline.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/cpu_features.h"
#include "core/math_constants.h"
#include "cpu/common/epilogue.h"
#include "cpu/common/simd_avx512.h"
#include "cpu/mla/mla.h"
#include "cpu/mla/mla_bf16_pairs.h"
#include "cpu/mla/mla_softmax.h"

namespace kvattn::cpu {
namespace {

using avx512::Simd;
constexpr int T = kMlaTileKeys;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }
inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, as_bh(a), as_bh(b));
}
inline __m512i bcast_dword(const uint16_t* pair) {
  int32_t v;
  std::memcpy(&v, pair, 4);
  return _mm512_set1_epi32(v);
}

// S^T for key block [k0, k0 + KB) and head vectors [v0, v0 + VB) of one token.
template <int VB, int KB>
inline void score_block(const uint32_t* qp, int heads, int v0, const uint16_t* const* kn,
                        const uint16_t* const* kr, int k0, int dpn, int dpr, float* st) {
  __m512 acc[KB][VB];
  for (int k = 0; k < KB; ++k)
    for (int v = 0; v < VB; ++v) acc[k][v] = _mm512_setzero_ps();
  for (int d = 0; d < dpn; ++d) {
    __m512i q[VB];
    for (int v = 0; v < VB; ++v) q[v] = _mm512_loadu_si512(qp + d * heads + (v0 + v) * 16);
    for (int k = 0; k < KB; ++k) {
      const __m512i key = bcast_dword(kn[k0 + k] + 2 * d);
      for (int v = 0; v < VB; ++v) acc[k][v] = dp(acc[k][v], q[v], key);
    }
  }
  const uint32_t* qr = qp + int64_t{dpn} * heads;
  for (int d = 0; d < dpr; ++d) {
    __m512i q[VB];
    for (int v = 0; v < VB; ++v) q[v] = _mm512_loadu_si512(qr + d * heads + (v0 + v) * 16);
    for (int k = 0; k < KB; ++k) {
      const __m512i key = bcast_dword(kr[k0 + k] + 2 * d);
      for (int v = 0; v < VB; ++v) acc[k][v] = dp(acc[k][v], q[v], key);
    }
  }
  for (int k = 0; k < KB; ++k)
    for (int v = 0; v < VB; ++v) _mm512_storeu_ps(st + (k0 + k) * heads + (v0 + v) * 16, acc[k][v]);
}

template <int VB>
void scores(const uint32_t* qp, int heads, const uint16_t* const* kn, const uint16_t* const* kr,
            int keys, int dpn, int dpr, float* st) {
  constexpr int KB = 16 / VB;
  for (int v0 = 0; v0 < heads / 16; v0 += VB) {
    for (int k0 = 0; k0 < keys; k0 += KB)
      score_block<VB, KB>(qp, heads, v0, kn, kr, k0, dpn, dpr, st);
  }
}

// O rows [h0, h0 + 4) x zmm [z0, z0 + 4) += P V over key pairs [0, pairs), after the rescale.
inline void output_block(float* acc, int d_ckv, const uint32_t* pp, int heads, const uint32_t* vp,
                         const float* alpha, int h0, int z0, int pairs) {
  __m512 o[4][4];
  for (int h = 0; h < 4; ++h) {
    const __m512 a = _mm512_set1_ps(alpha[h0 + h]);
    for (int z = 0; z < 4; ++z) {
      o[h][z] = _mm512_mul_ps(a, _mm512_loadu_ps(acc + (h0 + h) * d_ckv + (z0 + z) * 16));
    }
  }
  for (int j = 0; j < pairs; ++j) {
    __m512i v[4];
    for (int z = 0; z < 4; ++z) v[z] = _mm512_loadu_si512(vp + j * d_ckv + (z0 + z) * 16);
    for (int h = 0; h < 4; ++h) {
      const __m512i pr = _mm512_set1_epi32(static_cast<int32_t>(pp[j * heads + h0 + h]));
      for (int z = 0; z < 4; ++z) o[h][z] = dp(o[h][z], pr, v[z]);
    }
  }
  for (int h = 0; h < 4; ++h)
    for (int z = 0; z < 4; ++z) _mm512_storeu_ps(acc + (h0 + h) * d_ckv + (z0 + z) * 16, o[h][z]);
}

template <DType KV, int VB>
void item(const MlaParams& p, const WorkItem& w, float* o, float* lse, std::byte* scratch) {
  const int heads = p.heads, d_ckv = p.d_ckv, d_kpe = p.d_kpe, dqk = d_ckv + d_kpe;
  const int dpn = d_ckv / 2, dpr = d_kpe / 2, dp_all = dqk / 2;
  const int b = w.request;
  const int64_t tokens = w.qo_end - w.qo_begin, rows = tokens * heads;
  const MlaScratch<uint32_t, uint16_t> s(scratch, d_ckv, d_kpe);
  uint16_t* zero_row = s.tile + static_cast<std::size_t>(T) * dqk;
  std::memset(zero_row, 0, static_cast<std::size_t>(dqk) * 2);

  // Query pairs: Qp[token][pair][head] = (q[h][2p], q[h][2p+1]).
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t row = p.qo_begin[b] + w.qo_begin + t;
    uint32_t* qt = s.q + t * dp_all * heads;
    for (int h = 0; h < heads; ++h) {
      const auto* qn = reinterpret_cast<const uint16_t*>(p.q_nope) + row * p.qn_row + h * p.qn_head;
      const auto* qr = reinterpret_cast<const uint16_t*>(p.q_pe) + row * p.qp_row + h * p.qp_head;
      for (int d = 0; d < dpn; ++d) std::memcpy(qt + d * heads + h, qn + 2 * d, 4);
      for (int d = 0; d < dpr; ++d) std::memcpy(qt + (dpn + d) * heads + h, qr + 2 * d, 4);
    }
  }
  std::fill(s.acc, s.acc + rows * d_ckv, 0.0f);
  std::fill(s.m, s.m + rows, kNegInf);
  std::fill(s.l, s.l + rows, 0.0f);

  // Probability pairs: dword h = (P[j][h], P[j+1][h]).
  const __m512i interleave = _mm512_load_si512(kPairInterleave);
  const uint16_t* kn[T];
  const uint16_t* kr[T];

  for (int64_t j0 = w.kv_begin; j0 < w.kv_end; j0 += T) {
    const int n = static_cast<int>(std::min<int64_t>(T, w.kv_end - j0));
    // The tile's rows: the cache itself (bf16) or the bf16 copy; zero rows past its end.
    for (int jj = 0; jj < T; ++jj) {
      if (jj >= n) {
        kn[jj] = zero_row;
        kr[jj] = zero_row;
        continue;
      }
      const std::byte* c = p.ckv_row(b, j0 + jj);
      const std::byte* r = p.kpe_row(b, j0 + jj);
      if constexpr (KV == DType::kBF16) {
        kn[jj] = reinterpret_cast<const uint16_t*>(c);
        kr[jj] = reinterpret_cast<const uint16_t*>(r);
      } else {
        uint16_t* dst = s.tile + static_cast<std::size_t>(jj) * dqk;
        row_to_bf16<KV>(c, d_ckv, dst);
        row_to_bf16<KV>(r, d_kpe, dst + d_ckv);
        kn[jj] = dst;
        kr[jj] = dst + d_ckv;
      }
    }
    // Value pairs: within each 32-dim block, unpacklo/hi of rows j, j+1.
    const int pairs_all = (n + 1) / 2;
    for (int j = 0; j < pairs_all; ++j) {
      pair_rows(kn[2 * j], kn[2 * j + 1], d_ckv, s.vp + static_cast<std::size_t>(j) * d_ckv);
    }

    for (int64_t t = 0; t < tokens; ++t) {
      const int visible = p.visible_keys(b, w.qo_begin + t, j0, n);
      if (visible == 0) continue;
      const int keys = (visible + 15) / 16 * 16;  // whole key blocks; the rest masked below
      scores<VB>(s.q + t * dp_all * heads, heads, kn, kr, std::min(keys, T), dpn, dpr, s.st);
      softmax_columns<Simd>(s.st, heads, visible, T, p.score_scale_log2, s.m + t * heads,
                            s.l + t * heads, s.alpha);
      const int pairs = (visible + 1) / 2;
      for (int j = 0; j < pairs; ++j) {
        for (int v = 0; v < heads / 16; ++v) {
          const __m512 lo = _mm512_loadu_ps(s.st + (2 * j) * heads + v * 16);
          const __m512 hi = _mm512_loadu_ps(s.st + (2 * j + 1) * heads + v * 16);
          _mm512_storeu_si512(s.pp + j * heads + v * 16, bf16_pairs(lo, hi, interleave));
        }
      }
      float* acc = s.acc + t * heads * d_ckv;
      for (int h0 = 0; h0 < heads; h0 += 4) {
        for (int z0 = 0; z0 < d_ckv / 16; z0 += 4) {
          output_block(acc, d_ckv, s.pp, heads, s.vp, s.alpha, h0, z0, pairs);
        }
      }
    }
  }

  // Normalize, dequantize, undo the dim permutation of the value pairs.
  for (int64_t r = 0; r < rows; ++r) {
    const float lr = s.l[r];
    const math::RowFinish fin = finish_row(s.m[r], lr, p.k_scale, false, nullptr);
    const float scale = fin.o_scale;
    const float* a = s.acc + r * d_ckv;
    float* out = o + r * d_ckv;
    for (int blk = 0; blk < d_ckv / 32; ++blk) {
      for (int lane = 0; lane < 4; ++lane) {
        for (int e = 0; e < 4; ++e) {
          out[blk * 32 + lane * 8 + e] = a[blk * 32 + lane * 4 + e] * scale;
          out[blk * 32 + lane * 8 + 4 + e] = a[blk * 32 + 16 + lane * 4 + e] * scale;
        }
      }
    }
    lse[r] = fin.lse;
  }
}

template <DType KV>
MlaItemFn pick(int heads) {
  const int vectors = heads / 16;
  if (vectors % 4 == 0) return item<KV, 4>;
  if (vectors % 2 == 0) return item<KV, 2>;
  return item<KV, 1>;
}

}  // namespace

bool mla_e4m3_to_bf16(const uint8_t* codes, int n, uint16_t* bf16) {
  e4m3_to_bf16(codes, n, bf16);
  return true;
}

MlaItemFn find_mla_kernel_avx512_bf16(const MlaParams& p) {
  if (!detail::cpu_features().avx512_bf16) return nullptr;
  if (p.q_dtype != DType::kBF16 || p.heads % 16 != 0 || p.heads > kMlaMaxRows ||
      p.d_ckv % 64 != 0 || p.d_kpe % 16 != 0 || p.d_ckv + p.d_kpe > 1024) {
    return nullptr;
  }
  if (!p.unit_stride_rows()) return nullptr;
  switch (p.kv_dtype) {
    case DType::kBF16:
      return pick<DType::kBF16>(p.heads);
    case DType::kE4M3:
      return pick<DType::kE4M3>(p.heads);
    case DType::kE5M2:
      return pick<DType::kE5M2>(p.heads);
    default:
      return nullptr;
  }
}

}  // namespace kvattn::cpu
