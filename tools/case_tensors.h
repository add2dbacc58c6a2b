// Internal to the case files: which AttentionArgs field holds each case-file tensor, its dtype,
// and the per-request lengths read from the index tensors.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::io::detail {

// The dtype a case-file tensor must have for `problem`.
DType case_input_dtype(const Problem& problem, std::string_view name);
// The field of `args` a case-file tensor goes in; null for an unknown name.
TensorView* case_input_slot(AttentionArgs* args, std::string_view name);

// Per-request query and KV lengths from the shapes and the index tensors of `args` (host
// memory). Checks what it reads: ranks, sizes, indptrs starting at 0, monotone and ending at the
// token or page count, page ids in range, last_page_len in [1, page_size]. kInvalidShape or
// kInvalidPageTable naming the tensor otherwise.
Status case_request_lengths(const Problem& problem, const AttentionArgs& args,
                            std::vector<int64_t>* qo_lens, std::vector<int64_t>* kv_lens);

}  // namespace kvattn::io::detail
