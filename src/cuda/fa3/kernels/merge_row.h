// One output element of fa3's split-KV merge (merge.cuh's kernel, and the CPU replay's merge):
// token `row`'s partial states of query head h, chunk by chunk, folded with core/
// attention_math.h's StateMerger (the merge the CPU tests check: -inf states are identities, a
// row whose chunks all saw nothing gets o = 0, lse = -inf). Partial outputs already carry v_scale
// and are normalized per chunk; the LSEs are natural-log, the merged one in the run's base
// (p.lse_scale). Host and device alike.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/attention_math.h"
#include "core/hd.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {

struct MergedElement {
  float o;
  float lse;
};

KVATTN_HD MergedElement merge_element(const split_kv::MergeRow& row, const PrefillParams& p, int h,
                                      int d, int head_dim_vo) {
  math::StateMerger merger;
  float o = 0.0f;
  for (int64_t c = 0; c < row.chunks; ++c) {
    const int64_t state = row.first_state + c;
    const float lse = p.partial_lse[state * p.num_qo_heads + h];
    if (lse == -INFINITY) continue;  // a chunk with no visible key adds nothing
    float scale_acc = 0.0f, scale_c = 0.0f;
    merger.add(lse, &scale_acc, &scale_c);
    o = o * scale_acc + p.partial_o[(state * p.num_qo_heads + h) * head_dim_vo + d] * scale_c;
  }
  return MergedElement{o * merger.inv_sum(), merger.lse() * p.lse_scale};
}

}  // namespace kvattn::fa3
