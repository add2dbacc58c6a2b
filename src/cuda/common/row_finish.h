// The end of an attention row, host and device, for fa2's and fa3's epilogues alike: from the
// row's running max m (log2 units) and its sum of exponentials, the factor for the outputs
// (v_scale folded in) and the natural-log LSE. The numerics policy (docs/cuda.md): a row with no
// visible key gives o = 0 and lse = -inf; a NaN score of a visible key made the sum NaN, and the
// row gives o = NaN and lse = NaN, never an empty row that a split-KV merge would then drop.
#pragma once

#include <cmath>

#include "core/hd.h"
#include "core/math_constants.h"

namespace kvattn::cuda {

struct RowFinish {
  float o_scale;
  float lse;
};
// m and quad_sum are the row's (fa2: the quad's reduced sum).
KVATTN_HD RowFinish finish_row(float m, float quad_sum, float v_scale) {
  constexpr float kLn2 = math::kLn2;
  if (quad_sum != quad_sum) return RowFinish{quad_sum, quad_sum};
  if (!(quad_sum > 0.0f)) return RowFinish{0.0f, -INFINITY};
  return RowFinish{v_scale / quad_sum, (m + log2f(quad_sum)) * kLn2};
}
// With an attention sink (natural-log logit) joining the denominator (DESIGN.md §2):
// m' = max(m, sink2), sum' = sum 2^(m - m') + 2^(sink2 - m'); a row with no visible key gives
// o = 0 and lse = sink.
KVATTN_HD RowFinish finish_row_with_sink(float m, float quad_sum, float v_scale, float sink) {
  constexpr float kLn2 = math::kLn2;
  constexpr float kLog2e = math::kLog2e;
  if (quad_sum != quad_sum) return RowFinish{quad_sum, quad_sum};
  if (!(quad_sum > 0.0f)) return RowFinish{0.0f, sink};
  const float sink2 = sink * kLog2e;
  const float m_new = fmaxf(m, sink2);
  const float keys = exp2f(m - m_new);
  const float total = quad_sum * keys + exp2f(sink2 - m_new);
  return RowFinish{v_scale * keys / total, (m_new + log2f(total)) * kLn2};
}

}  // namespace kvattn::cuda
