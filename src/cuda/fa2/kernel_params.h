// fa2's kernel parameters (params.h AttentionParams) from a problem, its tensors and the
// schedule, on the host: everything but the device workspace's pointers (requests, work,
// kv_indices, partial states), which the caller sets. One function for run() and for the CPU
// replay of the kernel body (tests/cuda/fa2/cta_replay_test.cc), so the two cannot drift.
#pragma once

#include "cuda/common/problem_layout.h"
#include "cuda/common/split_merge.h"
#include "cuda/fa2/params.h"
#include "cuda/fa2/schedule.h"
#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::fa2 {

// K / V strides by meaning (core/paged_kv.h).
using paged::kv_strides;

Status make_kernel_params(const Problem& problem, const AttentionArgs& args,
                          const Schedule& schedule, AttentionParams* params);

// The split-KV merge's parameters (cuda/common/split_merge.h, one kernel for fa2 and fa3) from
// the kernel's; `rows` holds schedule.merge_rows where the merge reads them (the plan's device
// workspace in run(), the host vector in the replay). The sink joins in the merge.
inline cuda::MergeParams merge_params(const AttentionParams& k, const MergeRow* rows,
                                      const Schedule& schedule, const Problem& problem) {
  return cuda::merge_params(k, rows, int64_t(schedule.merge_rows.size()), problem.num_qo_heads,
                            problem.head_dim_vo, k.sinks, k.sinks_stride);
}

}  // namespace kvattn::fa2
