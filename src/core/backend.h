// The backend interface (DESIGN.md §3). Every backend is one object registered in registry.cc.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn {

// The operations that are not attention; a backend says which it has with supports_aux.
enum class AuxOp { kMergeState, kMergeStates, kAppendPagedKVCache, kApplyRope };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Capability: can this backend compute `problem` on `device`, assuming a build with all of its
  // kernels? The only authority on what it supports. OK, or kNotSupported naming the rule.
  virtual Status can_implement(const Problem& problem, const Device& device) const = 0;
  // Availability: is it built, and is `device` present on this machine? Separate from capability.
  virtual Status available(const Device& device) const = 0;
  // Whether the specific kernel for `problem` exists in this build (a build may compile a subset).
  // Only asked after can_implement and available are OK.
  virtual Status kernel_built(const Problem& problem, const Device& device) const {
    (void)problem;
    (void)device;
    return Status::Ok();
  }

  // The kernel its plan for `problem` on `device` would run (the cpu backend: a name from its
  // kernel table), for explain; "" where the backend has no such choice to name. `taller`: the
  // kernels a plan may take in its place from the requests' lengths (the cpu prefill's taller
  // query tiles), shortest first; empty where none. `one_token`: the kernel a plan takes where
  // every request has one query token (the cpu paged prefill's decode route); "" where none.
  // Asked only after can_implement is OK; an error says why no kernel can be chosen.
  virtual Status planned_kernel(const Problem& problem, const Device& device, std::string* name,
                                std::vector<std::string>* taller, std::string* one_token) const {
    (void)problem;
    (void)device;
    name->clear();
    taller->clear();
    one_token->clear();
    return Status::Ok();
  }

  // Cuts the work; `args` has been validated against `problem`. The default: one work item per
  // (request, KV head) over all of its queries and keys, no split, no workspace.
  virtual Status plan(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                      Plan* plan) const;
  virtual Status run(const Plan& plan, const AttentionArgs& args, void* workspace,
                     std::size_t workspace_bytes) const = 0;

  // Whether plan/run and the aux operations issue their GPU work on PlanOptions::stream /
  // OpOptions::stream. A backend that does not is given only a null stream.
  virtual bool supports_streams() const { return false; }

  virtual bool supports_aux(AuxOp op, const Device& device) const {
    (void)op;
    (void)device;
    return false;
  }
  virtual Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                             const TensorView& s_b, const TensorView& v_out,
                             const TensorView& s_out, const OpOptions& options) const;
  virtual Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                              const TensorView& s_out, const OpOptions& options) const;
  virtual Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                                       const TensorView& batch_indices, const TensorView& positions,
                                       const PagedKVCache& cache, const OpOptions& options) const;
  virtual Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                            const TensorView& k_out, const TensorView& pos_ids,
                            const RopeParams& rope, const OpOptions& options) const;
};

// Registered backends, in registration order: reference, cpu, fa2, fa3.
const std::vector<const Backend*>& all_backends();
const Backend* find_backend(std::string_view name);

// Each backend's translation unit defines its accessor.
const Backend& reference_backend();
const Backend& cpu_backend();
const Backend& fa2_backend();
const Backend& fa3_backend();

// The order in which `auto` tries backends for the operations that are not attention.
std::vector<std::string_view> aux_priority_list(const Device& device);

// Per-request lengths read from the (host) index tensors of validated args.
void request_lengths(const Problem& problem, const AttentionArgs& args,
                     std::vector<int64_t>* qo_len, std::vector<int64_t>* kv_len);

}  // namespace kvattn
