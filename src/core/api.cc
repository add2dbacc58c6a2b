// The public entry points: select, validate, then hand to the backend. Nothing downstream
// re-decides what upstream decided.
#include <algorithm>
#include <memory>

#include "core/backend.h"
#include "core/status_macros.h"
#include "core/validate.h"
#include "kvattn/attention.h"
#include "kvattn/selection.h"

namespace kvattn {
namespace {

Status find_selected(const std::string& name, const Backend** out) {
  *out = find_backend(name);
  if (!*out) return make_error(ErrorCode::kInternal, "selected backend ", name, " not registered");
  return Status::Ok();
}

Status select_aux(AuxOp op, const char* op_name, const OpOptions& options, const Backend** out) {
  const Device& device = options.device;
  if (options.backend.empty() || options.backend == "auto") {
    for (std::string_view name : aux_priority_list(device)) {
      const Backend* b = find_backend(name);
      if (b && b->supports_aux(op, device) && b->available(device).ok()) {
        *out = b;
        return Status::Ok();
      }
    }
    return make_error(ErrorCode::kNotSupported, "no available backend implements ", op_name,
                      " on device ", device.to_string());
  }
  const Backend* b = find_backend(options.backend);
  if (!b) {
    return make_error(ErrorCode::kInvalidArgument, "backend '", options.backend,
                      "' is unknown (expected auto, reference, cpu, fa2 or fa3)");
  }
  if (!b->supports_aux(op, device)) {
    return make_error(ErrorCode::kNotSupported, "backend ", b->name(), " does not implement ",
                      op_name, " on device ", device.to_string());
  }
  Status avail = b->available(device);
  if (!avail.ok()) {
    return make_error(ErrorCode::kUnavailable, "backend ", b->name(), " is not available: ",
                      avail.message());
  }
  *out = b;
  return Status::Ok();
}

Status check_stream(const Backend& b, void* stream, const char* what) {
  if (stream == nullptr || b.supports_streams()) return Status::Ok();
  return make_error(ErrorCode::kNotSupported, what, ".stream = ", stream, ": backend ", b.name(),
                    " does not run on a caller's stream (it must be null)");
}

// The problem one layer's run computes: the plan's, with the sinks and per-head K/V scales this
// layer passes though the plan's problem did not declare them (use_sinks false, per_tensor
// scales). The plan's backend must be able to honour them (its capability decides, as selection
// would have); else kNotSupported with its reason. No copy of the plan, no allocation.
Status layer_problem(const Plan& plan, const Backend& backend, const AttentionArgs& args,
                     Problem* layer) {
  *layer = plan.problem;
  if (!args.sinks.empty()) layer->use_sinks = true;
  if (layer->kv_scale_granularity == KVScaleGranularity::kPerTensor &&
      (!args.k_scale.empty() || !args.v_scale.empty())) {
    layer->kv_scale_granularity = KVScaleGranularity::kPerHead;
  }
  const bool sinks_added = layer->use_sinks != plan.problem.use_sinks;
  const bool heads_added = layer->kv_scale_granularity != plan.problem.kv_scale_granularity;
  if (sinks_added || heads_added) {
    Status s = backend.can_implement(*layer, plan.device);
    if (!s.ok()) {
      return make_error(s.code(), sinks_added ? "sinks" : "k_scale / v_scale (per head)",
                        ": given at run, but the plan's backend cannot honour them: ", s.message(),
                        sinks_added ? " (plan with use_sinks=true, so that selection picks a "
                                      "backend that has sinks)"
                                    : " (plan with kv_scale_granularity per_head)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status plan(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
            Plan* out) {
  if (!out) return make_error(ErrorCode::kInvalidArgument, "plan: out is null");
  std::string name;
  KVATTN_RETURN_IF_ERROR(select_backend(problem, options.device, options.backend, &name));
  KVATTN_RETURN_IF_ERROR(validate_attention(problem, args, ArgsScope::kPlan));
  const Backend* backend = nullptr;
  KVATTN_RETURN_IF_ERROR(find_selected(name, &backend));
  // "auto" with a caller's stream takes the first usable backend, in priority order, that runs
  // on one (fa3 does not yet): the stream is part of the request, not a reason to fail.
  if (options.stream && (options.backend.empty() || options.backend == "auto") &&
      !backend->supports_streams()) {
    for (const Verdict& v : explain(problem, options.device).verdicts) {
      const Backend* b = find_backend(v.backend);
      if (v.supported && v.available && b && b->supports_streams()) {
        name = v.backend;
        backend = b;
        break;
      }
    }
  }
  if (options.num_threads < 0) {
    return make_error(ErrorCode::kInvalidArgument, "num_threads = ", options.num_threads,
                      ": must be >= 0 (0: all cores)");
  }
  if (options.kv_chunk_size < 0) {
    return make_error(ErrorCode::kInvalidArgument, "kv_chunk_size = ", options.kv_chunk_size,
                      ": must be >= 0 (0: the planner decides)");
  }
  KVATTN_RETURN_IF_ERROR(check_stream(*backend, options.stream, "PlanOptions"));
  KVATTN_RETURN_IF_ERROR(backend->plan(problem, args, options, out));
  // What selection and validation decided is recorded here, once, whatever the backend's planner
  // filled in: run() trusts these fields.
  out->backend = name;
  out->device = options.device;
  out->stream = options.stream;
  out->problem = problem;
  request_lengths(problem, args, &out->qo_len, &out->kv_len);
  return Status::Ok();
}

Status run(const Plan& plan, const AttentionArgs& args, void* workspace,
           std::size_t workspace_bytes) {
  const Backend* backend = find_backend(plan.backend);
  if (!backend) {
    return make_error(ErrorCode::kInvalidArgument, "plan.backend '", plan.backend,
                      "' is not a registered backend (was the plan made by kvattn::plan?)");
  }
  Problem layer;
  KVATTN_RETURN_IF_ERROR(layer_problem(plan, *backend, args, &layer));
  KVATTN_RETURN_IF_ERROR(validate_attention(layer, args));
  // The plan was cut for particular lengths; a different batch must be planned again.
  std::vector<int64_t> qo_len, kv_len;
  request_lengths(plan.problem, args, &qo_len, &kv_len);
  if (qo_len != plan.qo_len || kv_len != plan.kv_len) {
    return make_error(ErrorCode::kInvalidArgument,
                      "args: the request lengths differ from those the plan was made for; "
                      "call plan() again for this batch");
  }
  KVATTN_RETURN_IF_ERROR(validate_plan(plan));
  std::unique_ptr<std::byte[]> owned;
  if (plan.workspace_bytes > 0 && workspace == nullptr) {
    owned.reset(new std::byte[plan.workspace_bytes]);
    workspace = owned.get();
    workspace_bytes = plan.workspace_bytes;
  }
  if (workspace_bytes < plan.workspace_bytes) {
    return make_error(ErrorCode::kInvalidArgument, "workspace_bytes = ", workspace_bytes,
                      ": the plan needs at least ", plan.workspace_bytes);
  }
  return backend->run(plan, args, workspace, workspace_bytes);
}

Status run(const Problem& problem, const AttentionArgs& args, const PlanOptions& options) {
  Plan p;
  KVATTN_RETURN_IF_ERROR(plan(problem, args, options, &p));
  return run(p, args);
}

Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                   const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                   const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(validate_merge_state(v_a, s_a, v_b, s_b, v_out, s_out));
  const Backend* b = nullptr;
  KVATTN_RETURN_IF_ERROR(select_aux(AuxOp::kMergeState, "merge_state", options, &b));
  KVATTN_RETURN_IF_ERROR(check_stream(*b, options.stream, "OpOptions"));
  return b->merge_state(v_a, s_a, v_b, s_b, v_out, s_out, options);
}

Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                    const TensorView& s_out, const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(validate_merge_states(v, s, v_out, s_out));
  const Backend* b = nullptr;
  KVATTN_RETURN_IF_ERROR(select_aux(AuxOp::kMergeStates, "merge_states", options, &b));
  KVATTN_RETURN_IF_ERROR(check_stream(*b, options.stream, "OpOptions"));
  return b->merge_states(v, s, v_out, s_out, options);
}

Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& cache, const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(
      validate_append_paged_kv_cache(append_k, append_v, batch_indices, positions, cache));
  const Backend* b = nullptr;
  KVATTN_RETURN_IF_ERROR(
      select_aux(AuxOp::kAppendPagedKVCache, "append_paged_kv_cache", options, &b));
  KVATTN_RETURN_IF_ERROR(check_stream(*b, options.stream, "OpOptions"));
  return b->append_paged_kv_cache(append_k, append_v, batch_indices, positions, cache, options);
}

Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                  const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                  const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(validate_apply_rope(q, k, q_out, k_out, pos_ids, rope));
  const Backend* b = nullptr;
  KVATTN_RETURN_IF_ERROR(select_aux(AuxOp::kApplyRope, "apply_rope", options, &b));
  KVATTN_RETURN_IF_ERROR(check_stream(*b, options.stream, "OpOptions"));
  return b->apply_rope(q, k, q_out, k_out, pos_ids, rope, options);
}

}  // namespace kvattn
