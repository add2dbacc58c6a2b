// The cpu backend's operations that are not attention (same semantics as src/reference/):
// merge_state(s), append_paged_kv_cache (converting, fp8 quantizing with saturation), apply_rope.
// Arguments are validated by the public entry points before these run.
// One file each: merge.cc, append.cc, rope.cc (their row helpers: row_io.h).
#pragma once

#include "kvattn/attention.h"
#include "kvattn/status.h"

namespace kvattn::cpu {

Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                   const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                   int num_threads);
Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                    const TensorView& s_out, int num_threads);
Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& cache, int num_threads);
Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                  const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                  int num_threads);

}  // namespace kvattn::cpu
