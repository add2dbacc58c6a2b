// Where a problem's tensors put things, on the host, for fa2's and fa3's kernel parameters alike
// (no CUDA): K / V strides by meaning, and where each request starts in the index tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "core/paged_kv.h"
#include "kvattn/attention.h"
#include "kvattn/problem.h"

namespace kvattn::cuda {

// K / V strides by meaning (page, slot, head, dim), for every operation's layout.
paged::CacheStrides kv_strides(const Problem& problem, const TensorView& t);

// Where each request starts in the (host) index tensors of validated args.
struct RequestStarts {
  std::vector<int64_t> q_row;     // first row in q / out
  std::vector<int64_t> kv_first;  // paged: first kv_indices entry; ragged: first key row; else 0
};
RequestStarts request_starts(const Problem& problem, const AttentionArgs& args);

}  // namespace kvattn::cuda
