// fa3's split-KV merge: one CTA per query token of a split request (split_plan.h's MergeRow)
// combines that token's partial states into out and lse (merge_row.h, the CPU replay's merge
// too). Threads own output dims, every head in turn, so a warp reads 32 consecutive floats of
// one partial row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/store_out.cuh"
#include "cuda/fa3/kernels/merge_row.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {

inline constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const split_kv::MergeRow* rows, const PrefillParams p, int head_dim_vo) {
  const split_kv::MergeRow row = rows[blockIdx.x];
  for (int h = 0; h < p.num_qo_heads; ++h) {
    for (int d = threadIdx.x; d < head_dim_vo; d += blockDim.x) {
      const MergedElement m = merge_element(row, p, h, d, head_dim_vo);
      cuda::store_out(p, row.out_row * p.o_stride_row + h * p.o_stride_head + d, m.o);
      if (p.lse && d == 0) p.lse[row.out_row * p.lse_stride_row + h * p.lse_stride_head] = m.lse;
    }
  }
}

}  // namespace kvattn::fa3
