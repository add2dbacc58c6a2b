// The MLA item kernel on AMX-BF16 tiles (Sapphire Rapids and later), compiled with only its
// ISA's flags. Both products on TDPBF16PS (16 x 16 x 32 multiply-adds, f32 accumulation), each
// as blocks of 2 x 2 accumulator tiles (four independent chains: one TDPBF16PS's latency is about
// three times its issue interval) over two A and two B tiles:
//   S^T[keys x heads] = K[keys x D_qk] . Q^T pairs[D_qk / 2 x heads x 2]
//     (A: 16 key rows read where they lie in the cache when they are one strided run of bf16,
//      else widened / copied into a bf16 tile buffer; B: the query pairs, packed once per item),
//   O[heads x D_ckv] += P[heads x keys] . V pairs[keys / 2 x D_ckv x 2]
//     (A: P packed by the softmax as bf16 pairs and transposed in registers; B: the ckv pairs of
//      the tile, interleaved once per tile).
// O stays in the scratch (f32); each of its tiles is loaded and stored once per KV tile and per
// query token. The running max moves lazily (only past kRescaleSlack log2 units), so O is
// rescaled only when a head's scores jump. The next KV tile is prefetched into L2 a few lines per
// tile step, so the DRAM stream overlaps the tile products.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/cpu_features.h"
#include "core/math_constants.h"
#include "cpu/common/amx.h"
#include "cpu/common/epilogue.h"
#include "cpu/common/simd_avx512.h"
#include "cpu/common/workspace.h"
#include "cpu/mla/mla.h"
#include "cpu/mla/mla_bf16_pairs.h"

namespace kvattn::cpu {
namespace {

using amx::load_tile_config;
using avx512::Simd;
using avx512::transpose16;
constexpr int T = kMlaTileKeys;  // keys per KV tile
constexpr int kGroups = T / 16;  // 16-key row blocks of a tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The running max moves only where a tile's scores pass it by more than this (log2 units): below
// that P = 2^(s - max) <= 256 stays exact enough in bf16 and f32, and O is not rescaled.
constexpr float kRescaleSlack = 8.0f;
// Row paddings (in 4-byte words) that keep the 16 rows of a tile off a few L1 sets: rows 2 KiB
// apart would all fall in two of the 64 sets.
constexpr int kRowPad = 16;
// The score product runs over the dims in this many parts, so that the K rows of a pair of row
// blocks (32 x D_qk / kDimParts bf16: 18 KiB) stay in L1 while every head group's query pairs
// pass (measured on the DeepSeek shape: ~5 % faster than one part; 3 or 6 parts no better).
constexpr int kDimParts = 2;

// The scratch of one item (inside mla_kernel_scratch_bytes).
struct Scratch {
  uint32_t* qp;    // Q^T pairs per token [D_qk / 2][heads]
  float* st;       // S^T [T][heads]
  uint32_t* pa;    // P pairs [heads][T / 2] (A tiles of P V)
  uint16_t* tile;  // bf16 K rows [T][D_qk] of the row blocks not read from the cache
  uint32_t* vp;    // V pairs [T / 2][vp_stride]
  float* acc;      // O [rows][acc_stride], columns in the V pairs' order
  float *m, *l;    // running max (log2 units) and sum per row
  int vp_stride, acc_stride;
  std::size_t size;  // bytes
  // base null: sizes only (common/workspace.h).
  Scratch(std::byte* base, int d_ckv, int d_kpe) {
    const std::size_t rows = kMlaMaxRows, dqk = static_cast<std::size_t>(d_ckv + d_kpe);
    vp_stride = d_ckv + kRowPad;
    acc_stride = d_ckv + kRowPad;
    RegionCursor s(base);
    qp = s.take<uint32_t>(rows * dqk * 2);
    st = s.take<float>(rows * T * 4);
    pa = s.take<uint32_t>(rows * T * 2);
    tile = s.take<uint16_t>(T * dqk * 2);
    vp = s.take<uint32_t>(T / 2 * static_cast<std::size_t>(vp_stride) * 4);
    acc = s.take<float>(rows * static_cast<std::size_t>(acc_stride) * 4);
    m = s.take<float>(rows * 4);
    l = s.take<float>(rows * 4);
    size = s.size();
  }
};

// Where the 16 K rows of one row block lie: the ckv part and the kpe part, each with its byte
// stride between rows.
struct KeyRows {
  const char* ckv = nullptr;
  int64_t ckv_stride = 0;
  const char* kpe = nullptr;
  int64_t kpe_stride = 0;
  const char* ckv_row(int i) const { return ckv + i * ckv_stride; }
};

// Prefetches the next KV tile into L2 in small portions (one per tile step), so that its DRAM
// reads overlap the products of the current tile instead of stalling its first loads.
class Prefetcher {
 public:
  Prefetcher(const MlaParams& p, int b) : p_(p), b_(b) {
    const auto row_lines = [&](int d) { return static_cast<int>((d * p.kv_elem_bytes + 63) / 64); };
    ckv_lines_ = row_lines(p.d_ckv);
    kpe_lines_ = row_lines(p.d_kpe);
  }
  // Keys [j0, j1) over about `steps` calls of step().
  void start(int64_t j0, int64_t j1, int steps) {
    j_ = j0;
    end_ = j1;
    line_ = 0;
    const int64_t lines = (j1 - j0) * (ckv_lines_ + kpe_lines_);
    per_step_ = steps > 0 ? static_cast<int>((lines + steps - 1) / steps) : 0;
    if (j_ < end_) rows();
  }
  void step() {
    for (int i = 0; i < per_step_ && j_ < end_; ++i) {
      const char* at = line_ < ckv_lines_ ? ckv_ + 64 * line_ : kpe_ + 64 * (line_ - ckv_lines_);
      _mm_prefetch(at, _MM_HINT_T1);
      if (++line_ == ckv_lines_ + kpe_lines_) {
        line_ = 0;
        if (++j_ < end_) rows();
      }
    }
  }

 private:
  void rows() {
    ckv_ = reinterpret_cast<const char*>(p_.ckv_row(b_, j_));
    kpe_ = reinterpret_cast<const char*>(p_.kpe_row(b_, j_));
  }
  const MlaParams& p_;
  int b_;
  int ckv_lines_ = 0, kpe_lines_ = 0;
  int64_t j_ = 0, end_ = 0;
  int line_ = 0, per_step_ = 0;
  const char* ckv_ = nullptr;
  const char* kpe_ = nullptr;
};

// One pass of a 2 x 2 block over `steps` steps: C(i, j) += A_i(s) . B_j(s) for the KB A tiles and
// RB B tiles of `src` (a0 / a1 / b: address and byte stride of step s; B_1 is 64 bytes after
// B_0). Tile registers are not renamed: a load waits until the products reading the register's
// old tile are done, so each of the next step's loads is issued right after the last product
// that reads its register, and has the remaining products of the step to arrive.
template <int KB, int RB, class Src>
inline void block_loop(int steps, const Src& src, Prefetcher& pf) {
  if (steps <= 0) return;
  _tile_loadd(4, src.a0(0), src.a0_stride(0));
  _tile_loadd(6, src.b(0), src.b_stride());
  if constexpr (RB > 1) _tile_loadd(7, src.b(0) + 64, src.b_stride());
  if constexpr (KB > 1) _tile_loadd(5, src.a1(0), src.a1_stride(0));
  for (int s = 0; s < steps; ++s) {
    const bool more = s + 1 < steps;
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (RB > 1) _tile_dpbf16ps(1, 4, 7);
    if (more) _tile_loadd(4, src.a0(s + 1), src.a0_stride(s + 1));
    if constexpr (KB > 1) _tile_dpbf16ps(2, 5, 6);
    if (more) _tile_loadd(6, src.b(s + 1), src.b_stride());
    if constexpr (KB > 1 && RB > 1) _tile_dpbf16ps(3, 5, 7);
    if (more) {
      if constexpr (KB > 1) _tile_loadd(5, src.a1(s + 1), src.a1_stride(s + 1));
      if constexpr (RB > 1) _tile_loadd(7, src.b(s + 1) + 64, src.b_stride());
    }
    pf.step();
  }
}

template <int KB, int RB>
inline void block_store(float* c, int64_t c_stride, int64_t c_block) {
  _tile_stored(0, c, c_stride);
  if constexpr (RB > 1) _tile_stored(1, c + 16, c_stride);
  if constexpr (KB > 1) _tile_stored(2, c + c_block, c_stride);
  if constexpr (KB > 1 && RB > 1) _tile_stored(3, c + c_block + 16, c_stride);
}

template <int KB, int RB>
inline void block_load(const float* c, int64_t c_stride, int64_t c_block) {
  _tile_loadd(0, c, c_stride);
  if constexpr (RB > 1) _tile_loadd(1, c + 16, c_stride);
  if constexpr (KB > 1) _tile_loadd(2, c + c_block, c_stride);
  if constexpr (KB > 1 && RB > 1) _tile_loadd(3, c + c_block + 16, c_stride);
}

// S^T rows of KB row blocks x RB head groups: over the ckv dims, then the kpe dims.
struct ScoreSource {
  const KeyRows* g;
  const KeyRows* g1;
  int ckv_steps;
  int first;  // the dims step of s = 0
  const char* q;
  int64_t q_stride;
  const char* a(const KeyRows* r, int s) const {
    s += first;
    return s < ckv_steps ? r->ckv + 64 * s : r->kpe + 64 * (s - ckv_steps);
  }
  int64_t a_stride(const KeyRows* r, int s) const {
    return s + first < ckv_steps ? r->ckv_stride : r->kpe_stride;
  }
  const char* a0(int s) const { return a(g, s); }
  int64_t a0_stride(int s) const { return a_stride(g, s); }
  const char* a1(int s) const { return a(g1, s); }
  int64_t a1_stride(int s) const { return a_stride(g1, s); }
  const char* b(int s) const { return q + (s + first) * 16 * q_stride; }
  int64_t b_stride() const { return q_stride; }
};

// Steps [first, last) of the dims: C starts at zero for the first part, else from st.
template <int KB, int RB>
inline void score_block(const KeyRows* g, int ckv_steps, int first, int last, const uint32_t* qt,
                        int heads, float* st, Prefetcher& pf) {
  const int64_t q_stride = int64_t{heads} * 4, c_block = 16 * int64_t{heads};
  if (first == 0) {
    _tile_zero(0);
    if constexpr (RB > 1) _tile_zero(1);
    if constexpr (KB > 1) _tile_zero(2);
    if constexpr (KB > 1 && RB > 1) _tile_zero(3);
  } else {
    block_load<KB, RB>(st, q_stride, c_block);
  }
  const ScoreSource src{g,       g + (KB - 1), ckv_steps, first, reinterpret_cast<const char*>(qt),
                        q_stride};
  block_loop<KB, RB>(last - first, src, pf);
  block_store<KB, RB>(st, q_stride, c_block);
}

// O rows of KB head groups x RB column blocks of 16 += P . V over `steps` 32-key steps.
struct ValueSource {
  const char* pa;
  int64_t pa_stride;
  const char* vp;
  int64_t vp_stride;
  const char* a0(int s) const { return pa + 64 * s; }
  int64_t a0_stride(int) const { return pa_stride; }
  const char* a1(int s) const { return pa + 16 * pa_stride + 64 * s; }
  int64_t a1_stride(int) const { return pa_stride; }
  const char* b(int s) const { return vp + 16 * s * vp_stride; }
  int64_t b_stride() const { return vp_stride; }
};

template <int KB, int RB>
inline void value_block(const uint32_t* pa, int64_t pa_stride, const uint32_t* vp,
                        int64_t vp_stride, int steps, float* c, int64_t c_stride, Prefetcher& pf) {
  const int64_t c_block = 16 * c_stride / 4;
  block_load<KB, RB>(c, c_stride, c_block);
  const ValueSource src{reinterpret_cast<const char*>(pa), pa_stride,
                        reinterpret_cast<const char*>(vp), vp_stride};
  block_loop<KB, RB>(steps, src, pf);
  block_store<KB, RB>(c, c_stride, c_block);
}

// Q^T pairs of one query token: qt[d][h] = the bf16 pair (q[h][2d], q[h][2d + 1]), by 16 x 16
// transposes of words (the head dims are multiples of 32, the heads of 16).
inline void pack_query(const std::byte* q, int64_t head_stride_bytes, int heads, int pairs,
                       uint32_t* qt) {
  for (int h0 = 0; h0 < heads; h0 += 16) {
    for (int d0 = 0; d0 < pairs; d0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = _mm512_loadu_si512(q + (h0 + i) * head_stride_bytes + int64_t{d0} * 4);
      }
      transpose16(r);
      for (int i = 0; i < 16; ++i) {
        _mm512_storeu_si512(qt + int64_t{d0 + i} * heads + h0, r[i]);
      }
    }
  }
}

template <DType KV>
void item(const MlaParams& p, const WorkItem& w, float* o, float* lse, std::byte* scratch) {
  const int heads = p.heads, d_ckv = p.d_ckv, d_kpe = p.d_kpe, dqk = d_ckv + d_kpe;
  const int dp_all = dqk / 2, ckv_steps = d_ckv / 32, kpe_steps = d_kpe / 32;
  const int dims_steps = ckv_steps + kpe_steps;
  const int head_groups = heads / 16;
  const int b = w.request;
  const int64_t tokens = w.qo_end - w.qo_begin, rows = tokens * heads;
  Scratch s(scratch, d_ckv, d_kpe);
  const int64_t acc_stride = s.acc_stride, vp_stride = s.vp_stride;
  constexpr int64_t pa_stride = T / 2;  // words
  load_tile_config();

  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t row = p.qo_begin[b] + w.qo_begin + t;
    uint32_t* qt = s.qp + t * dp_all * heads;
    pack_query(p.q_nope + row * p.qn_row * 2, p.qn_head * 2, heads, d_ckv / 2, qt);
    pack_query(p.q_pe + row * p.qp_row * 2, p.qp_head * 2, heads, d_kpe / 2,
               qt + int64_t{d_ckv / 2} * heads);
  }
  for (int64_t r = 0; r < rows; ++r) std::fill_n(s.acc + r * acc_stride, d_ckv, 0.0f);
  std::fill(s.m, s.m + rows, kNegInf);
  std::fill(s.l, s.l + rows, 0.0f);

  const __m512i interleave = _mm512_load_si512(kPairInterleave);
  const __m512 c = _mm512_set1_ps(p.score_scale_log2);
  alignas(64) static constexpr uint16_t kZeroRow[1024] = {};

  Prefetcher pf(p, b);
  KeyRows groups[kGroups];
  const int64_t ckv_slot_bytes = p.ckv_strides.slot * 2, kpe_slot_bytes = p.kpe_strides.slot * 2;
  for (int64_t j0 = w.kv_begin; j0 < w.kv_end; j0 += T) {
    const int n = static_cast<int>(std::min<int64_t>(T, w.kv_end - j0));
    const int n_groups = (n + 15) / 16;
    // K rows: a full bf16 block within one page is read where it lies; the others are copied
    // (widened) into the tile buffer, rows past the tile's end zero.
    for (int g = 0; g < n_groups; ++g) {
      const int64_t j = j0 + 16 * g;
      const int count = std::min(16, n - 16 * g);
      if (KV == DType::kBF16 && count == 16 && j / p.page_size == (j + 15) / p.page_size) {
        groups[g] = {reinterpret_cast<const char*>(p.ckv_row(b, j)), ckv_slot_bytes,
                     reinterpret_cast<const char*>(p.kpe_row(b, j)), kpe_slot_bytes};
        continue;
      }
      uint16_t* block = s.tile + int64_t{16 * g} * dqk;
      for (int i = 0; i < count; ++i) {
        row_to_bf16<KV>(p.ckv_row(b, j + i), d_ckv, block + int64_t{i} * dqk);
        row_to_bf16<KV>(p.kpe_row(b, j + i), d_kpe, block + int64_t{i} * dqk + d_ckv);
      }
      std::memset(block + int64_t{count} * dqk, 0, static_cast<std::size_t>(16 - count) * dqk * 2);
      groups[g] = {reinterpret_cast<const char*>(block), int64_t{dqk} * 2,
                   reinterpret_cast<const char*>(block + d_ckv), int64_t{dqk} * 2};
    }
    // V pairs of the tile's keys, zero pairs up to a whole 32-key step.
    const int pair_steps = (n + 31) / 32;
    for (int j = 0; 2 * j < n; ++j) {
      const int a = 2 * j, cc = a + 1;
      const auto* ra = reinterpret_cast<const uint16_t*>(groups[a / 16].ckv_row(a % 16));
      const auto* rc =
          cc < n ? reinterpret_cast<const uint16_t*>(groups[cc / 16].ckv_row(cc % 16)) : kZeroRow;
      pair_rows(ra, rc, d_ckv, s.vp + j * vp_stride);
    }
    for (int j = (n + 1) / 2; j < 16 * pair_steps; ++j) {
      std::memset(s.vp + j * vp_stride, 0, static_cast<std::size_t>(d_ckv) * 4);
    }
    // The next tile's rows, over about as many steps as this tile's products take.
    {
      const int64_t next_end = std::min<int64_t>(j0 + 2 * T, w.kv_end);
      const int score_blocks = (n_groups + 1) / 2 * ((head_groups + 1) / 2);
      const int value_blocks = d_ckv / 32 * ((head_groups + 1) / 2);
      const int steps =
          static_cast<int>(tokens) * (score_blocks * ckv_steps + value_blocks * pair_steps);
      pf.start(j0 + T, next_end, steps);
    }

    for (int64_t t = 0; t < tokens; ++t) {
      int64_t end = p.kv_len[b];
      if (p.causal) {
        end = std::clamp<int64_t>(w.qo_begin + t + p.kv_len[b] - p.qo_len[b] + 1, 0, p.kv_len[b]);
      }
      const int visible = static_cast<int>(std::clamp<int64_t>(end - j0, 0, n));
      if (visible == 0) continue;
      const uint32_t* qt = s.qp + t * dp_all * heads;
      const int vis_groups = (visible + 15) / 16;
      // Per pair of row blocks and per part of the dims (their K rows, 18 KiB, stay in L1 while
      // the query pairs of every head group pass).
      for (int g = 0; g < vis_groups; g += 2) {
        float* st = s.st + int64_t{16 * g} * heads;
        const bool two = g + 1 < vis_groups;
        for (int part = 0; part < kDimParts; ++part) {
          const int first = dims_steps * part / kDimParts;
          const int last = dims_steps * (part + 1) / kDimParts;
          for (int v = 0; v < head_groups; v += 2) {
            const bool two_h = v + 1 < head_groups;
            const uint32_t* q = qt + 16 * v;
            float* sv = st + 16 * v;
            if (two && two_h) {
              score_block<2, 2>(groups + g, ckv_steps, first, last, q, heads, sv, pf);
            } else if (two) {
              score_block<2, 1>(groups + g, ckv_steps, first, last, q, heads, sv, pf);
            } else if (two_h) {
              score_block<1, 2>(groups + g, ckv_steps, first, last, q, heads, sv, pf);
            } else {
              score_block<1, 1>(groups + g, ckv_steps, first, last, q, heads, sv, pf);
            }
          }
        }
      }

      // Softmax per head group: the lazy max, then P as bf16 pairs, transposed 16 pairs at a
      // time into the A rows [head][key pair].
      float* m = s.m + t * heads;
      float* l = s.l + t * heads;
      float* acc = s.acc + t * heads * acc_stride;
      const int steps = (visible + 31) / 32;
      for (int v = 0; v < head_groups; ++v) {
        const float* sv = s.st + 16 * v;
        const __m512 old_max = _mm512_loadu_ps(m + 16 * v);
        __m512 raw_max = _mm512_set1_ps(kNegInf);
        for (int jj = 0; jj < visible; ++jj) {
          raw_max = _mm512_max_ps(raw_max, _mm512_loadu_ps(sv + int64_t{jj} * heads));
        }
        // A NaN score never moves the max (the sum carries the NaN); a row's first keys do.
        const __m512 tile_max = _mm512_mul_ps(raw_max, c);
        const __mmask16 moves = _mm512_cmp_ps_mask(
            tile_max, _mm512_add_ps(old_max, _mm512_set1_ps(kRescaleSlack)), _CMP_GT_OQ);
        const __m512 new_max = _mm512_mask_blend_ps(moves, old_max, tile_max);
        const __mmask16 finite = _mm512_cmp_ps_mask(new_max, _mm512_set1_ps(kNegInf), _CMP_NEQ_UQ);
        const __m512 neg_base = _mm512_maskz_sub_ps(finite, _mm512_setzero_ps(), new_max);
        __m512 sum = _mm512_loadu_ps(l + 16 * v);
        if (moves != 0) {
          alignas(64) float alpha[16];
          const __m512 a = Simd::exp2(_mm512_add_ps(old_max, neg_base));
          _mm512_store_ps(alpha, a);
          sum = _mm512_mask_mul_ps(sum, moves, sum, a);
          for (int h = 0; h < 16; ++h) {
            if (!((moves >> h) & 1)) continue;
            const __m512 ah = _mm512_set1_ps(alpha[h]);
            float* row = acc + (16 * v + h) * acc_stride;
            for (int z = 0; z < d_ckv; z += 16) {
              _mm512_storeu_ps(row + z, _mm512_mul_ps(ah, _mm512_loadu_ps(row + z)));
            }
          }
        }
        for (int k = 0; k < steps; ++k) {
          __m512i r[16];
          const float* sk = sv + int64_t{32 * k} * heads;
          if (32 * k + 32 <= visible) {
            for (int i = 0; i < 16; ++i) {
              const __m512 pa = Simd::exp2(
                  _mm512_fmadd_ps(_mm512_loadu_ps(sk + int64_t{2 * i} * heads), c, neg_base));
              const __m512 pb = Simd::exp2(
                  _mm512_fmadd_ps(_mm512_loadu_ps(sk + int64_t{2 * i + 1} * heads), c, neg_base));
              sum = _mm512_add_ps(sum, _mm512_add_ps(pa, pb));
              r[i] = bf16_pairs(pa, pb, interleave);
            }
          } else {
            for (int i = 0; i < 16; ++i) {
              const int ja = 32 * k + 2 * i;
              __m512 pa = _mm512_setzero_ps(), pb = _mm512_setzero_ps();
              if (ja < visible) {
                pa = Simd::exp2(
                    _mm512_fmadd_ps(_mm512_loadu_ps(sv + int64_t{ja} * heads), c, neg_base));
              }
              if (ja + 1 < visible) {
                pb = Simd::exp2(
                    _mm512_fmadd_ps(_mm512_loadu_ps(sv + int64_t{ja + 1} * heads), c, neg_base));
              }
              sum = _mm512_add_ps(sum, _mm512_add_ps(pa, pb));
              r[i] = bf16_pairs(pa, pb, interleave);
            }
          }
          transpose16(r);
          uint32_t* dst = s.pa + int64_t{16 * v} * pa_stride + 16 * k;
          for (int h = 0; h < 16; ++h) _mm512_storeu_si512(dst + h * pa_stride, r[h]);
        }
        _mm512_storeu_ps(l + 16 * v, sum);
        _mm512_storeu_ps(m + 16 * v, new_max);
      }

      // O += P V: per pair of head groups (their P rows, 8 KiB, stay in L1), every pair of
      // 16-column blocks (measured ~2 % faster than the V pairs held in L1 instead).
      for (int v = 0; v < head_groups; v += 2) {
        for (int z = 0; z < d_ckv; z += 32) {
          const uint32_t* a = s.pa + int64_t{16 * v} * pa_stride;
          float* cz = acc + int64_t{16 * v} * acc_stride + z;
          if (v + 1 < head_groups) {
            value_block<2, 2>(a, pa_stride * 4, s.vp + z, vp_stride * 4, steps, cz, acc_stride * 4,
                              pf);
          } else {
            value_block<1, 2>(a, pa_stride * 4, s.vp + z, vp_stride * 4, steps, cz, acc_stride * 4,
                              pf);
          }
        }
      }
    }
  }
  _tile_release();

  // Normalize, dequantize and put the columns back in order (pair_rows' unpacks).
  alignas(64) int32_t lo_index[16], hi_index[16];
  for (int d = 0; d < 16; ++d) {
    // Column d of a 32-column block sits at word 4 (d / 8) + d % 4 of the low or high half.
    lo_index[d] = (d / 8) * 4 + d % 4 + (d % 8 < 4 ? 0 : 16);
    hi_index[d] = (2 + d / 8) * 4 + d % 4 + (d % 8 < 4 ? 0 : 16);
  }
  const __m512i lo_idx = _mm512_load_si512(lo_index), hi_idx = _mm512_load_si512(hi_index);
  for (int64_t r = 0; r < rows; ++r) {
    const math::RowFinish fin = finish_row(s.m[r], s.l[r], p.k_scale, false, nullptr);
    const __m512 scale = _mm512_set1_ps(fin.o_scale);
    const float* a = s.acc + r * acc_stride;
    float* out = o + r * d_ckv;
    for (int blk = 0; blk < d_ckv; blk += 32) {
      const __m512 x0 = _mm512_loadu_ps(a + blk), x1 = _mm512_loadu_ps(a + blk + 16);
      _mm512_storeu_ps(out + blk, _mm512_mul_ps(_mm512_permutex2var_ps(x0, lo_idx, x1), scale));
      _mm512_storeu_ps(out + blk + 16,
                       _mm512_mul_ps(_mm512_permutex2var_ps(x0, hi_idx, x1), scale));
    }
    lse[r] = fin.lse;
  }
}

}  // namespace

// Where the CPU runs it is the kernel table's to say (kernel_table.cc: has_amx).
MlaItemFn KVATTN_AMX_ENTRY(find_mla_kernel_amx)(const MlaParams& p) {
  if (p.q_dtype != DType::kBF16 || p.heads % 16 != 0 || p.heads > kMlaMaxRows ||
      p.d_ckv % 64 != 0 || p.d_kpe % 32 != 0 || p.d_ckv + p.d_kpe > 1024) {
    return nullptr;
  }
  if (!p.unit_stride_rows()) return nullptr;
  // The scratch the planner gives every thread holds this kernel's layout.
  const std::size_t scratch = Scratch(nullptr, p.d_ckv, p.d_kpe).size;
  if (scratch > mla_kernel_scratch_bytes(p.heads, p.d_ckv, p.d_kpe)) {
    return nullptr;
  }
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
