// Validation of the attention variants beside the K/V tensors: the attention sinks and the FP8
// K/V scales per head or per (token, head) (DESIGN.md §2, §4). Part of validate_attention.
#pragma once

#include <cstdint>

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::validation {

// Presence (given exactly when the problem asks for it), dtype f32, memory with q, shape, and for
// host memory the values: sinks finite; scales finite and positive (per (token, head): every slot
// the requests read). Needs the page table / indptrs proven and `kv_rows` (ragged: kv_indptr[B]).
// Outputs `out` and `lse` must not overlap them.
Status check_sinks_and_scales(const Problem& p, const AttentionArgs& a, int64_t kv_rows);

}  // namespace kvattn::validation
