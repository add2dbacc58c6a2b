// The online softmax of fa2's kernel on one lane's registers, host and device. A lane holds, for
// each of its two query rows ("halves": rows g and g + 8 of the warp tile), two scores per
// 8-key n-tile and two outputs per 8-dim tile; the four lanes of a quad share a row. Scores are
// in log2 units (pre-multiplied by log2 e). The quad reductions between the steps are the
// kernel's (warp shuffles); tests/cuda/fa2/fragment_layout_test.cc replays the steps over an emulated
// warp on the CPU.
#pragma once

#include <cmath>

#include "core/attention_math.h"
#include "core/hd.h"

#if defined(__CUDACC__)
#define KVATTN_UNROLL _Pragma("unroll")
#define KVATTN_NO_UNROLL _Pragma("unroll 1")
#else
#define KVATTN_UNROLL
#define KVATTN_NO_UNROLL
#endif

namespace kvattn::fa2 {

// 2^x for the softmax: on the device the MUFU instruction alone (ex2.approx.ftz: relative error
// under 2^-22, results below 2^-126 flushed to 0), as FlashAttention's exp2f under fast math;
// exp2f itself adds a range fix-up around it (about 3 instructions a score, ~4 % of a prefill
// warp's instructions in the first GPU profile). Inputs are x <= 0 (a score minus its row's
// maximum), so a flushed result is a weight under 2^-126 of the row's largest, which P's 16-bit
// rounding and the row sum do not see. The host (the CPU replay) keeps exp2f.
KVATTN_HD float softmax_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Step 1: this lane's maximum score of row `half` in the block (-inf when all are masked).
template <int kNTiles>
KVATTN_HD float lane_block_max(const float (&s)[kNTiles][4], int half) {
  float block_max = -INFINITY;
  for (int nt = 0; nt < kNTiles; ++nt) {
    block_max = fmaxf(block_max, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
  }
  return block_max;
}

// Step 2, with the quad's maximum: raises the row's running max m, rescales the running sum l
// and the outputs o, and turns the scores into probabilities (relative to the new max), adding
// them to l (this lane's part of the row sum).
template <int kNTiles, int kDTiles>
KVATTN_HD void softmax_block_update(float (&s)[kNTiles][4], float (&o)[kDTiles][4], float& m,
                                    float& l, int half, float quad_block_max) {
  const float m_new = fmaxf(m, quad_block_max);
  // While a row has seen no visible key its max stays -inf; subtracting 0 instead keeps every
  // exponential exp2(-inf) = 0 rather than exp2(-inf + inf) = NaN.
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float rescale = softmax_exp2(m - m_use);
  m = m_new;
  l *= rescale;
  for (int dt = 0; dt < kDTiles; ++dt) {
    o[dt][2 * half] *= rescale;
    o[dt][2 * half + 1] *= rescale;
  }
  for (int nt = 0; nt < kNTiles; ++nt) {
    s[nt][2 * half] = softmax_exp2(s[nt][2 * half] - m_use);
    s[nt][2 * half + 1] = softmax_exp2(s[nt][2 * half + 1] - m_use);
    l += s[nt][2 * half] + s[nt][2 * half + 1];
  }
}

// Step 3, with the quad's row sum: the factor for the outputs and the natural-log LSE
// (core/attention_math.h, fa3's and the cpu's epilogues too).
using math::finish_row;
using math::finish_row_with_sink;
using math::RowFinish;

// O += P V of one block, exactly, for a block whose V tile holds a non-finite value (rare: the
// loader flags it). The MMA would add p * v for every key of the tile, and a masked key (p = 0)
// with an inf or NaN v would make its row NaN (0 * inf); here a key whose probability is 0 adds
// nothing (docs/cuda.md "Numerics policy"). This lane's outputs are o[dt][2 half + c]: row
// `half`, dim dt * 8 + 2 (lane % 4) + c. The probability of (row half, key j) is held by quad lane
// (j % 8) / 2 as s[j / 8][2 half + j % 2]; quad_p(nt, e, q) returns s[nt][e] of quad lane q (a
// shuffle on the device: every lane makes the same calls). v_at(j, d) reads the V tile.
// The loops over n-tiles, elements and dim tiles are unrolled so that the register arrays (s
// inside quad_p, o) are indexed by constants: a run-time index would move them to local memory
// for the whole kernel. Only the quad lane q is a run-time loop.
template <int kNTiles, int kDTiles, class QuadP, class VAt>
KVATTN_HD void guarded_pv(float (&o)[kDTiles][4], int lane, QuadP quad_p, VAt v_at) {
  KVATTN_UNROLL
  for (int nt = 0; nt < kNTiles; ++nt) {
    KVATTN_UNROLL
    for (int e = 0; e < 4; ++e) {
      KVATTN_NO_UNROLL
      for (int q = 0; q < 4; ++q) {
        const float p = quad_p(nt, e, q);
        if (p == 0.0f) continue;
        const int half = e >> 1, j = nt * 8 + 2 * q + (e & 1);
        KVATTN_UNROLL
        for (int dt = 0; dt < kDTiles; ++dt) {
          const int d = dt * 8 + 2 * (lane % 4);
          o[dt][2 * half] += p * v_at(j, d);
          o[dt][2 * half + 1] += p * v_at(j, d + 1);
        }
      }
    }
  }
}

}  // namespace kvattn::fa2
