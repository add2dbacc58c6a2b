// Where a problem's tensors put things, on the host, for fa2's and fa3's kernel parameters alike
// (no CUDA): where each request starts in the index tensors. (K / V strides by meaning:
// core/paged_kv.h's kv_strides, every backend's.)
#pragma once

#include <cstdint>
#include <vector>

#include "core/paged_kv.h"
#include "kvattn/attention.h"
#include "kvattn/problem.h"

namespace kvattn::cuda {

// Where each request starts in the (host) index tensors of validated args.
struct RequestStarts {
  std::vector<int64_t> q_row;     // first row in q / out
  std::vector<int64_t> kv_first;  // paged: first kv_indices entry; ragged: first key row; else 0
};
RequestStarts request_starts(const Problem& problem, const AttentionArgs& args);

}  // namespace kvattn::cuda
