// fa3's split-KV merge: one CTA per query token of a split request (split_plan.h's MergeRow)
// combines that token's partial states, chunk by chunk, into out and lse with core/
// attention_math.h's StateMerger (the merge the CPU tests check: -inf states are identities, a
// row whose chunks all saw nothing gets o = 0, lse = -inf). Partial outputs already carry v_scale
// and are normalized per chunk; the LSEs are natural-log. Threads own output dims, every head in
// turn, so a warp reads 32 consecutive floats of one partial row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/attention_math.h"
#include "cuda/common/store_out.cuh"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {

inline constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const split_kv::MergeRow* rows, const PrefillParams p, int head_dim_vo) {
  const split_kv::MergeRow row = rows[blockIdx.x];
  for (int h = 0; h < p.num_qo_heads; ++h) {
    for (int d = threadIdx.x; d < head_dim_vo; d += blockDim.x) {
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
      cuda::store_out(p, row.out_row * p.o_stride_row + h * p.o_stride_head + d,
                      o * merger.inv_sum());
      if (p.lse && d == 0) {
        p.lse[row.out_row * p.lse_stride_row + h * p.lse_stride_head] = merger.lse();
      }
    }
  }
}

}  // namespace kvattn::fa3
