// fa2's attention on the host side of CUDA. plan: the schedule, the page table and room for the
// split-KV partial states go into one persistent device workspace (copied once from pinned
// staging on the plan's stream), and the kernel's shared-memory attribute is set. run: builds
// the kernel parameters from the plan and the tensors on the host and launches the attention
// kernel (and the split-KV merge) on the plan's stream: nothing else, so it can be captured in
// a CUDA graph. Every runtime call goes through RuntimeCalls (runtime_calls.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "cuda/fa2/kernel_params.h"
#include "cuda/fa2/kernel_table.h"
#include "cuda/fa2/launch.h"
#include "cuda/fa2/plan_state.h"
#include "cuda/fa2/schedule.h"

namespace kvattn::fa2 {
namespace {

const KernelEntry* find_kernel(const KernelKey& key) {
  for (const KernelEntry& e : kKernelTable) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

Status expect_memory(const TensorView& t, MemoryKind kind, const char* name) {
  if (t.empty() || t.memory == kind) return Status::Ok();
  return make_error(ErrorCode::kInvalidArgument, "fa2: ", name, " must be in ",
                    kind == MemoryKind::kCuda ? "CUDA device" : "host", " memory");
}

Status check_memory(const Problem& p, const AttentionArgs& a) {
  const MemoryKind dev = MemoryKind::kCuda, host = MemoryKind::kHost;
  KVATTN_RETURN_IF_ERROR(expect_memory(a.q, dev, "q"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.out, dev, "out"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.lse, dev, "lse"));
  if (is_paged(p.op)) {
    KVATTN_RETURN_IF_ERROR(expect_memory(a.paged_k_cache, dev, "paged_k_cache"));
    KVATTN_RETURN_IF_ERROR(expect_memory(a.paged_v_cache, dev, "paged_v_cache"));
  } else {
    KVATTN_RETURN_IF_ERROR(expect_memory(a.k, dev, "k"));
    KVATTN_RETURN_IF_ERROR(expect_memory(a.v, dev, "v"));
  }
  KVATTN_RETURN_IF_ERROR(expect_memory(a.custom_mask, dev, "custom_mask"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.alibi_slopes, dev, "alibi_slopes"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.sinks, dev, "sinks"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.k_scale, dev, "k_scale"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.v_scale, dev, "v_scale"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.k_scale_cache, dev, "k_scale_cache"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.v_scale_cache, dev, "v_scale_cache"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.qo_indptr, host, "qo_indptr"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.kv_indptr, host, "kv_indptr"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.kv_indices, host, "kv_indices"));
  return expect_memory(a.kv_last_page_len, host, "kv_last_page_len");
}

std::vector<int32_t> read_indices(const TensorView& t) {
  std::vector<int32_t> v(t.rank == 1 ? size_t(t.shape[0]) : 0);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<const int32_t*>(t.data)[i * t.strides[0]];
  return v;
}

}  // namespace

int device_sm_count(int index) {
  int count = 0;
  if (runtime().sm_count(index, &count) != 0) return 0;
  return count;
}

Status make_plan_state(const Problem& p, const AttentionArgs& args, const Schedule& s,
                       const Device& device, void* stream, std::shared_ptr<const void>* out_state,
                       std::size_t* device_bytes) {
  auto state = std::make_shared<PlanState>();
  state->schedule = s;
  if (is_paged(p.op)) state->kv_indices = read_indices(args.kv_indices);
  state->layout = workspace_layout(s, state->kv_indices.size(), p.num_qo_heads, p.head_dim_vo);
  state->device = device.index;
  state->calls = &runtime();
  DeviceGuard guard;
  KVATTN_RETURN_IF_ERROR(guard.enter(device.index));
  const WorkspaceLayout& l = state->layout;
  if (l.total_bytes > 0) {
    KVATTN_RETURN_IF_ERROR(
        runtime_status("cudaMalloc", runtime().malloc_device(&state->workspace, l.total_bytes)));
  }
  if (l.staged_bytes > 0) {
    void* staging = nullptr;
    KVATTN_RETURN_IF_ERROR(
        runtime_status("cudaMallocHost", runtime().malloc_pinned(&staging, l.staged_bytes)));
    fill_staging(s, state->kv_indices, l, static_cast<std::byte*>(staging));
    // Synchronized here, once per plan: the staging can go, and a run on any stream finds the
    // workspace ready.
    const Status copied = [&]() -> Status {
      KVATTN_RETURN_IF_ERROR(runtime_status(
          "cudaMemcpyAsync",
          runtime().copy_to_device_async(state->workspace, staging, l.staged_bytes, stream)));
      return runtime_status("cudaStreamSynchronize", runtime().stream_synchronize(stream));
    }();
    (void)runtime().free_pinned(staging);
    KVATTN_RETURN_IF_ERROR(copied);
  }
  // A kernel's dynamic shared-memory limit is set once, here, not in run.
  if (const KernelEntry* kernel = find_kernel(kernel_key(p)); kernel && !s.work.empty()) {
    const KernelLaunchInfo info = kernel->info(s.decode_tile, p.mask_mode == MaskMode::kCustom);
    KVATTN_RETURN_IF_ERROR(
        runtime_status("cudaFuncSetAttribute",
                       runtime().set_max_dynamic_shared_memory(info.kernel, info.shared_bytes)));
  }
  *device_bytes = l.total_bytes;
  *out_state = std::move(state);
  return Status::Ok();
}

namespace {

// The page table run() is given must be the one the plan copied to the device.
Status check_page_table(const PlanState& state, const TensorView& kv_indices) {
  const int64_t n = kv_indices.rank == 1 ? kv_indices.shape[0] : 0;
  if (std::size_t(n) != state.kv_indices.size()) {
    return make_error(
        ErrorCode::kInvalidArgument, "kv_indices: ", n, " entries, the plan was made with ",
        state.kv_indices.size(),
        "; call plan() again when the page table changes (fa2 copies it at plan time)");
  }
  const auto* ids = static_cast<const int32_t*>(kv_indices.data);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids[i * kv_indices.strides[0]];
    if (id != state.kv_indices[std::size_t(i)]) {
      return make_error(ErrorCode::kInvalidArgument, "kv_indices[", i, "] = ", id,
                        ", the plan was made with ", state.kv_indices[std::size_t(i)],
                        "; call plan() again when the page table changes (fa2 copies it at plan "
                        "time)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status run_attention(const Plan& plan, const AttentionArgs& args) {
  const Problem& p = plan.problem;
  const KernelEntry* kernel = find_kernel(kernel_key(p));
  if (!kernel) {
    return make_error(ErrorCode::kUnavailable, "fa2: no kernel built for ",
                      kernel_key_string(kernel_key(p)));
  }
  const auto* state = static_cast<const PlanState*>(plan.backend_state.get());
  if (state == nullptr || state->device != plan.device.index) {
    return make_error(ErrorCode::kInvalidArgument, "plan: no fa2 device workspace for device ",
                      plan.device.index, " (was the plan made by kvattn::plan with backend fa2?)");
  }
  KVATTN_RETURN_IF_ERROR(check_memory(p, args));
  if (is_paged(p.op)) KVATTN_RETURN_IF_ERROR(check_page_table(*state, args.kv_indices));
  const Schedule& s = state->schedule;
  if (s.work.empty()) return Status::Ok();

  AttentionParams k;
  KVATTN_RETURN_IF_ERROR(make_kernel_params(p, args, s, &k));
  const WorkspaceLayout& l = state->layout;
  k.requests = state->at<const RequestInfo>(l.requests);
  k.work = state->at<const WorkUnit>(l.work);
  if (k.paged) k.kv_indices = state->at<const int32_t>(l.kv_indices);
  if (s.num_partial_states > 0) {
    k.partial_o = state->at<float>(l.partial_o);
    k.partial_lse = state->at<float>(l.partial_lse);
  }

  DeviceGuard guard;
  KVATTN_RETURN_IF_ERROR(guard.enter(plan.device.index));
  const KernelLaunchInfo info = kernel->info(s.decode_tile, p.mask_mode == MaskMode::kCustom);
  void* kernel_args[] = {&k};
  KVATTN_RETURN_IF_ERROR(runtime_status(
      "fa2 attention kernel",
      runtime().launch(info.kernel, Dim3{unsigned(s.work.size())}, Dim3{unsigned(info.threads)},
                       kernel_args, std::size_t(info.shared_bytes), plan.stream)));
  if (!s.merge_rows.empty()) {
    // The split-KV merge (cuda/common/split_merge.h, fa3's too): a CTA per (row, query head).
    cuda::MergeParams m = merge_params(k, state->at<const MergeRow>(l.merge_rows), s, p);
    const cuda::MergeGrid g = cuda::merge_grid(m);
    void* merge_args[] = {&m};
    KVATTN_RETURN_IF_ERROR(runtime_status(
        "fa2 merge kernel", runtime().launch(cuda::split_merge_kernel(), Dim3{g.rows, g.heads},
                                             Dim3{g.threads}, merge_args, 0, plan.stream)));
  }
  return Status::Ok();
}

}  // namespace kvattn::fa2
