// fa2's CUDA entry points, called by backend.cc when CUDA support is built. Plain host
// declarations (no CUDA types), defined in launch.cu and aux_ops.cu.
//
// Memory: the data tensors (q, k, v, the caches, out, lse, custom_mask, alibi_slopes, and the
// tensors of the auxiliary operations except the index ones) are CUDA device memory; the index
// tensors (qo_indptr, kv_indptr, kv_indices, kv_last_page_len, batch_indices, positions,
// pos_ids) are host memory. Attention copies what its kernels need at plan time into the plan's
// persistent device workspace; run only launches. The aux operations copy their index arrays
// per call. All of it goes to the caller's stream (null: the legacy default stream) and the
// caller's current device is restored before returning.
#pragma once

#include <cstddef>
#include <memory>

#include "cuda/fa2/schedule.h"
#include "kvattn/attention.h"
#include "kvattn/status.h"

namespace kvattn::fa2 {

// The SM count of device `index` (0 when it cannot be read).
int device_sm_count(int index);

// Plan time: the persistent device workspace of `schedule` (PlanState, plan_state.h) on
// `device`, filled through `stream` and synchronized; its size in *device_bytes.
Status make_plan_state(const Problem& problem, const AttentionArgs& args, const Schedule& schedule,
                       const Device& device, void* stream, std::shared_ptr<const void>* state,
                       std::size_t* device_bytes);

// Launches only, on plan.stream.
Status run_attention(const Plan& plan, const AttentionArgs& args);

Status run_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                       const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                       const OpOptions& options);
Status run_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                        const TensorView& s_out, const OpOptions& options);
Status run_append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                                 const TensorView& batch_indices, const TensorView& positions,
                                 const PagedKVCache& cache, const OpOptions& options);
Status run_apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                      const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                      const OpOptions& options);

}  // namespace kvattn::fa2
