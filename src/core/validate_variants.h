// Validation of the attention variants beside the K/V tensors: the attention sinks and the FP8
// K/V scales per head or per (token, head) (DESIGN.md §2, §4). Part of validate_attention.
#pragma once

#include <cstdint>

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::validation {

// Presence (scale tensors given exactly when the problem asks for them; sinks only where
// use_sinks, and optional there), dtype f32, memory with q, shape, and for
// host memory the values: sinks finite; scales finite and positive (per (token, head): every slot
// the requests read). Needs the page table / indptrs proven and `kv_rows` (ragged: kv_indptr[B]).
// Outputs `out` and `lse` must not overlap them.
// With `data_optional` (planning a batch operation) absent tensors pass; given ones are checked.
Status check_sinks_and_scales(const Problem& p, const AttentionArgs& a, int64_t kv_rows,
                              bool data_optional = false);

// A layer's run values (AttentionArgs::scalars): scales finite and positive; k/v 1 outside
// per_tensor (the scale tensors carry the scales); batch_mla_paged's q and v 1 (k_scale scales
// both latents); the LSE base one of LseBase's.
Status check_run_scalars(const Problem& p, const RunScalars& s);

}  // namespace kvattn::validation
