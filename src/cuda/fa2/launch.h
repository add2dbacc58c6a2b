// fa2's CUDA entry points, called by backend.cc when CUDA support is built. Plain host
// declarations (no CUDA types), defined in launch.cu and aux_ops.cu.
//
// Memory: the data tensors (q, k, v, the caches, out, lse, custom_mask, alibi_slopes, and the
// tensors of the auxiliary operations except the index ones) are CUDA device memory; the index
// tensors (qo_indptr, kv_indptr, kv_indices, kv_last_page_len, batch_indices, positions,
// pos_ids) are host memory, read by validation and the planner and copied to the device by each
// call. Work is issued on the legacy default stream; device scratch comes from cudaMallocAsync
// on it, so a call returns without waiting for the GPU.
#pragma once

#include "kvattn/attention.h"
#include "kvattn/status.h"

namespace kvattn::fa2 {

// The SM count of device `index` (0 when it cannot be read).
int device_sm_count(int index);

Status run_attention(const Plan& plan, const AttentionArgs& args);

Status run_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                       const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                       int device_index);
Status run_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                        const TensorView& s_out, int device_index);
Status run_append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                                 const TensorView& batch_indices, const TensorView& positions,
                                 const PagedKVCache& cache, int device_index);
Status run_apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                      const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                      int device_index);

}  // namespace kvattn::fa2
