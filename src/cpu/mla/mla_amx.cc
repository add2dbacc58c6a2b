// The MLA item kernel on AMX-BF16 tiles (Sapphire Rapids and later), compiled with only its
// ISA's flags. Same data layout as mla_avx512_bf16.cc, with the two products on tiles:
//   S^T[16 keys x 16 heads] += K[16 keys x 32 dims] . Qp[16 dim pairs x 16 heads x 2]
//     (A: the tile's rows, copied contiguous; B: the query pairs, packed once per item),
//   O[16 heads x 16 dims] += P[16 heads x 32 keys] . Vp[16 key pairs x 16 dims x 2]
//     (A: the probabilities, transposed from S^T; B: the value pairs of the AVX-512 kernel).
// One TDPBF16PS does 16 x 16 x 32 multiply-adds: at 16 heads the latent tile no longer waits
// on the dot products (vdpbf16ps needs 32 instructions for the same work).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/cpu_features.h"
#include "cpu/common/simd_avx512.h"
#include "cpu/mla/mla.h"
#include "cpu/mla/mla_e4m3.h"

namespace kvattn::cpu {
namespace {

using avx512::Simd;
constexpr int T = kMlaTileKeys;  // 128 keys: eight score tiles, four probability tiles
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLn2 = 0.6931471805599453f;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows x 64 bytes.
void load_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

std::size_t align64(std::size_t n) { return (n + 63) / 64 * 64; }

struct Scratch {
  uint32_t* qp;
  float* st;
  uint32_t* pp;
  uint16_t* tile;
  uint32_t* vp;
  float* acc;
  float *m, *l, *alpha;
  Scratch(std::byte* s, int d_ckv, int d_kpe) {
    const std::size_t rows = kMlaMaxRows, dqk = static_cast<std::size_t>(d_ckv + d_kpe);
    auto take = [&s](std::size_t bytes) {
      std::byte* p = s;
      s += align64(bytes);
      return p;
    };
    qp = reinterpret_cast<uint32_t*>(take(rows * dqk * 4));
    st = reinterpret_cast<float*>(take(rows * T * 4));
    pp = reinterpret_cast<uint32_t*>(take(rows * T * 4));
    tile = reinterpret_cast<uint16_t*>(take(T * dqk * 4 + dqk * 4));
    vp = reinterpret_cast<uint32_t*>(take(T * static_cast<std::size_t>(d_ckv) * 4));
    acc = reinterpret_cast<float*>(take(rows * static_cast<std::size_t>(d_ckv) * 4));
    m = reinterpret_cast<float*>(take(rows * 4));
    l = reinterpret_cast<float*>(take(rows * 4));
    alpha = reinterpret_cast<float*>(take(rows * 4));
  }
};

// S^T of 16 keys x NG head groups: accumulators in tiles 2..5, the key tile in 0, the query
// pairs alternately in 1 and 6.
template <int NG>
inline void score_groups(const uint16_t* keys, int dqk, const uint32_t* qt, int heads, int v0,
                         int dp_all, float* st) {
  _tile_zero(2);
  if constexpr (NG > 1) _tile_zero(3);
  if constexpr (NG > 2) _tile_zero(4);
  if constexpr (NG > 3) _tile_zero(5);
  const int stride = heads * 4;
  for (int d = 0; d < dp_all; d += 16) {
    _tile_loadd(0, keys + 2 * d, dqk * 2);
    const uint32_t* q = qt + static_cast<std::size_t>(d) * heads + v0 * 16;
    _tile_loadd(1, q, stride);
    _tile_dpbf16ps(2, 0, 1);
    if constexpr (NG > 1) {
      _tile_loadd(6, q + 16, stride);
      _tile_dpbf16ps(3, 0, 6);
    }
    if constexpr (NG > 2) {
      _tile_loadd(1, q + 32, stride);
      _tile_dpbf16ps(4, 0, 1);
    }
    if constexpr (NG > 3) {
      _tile_loadd(6, q + 48, stride);
      _tile_dpbf16ps(5, 0, 6);
    }
  }
  _tile_stored(2, st + v0 * 16, stride);
  if constexpr (NG > 1) _tile_stored(3, st + (v0 + 1) * 16, stride);
  if constexpr (NG > 2) _tile_stored(4, st + (v0 + 2) * 16, stride);
  if constexpr (NG > 3) _tile_stored(5, st + (v0 + 3) * 16, stride);
}

template <DType KV>
inline void row_to_bf16(const std::byte* src, int n, uint16_t* dst) {
  if constexpr (KV == DType::kBF16) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * 2);
  } else if constexpr (KV == DType::kE4M3) {
    e4m3_to_bf16(reinterpret_cast<const uint8_t*>(src), n, dst);
  } else {
    for (int i = 0; i < n; i += 16) {
      const __m512 x = Simd::load_raw<KV>(src + static_cast<std::size_t>(i) * dtype_size(KV));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(x));
    }
  }
}

template <DType KV>
void item(const MlaParams& p, const WorkItem& w, float* o, float* lse, std::byte* scratch) {
  const int heads = p.heads, d_ckv = p.d_ckv, d_kpe = p.d_kpe, dqk = d_ckv + d_kpe;
  const int dpn = d_ckv / 2, dpr = d_kpe / 2, dp_all = dqk / 2;
  const int b = w.request;
  const int64_t tokens = w.qo_end - w.qo_begin, rows = tokens * heads;
  Scratch s(scratch, d_ckv, d_kpe);
  load_tile_config();

  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t row = p.qo_begin[b] + w.qo_begin + t;
    uint32_t* qt = s.qp + t * dp_all * heads;
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

  alignas(64) int16_t interleave[32];
  for (int h = 0; h < 16; ++h) {
    interleave[2 * h] = static_cast<int16_t>(h);
    interleave[2 * h + 1] = static_cast<int16_t>(16 + h);
  }
  const __m512i pair_index = _mm512_load_si512(interleave);
  // P of 16 heads x 16 key pairs per 32 keys of the tile (the A tiles of P V).
  static_assert(T % 32 == 0 && T <= 128, "P V takes up to four 32-key A tiles (0, 3, 4, 5)");
  alignas(64) uint32_t pa[T / 32][16 * 16];

  for (int64_t j0 = w.kv_begin; j0 < w.kv_end; j0 += T) {
    const int n = static_cast<int>(std::min<int64_t>(T, w.kv_end - j0));
    // The tile, contiguous bf16 [T][dqk] (zero rows past its end), then the value pairs.
    for (int jj = 0; jj < T; ++jj) {
      uint16_t* dst = s.tile + static_cast<std::size_t>(jj) * dqk;
      if (jj >= n) {
        std::memset(dst, 0, static_cast<std::size_t>(dqk) * 2);
        continue;
      }
      row_to_bf16<KV>(p.ckv_row(b, j0 + jj), d_ckv, dst);
      row_to_bf16<KV>(p.kpe_row(b, j0 + jj), d_kpe, dst + d_ckv);
    }
    // B tiles take all 16 key pairs: those past the tile's end are zero (their P is 0, and
    // uninitialized memory could hold NaN).
    const int pairs_all = (n + 1) / 2;
    if (pairs_all < T / 2) {
      std::memset(s.vp + static_cast<std::size_t>(pairs_all) * d_ckv, 0,
                  static_cast<std::size_t>(T / 2 - pairs_all) * d_ckv * 4);
    }
    for (int j = 0; j < pairs_all; ++j) {
      const uint16_t* a = s.tile + static_cast<std::size_t>(2 * j) * dqk;
      const uint16_t* c = a + dqk;
      uint32_t* dst = s.vp + static_cast<std::size_t>(j) * d_ckv;
      for (int blk = 0; blk < d_ckv / 32; ++blk) {
        const __m512i ra = _mm512_loadu_si512(a + blk * 32);
        const __m512i rc = _mm512_loadu_si512(c + blk * 32);
        _mm512_storeu_si512(dst + blk * 32, _mm512_unpacklo_epi16(ra, rc));
        _mm512_storeu_si512(dst + blk * 32 + 16, _mm512_unpackhi_epi16(ra, rc));
      }
    }

    for (int64_t t = 0; t < tokens; ++t) {
      int64_t end = p.kv_len[b];
      if (p.causal) {
        end = std::clamp<int64_t>(w.qo_begin + t + p.kv_len[b] - p.qo_len[b] + 1, 0, p.kv_len[b]);
      }
      const int visible = static_cast<int>(std::clamp<int64_t>(end - j0, 0, n));
      if (visible == 0) continue;
      const uint32_t* qt = s.qp + t * dp_all * heads;
      // Scores: per 16 keys and up to 4 head groups, each key tile loaded once for them.
      for (int k0 = 0; k0 < visible; k0 += 16) {
        const uint16_t* keys = s.tile + static_cast<std::size_t>(k0) * dqk;
        float* st = s.st + k0 * heads;
        int v = 0;
        for (; v + 4 <= heads / 16; v += 4) score_groups<4>(keys, dqk, qt, heads, v, dp_all, st);
        if (heads / 16 - v == 3) score_groups<3>(keys, dqk, qt, heads, v, dp_all, st);
        if (heads / 16 - v == 2) score_groups<2>(keys, dqk, qt, heads, v, dp_all, st);
        if (heads / 16 - v == 1) score_groups<1>(keys, dqk, qt, heads, v, dp_all, st);
      }
      float* m = s.m + t * heads;
      float* l = s.l + t * heads;
      const __m512 scale = _mm512_set1_ps(p.score_scale_log2);
      for (int v = 0; v < heads / 16; ++v) {
        const __m512 m_old = _mm512_loadu_ps(m + v * 16);
        __m512 mx = m_old;
        for (int jj = 0; jj < visible; ++jj) {
          const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s.st + jj * heads + v * 16), scale);
          _mm512_storeu_ps(s.st + jj * heads + v * 16, x);
          mx = _mm512_max_ps(mx, x);
        }
        const __m512 a = Simd::exp2(_mm512_sub_ps(m_old, mx));
        __m512 sum = _mm512_setzero_ps();
        for (int jj = 0; jj < T; ++jj) {
          __m512 prob = _mm512_setzero_ps();
          if (jj < visible) {
            prob = Simd::exp2(_mm512_sub_ps(_mm512_loadu_ps(s.st + jj * heads + v * 16), mx));
            sum = _mm512_add_ps(sum, prob);
          }
          _mm512_storeu_ps(s.st + jj * heads + v * 16, prob);
        }
        _mm512_storeu_ps(l + v * 16, _mm512_fmadd_ps(_mm512_loadu_ps(l + v * 16), a, sum));
        _mm512_storeu_ps(m + v * 16, mx);
        _mm512_storeu_ps(s.alpha + v * 16, a);
      }
      float* acc = s.acc + t * heads * d_ckv;
      for (int v = 0; v < heads / 16; ++v) {
        // P pairs of this head group, [key pair][head], then transposed to A [head][key pair].
        for (int j = 0; j < T / 2; ++j) {
          const __m512 lo = _mm512_loadu_ps(s.st + (2 * j) * heads + v * 16);
          const __m512 hi = _mm512_loadu_ps(s.st + (2 * j + 1) * heads + v * 16);
          const __m512i packed = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
          _mm512_storeu_si512(s.pp + j * 16, _mm512_permutexvar_epi16(pair_index, packed));
        }
        const int pairs = (visible + 1) / 2;
        const int blocks = (pairs + 15) / 16;  // 32-key blocks with a visible key
        for (int blk = 0; blk < blocks; ++blk) {
          for (int h = 0; h < 16; ++h) {
            for (int j = 0; j < 16; ++j) pa[blk][h * 16 + j] = s.pp[(blk * 16 + j) * 16 + h];
          }
        }
        // Rescale the group's accumulators by alpha, then O += P V per 16 dims. Once the
        // running max settles, alpha is exactly 1 for every head and the pass is skipped.
        const __mmask16 moved = _mm512_cmp_ps_mask(_mm512_loadu_ps(s.alpha + v * 16),
                                                   _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
        for (int h = 0; h < 16; ++h) {
          if (!((moved >> h) & 1)) continue;
          const __m512 a = _mm512_set1_ps(s.alpha[v * 16 + h]);
          float* row = acc + (v * 16 + h) * d_ckv;
          for (int z = 0; z < d_ckv; z += 16) {
            _mm512_storeu_ps(row + z, _mm512_mul_ps(a, _mm512_loadu_ps(row + z)));
          }
        }
        // One load and store of each 16 x 16 accumulator tile per tile of keys; the value
        // pairs of 32-key block k are B tiles at vp + 16 k rows, alternately in tiles 1 and 7.
        _tile_loadd(0, pa[0], 64);
        if (blocks > 1) _tile_loadd(3, pa[std::min(1, T / 32 - 1)], 64);
        if (blocks > 2) _tile_loadd(4, pa[std::min(2, T / 32 - 1)], 64);
        if (blocks > 3) _tile_loadd(5, pa[std::min(3, T / 32 - 1)], 64);
        const std::size_t block_rows = static_cast<std::size_t>(16) * d_ckv;
        for (int z = 0; z < d_ckv; z += 16) {
          float* c = acc + (v * 16) * d_ckv + z;
          _tile_loadd(2, c, d_ckv * 4);
          _tile_loadd(1, s.vp + z, d_ckv * 4);
          _tile_dpbf16ps(2, 0, 1);
          if (blocks > 1) {
            _tile_loadd(7, s.vp + block_rows + z, d_ckv * 4);
            _tile_dpbf16ps(2, 3, 7);
          }
          if (blocks > 2) {
            _tile_loadd(1, s.vp + 2 * block_rows + z, d_ckv * 4);
            _tile_dpbf16ps(2, 4, 1);
          }
          if (blocks > 3) {
            _tile_loadd(7, s.vp + 3 * block_rows + z, d_ckv * 4);
            _tile_dpbf16ps(2, 5, 7);
          }
          _tile_stored(2, c, d_ckv * 4);
        }
      }
    }
  }
  _tile_release();

  for (int64_t r = 0; r < rows; ++r) {
    const float lr = s.l[r];
    const float scale = lr > 0.0f ? p.k_scale / lr : 0.0f;
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
    lse[r] = lr > 0.0f ? (s.m[r] + std::log2(lr)) * kLn2 : kNegInf;
  }
}

}  // namespace

bool mla_amx_active() { return detail::cpu_features().amx_bf16; }

MlaItemFn find_mla_kernel_amx(const MlaParams& p) {
  if (!mla_amx_active()) return nullptr;
  if (p.q_dtype != DType::kBF16 || p.heads % 16 != 0 || p.heads > kMlaMaxRows ||
      p.d_ckv % 64 != 0 || p.d_kpe % 32 != 0 || p.d_ckv + p.d_kpe > 1024) {
    return nullptr;
  }
  if (p.qn_dim != 1 || p.qp_dim != 1 || p.ckv_dim != 1 || p.kpe_dim != 1) return nullptr;
  switch (p.kv_dtype) {
    case DType::kBF16:
      return item<DType::kBF16>;
    case DType::kE4M3:
      return item<DType::kE4M3>;
    case DType::kE5M2:
      return item<DType::kE5M2>;
    default:
      return nullptr;
  }
}

}  // namespace kvattn::cpu
