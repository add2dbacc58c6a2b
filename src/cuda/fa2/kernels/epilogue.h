// fa2's epilogue, host and device: a row's final state (sink included) and its paired stores
// to out / lse or to a split-KV partial state; the prefill tile's per-warp rows, and the decode
// tile's merge of its key warps' (m, l, o) through shared memory.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hd.h"
#include "core/split_kv.h"
#include "cuda/fa2/kernels/formats.h"
#include "cuda/fa2/kernels/fragment_layout.h"
#include "cuda/fa2/kernels/online_softmax.h"
#include "cuda/fa2/kernels/unit_math.h"
#include "cuda/fa2/params.h"

namespace kvattn::fa2 {

// The per-thread accumulators: o for rows g and g+8 of the warp's 16 (c0,c1 -> row g; c2,c3 ->
// g+8), and the online-softmax state of those rows in log2 units (scores are pre-multiplied by
// log2 e so that exp2 does the exponentials). l is this thread's partial row sum; the quad (4
// threads sharing a row) adds its parts in the epilogue.
template <class C>
struct Accumulators {
  float o[C::kDvo / 8][4];
  float m[2];
  float l[2];
};

// Paired global stores (the caller guarantees the alignment: p.out_pairs, or f32 partial states
// at even dims).
KVATTN_HD void store_f32_pair(float* p, float x0, float x1) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float2*>(p) = make_float2(x0, x1);
#else
  const float v[2] = {x0, x1};
  std::memcpy(p, v, 8);
#endif
}
KVATTN_HD void store_u16_pair(uint16_t* p, uint16_t b0, uint16_t b1) {
  const uint32_t v = uint32_t(b0) | (uint32_t(b1) << 16);
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  std::memcpy(p, &v, 4);
#endif
}

// Two adjacent output elements (d, d + 1) of a row at element offset `offset` (of d), in the o
// dtype: one 32-bit (16-bit o) or 64-bit (f32 o) store when the launch says pairs are aligned.
KVATTN_HD void store_out_pair(const AttentionParams& p, int64_t offset, float x0, float x1) {
  if (p.out_kind == OutKind::kF32) {
    float* o = static_cast<float*>(p.out) + offset;
    if (p.out_pairs) {
      store_f32_pair(o, x0, x1);
    } else {
      o[0] = x0;
      o[p.o_stride_dim] = x1;
    }
    return;
  }
  const bool f16 = p.out_kind == OutKind::kF16;
  const uint16_t b0 = f16 ? F16Format::from_float(x0) : Bf16Format::from_float(x0);
  const uint16_t b1 = f16 ? F16Format::from_float(x1) : Bf16Format::from_float(x1);
  uint16_t* o = static_cast<uint16_t*>(p.out) + offset;
  if (p.out_pairs) {
    store_u16_pair(o, b0, b1);
  } else {
    o[0] = b0;
    o[p.o_stride_dim] = b1;
  }
}

// The final state of one row (the sink joins it; a split chunk's partial excludes it: the merge
// adds it once).
KVATTN_HD RowFinish finish(const AttentionParams& p, const WorkUnit& w, const RowInfo& ri,
                           float m, float l) {
  return p.sinks && w.chunk < 0
             ? finish_row_with_sink(m, l, p.v_scale, p.sinks[ri.head * p.sinks_stride])
             : finish_row(m, l, p.v_scale);
}

// Writes dims (d, d + 1) of row ri (o already scaled) and, when `lse_writer`, its lse: to out
// and lse, or to the unit's partial state.
KVATTN_HD void write_row_pair(const AttentionParams& p, const WorkUnit& w, const RequestInfo& r,
                              int dvo, const RowInfo& ri, int d, float o0, float o1, float lse,
                              bool lse_writer) {
  if (w.chunk < 0) {
    const int64_t row = r.q_row + ri.token;
    store_out_pair(p, row * p.o_stride_row + ri.head * p.o_stride_head + d * p.o_stride_dim, o0,
                   o1);
    if (p.lse && lse_writer) {
      p.lse[row * p.lse_stride_row + ri.head * p.lse_stride_head] = lse * p.lse_scale;
    }
  } else {
    const int64_t state = split::PartialBlock{r.partial_base, r.chunks}.state(ri.token, w.chunk);
    store_f32_pair(p.partial_o + (state * p.num_qo_heads + ri.head) * dvo + d, o0, o1);
    if (lse_writer) p.partial_lse[state * p.num_qo_heads + ri.head] = lse;
  }
}

// Prefill tile: each warp owns its rows; the quad adds its row sums and writes its dims.
template <class C, class Ops>
KVATTN_HD void store_rows(const Ops& ops, const AttentionParams& p, const WorkUnit& w,
                          const RequestInfo& r, const RowInfo (&rows)[2], Accumulators<C>& acc) {
  const int lane = ops.thread() % 32;
  KVATTN_UNROLL
  for (int half = 0; half < 2; ++half) {
    float l = acc.l[half];
    l += ops.shfl_xor(l, 1);
    l += ops.shfl_xor(l, 2);
    const RowInfo& ri = rows[half];
    if (!ri.valid) continue;
    const RowFinish fin = finish(p, w, ri, acc.m[half], l);
    KVATTN_UNROLL
    for (int dt = 0; dt < C::kDvo / 8; ++dt) {
      const int d = dt * 8 + frag::acc_element(lane, 2 * half).col;
      write_row_pair(p, w, r, C::kDvo, ri, d, acc.o[dt][2 * half] * fin.o_scale,
                     acc.o[dt][2 * half + 1] * fin.o_scale, fin.lse, (lane & 3) == 0 && dt == 0);
    }
  }
}

// Decode tile: the key warps' states of the same 16 rows merged through shared memory
// (m* = max m_w, l = sum l_w 2^(m_w - m*), o likewise), then every thread finishes and writes
// pairs of dims. A warp that saw no key of a row has m = -inf and weighs 0; a NaN sum stays NaN.
template <class C, class Ops>
KVATTN_HD void merge_store_rows(const Ops& ops, const AttentionParams& p, const WorkUnit& w,
                                const RequestInfo& r, Accumulators<C>& acc, float* merge) {
  const int warp = ops.thread() / 32, lane = ops.thread() % 32;
  float* m_s = merge;                                   // [kKeyWarps][16]
  float* l_s = m_s + C::kKeyWarps * kWarpRows;          // [kKeyWarps][16]
  float* o_s = l_s + C::kKeyWarps * kWarpRows;          // [kKeyWarps][16][kDvo]
  ops.sync();  // every warp is done with the tiles the merge area overlays
  KVATTN_UNROLL
  for (int half = 0; half < 2; ++half) {
    float l = acc.l[half];
    l += ops.shfl_xor(l, 1);
    l += ops.shfl_xor(l, 2);
    const int row = frag::acc_element(lane, 2 * half).row;
    if ((lane & 3) == 0) {
      m_s[warp * kWarpRows + row] = acc.m[half];
      l_s[warp * kWarpRows + row] = l;
    }
    KVATTN_UNROLL
    for (int dt = 0; dt < C::kDvo / 8; ++dt) {
      const int d = dt * 8 + frag::acc_element(lane, 2 * half).col;
      float* o = o_s + (warp * kWarpRows + row) * C::kDvo + d;
      o[0] = acc.o[dt][2 * half];
      o[1] = acc.o[dt][2 * half + 1];
    }
  }
  ops.sync();
  constexpr int kPairs = C::kDvo / 2;
  KVATTN_NO_UNROLL
  for (int idx = ops.thread(); idx < kWarpRows * kPairs; idx += C::kThreads) {
    const int row = idx / kPairs, d = 2 * (idx % kPairs);
    const RowInfo ri = row_info(p, w, r, row);
    if (!ri.valid) continue;
    float m = -INFINITY;
    for (int kw = 0; kw < C::kKeyWarps; ++kw) m = fmaxf(m, m_s[kw * kWarpRows + row]);
    float l = 0.0f, o0 = 0.0f, o1 = 0.0f;
    for (int kw = 0; kw < C::kKeyWarps; ++kw) {
      const float mw = m_s[kw * kWarpRows + row];
      const float f = mw == -INFINITY ? 0.0f : exp2f(mw - m);
      l += l_s[kw * kWarpRows + row] * f;
      o0 += o_s[(kw * kWarpRows + row) * C::kDvo + d] * f;
      o1 += o_s[(kw * kWarpRows + row) * C::kDvo + d + 1] * f;
    }
    const RowFinish fin = finish(p, w, ri, m, l);
    write_row_pair(p, w, r, C::kDvo, ri, d, o0 * fin.o_scale, o1 * fin.o_scale, fin.lse, d == 0);
  }
}

}  // namespace kvattn::fa2
