// Validation shared by every operation, run before any memory is touched (DESIGN.md §4).
// A violation is a typed Status naming the argument, the value and the rule.
#pragma once

#include "kvattn/attention.h"
#include "kvattn/mla.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn {

// The problem on its own: head counts and dims, group divisibility, page size, window, soft cap,
// scales (finite and positive), rope parameters, sm_scale.
Status validate_problem(const Problem& problem);

// What validate_attention requires of the arguments: everything (run), or, for planning a batch
// operation, the index tensors only: data tensors (q, out, k, v, caches, lse) may be absent then
// and are checked when given (plan reads only the index tensors, as FlashInfer's plan does).
enum class ArgsScope { kRun, kPlan };

// The tensors of `args` against `problem`: ranks, shapes, dtypes, strides inside their buffers,
// the page table / indptrs (read from host memory), custom mask size, outputs not aliasing
// inputs, sizes whose offsets do not overflow.
Status validate_attention(const Problem& problem, const AttentionArgs& args,
                          ArgsScope scope = ArgsScope::kRun);

// A plan about to run (plans are plain data a caller may build or keep): its recorded lengths
// match the problem's batch, and every work item's request, KV head and query / key ranges lie
// inside them. run() checks the lengths against the arguments before this.
Status validate_plan(const Plan& plan);

Status validate_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                            const TensorView& s_b, const TensorView& v_out,
                            const TensorView& s_out);
Status validate_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                             const TensorView& s_out);
Status validate_append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                                      const TensorView& batch_indices,
                                      const TensorView& positions, const PagedKVCache& cache);
// MLA (validate_mla.cc): the problem's latent widths and the fields MLA fixes (called by
// validate_problem), the tensors of one batch_mla_paged call, the MLA views being empty for every
// other op, and the shapes of an MLA append (the rest is validate_append_paged_kv_cache's).
Status validate_mla_problem(const Problem& problem);
Status validate_mla_attention(const Problem& problem, const AttentionArgs& args,
                              ArgsScope scope = ArgsScope::kRun);
Status check_mla_args_unused(const AttentionArgs& args, std::string_view op);
Status validate_append_paged_mla_kv_cache(const TensorView& append_ckv,
                                          const TensorView& append_kpe, const PagedMLACache& cache);

Status validate_apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                           const TensorView& k_out, const TensorView& pos_ids,
                           const RopeParams& rope);

}  // namespace kvattn
