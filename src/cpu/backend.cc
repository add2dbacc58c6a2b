// The fast CPU backend: decode (decode/), prefill (prefill/) and MLA (mla/) over the kernel table
// (kernel_table.h: the plan chooses the kernel, run() calls it), and the operations that are not
// attention (ops/ops.h).
#include "core/backend.h"

#include <array>

#include "core/capability.h"
#include "core/status_macros.h"
#include "cpu/decode/decode.h"
#include "cpu/kernel_table.h"
#include "cpu/mla/mla.h"
#include "cpu/ops/ops.h"
#include "cpu/prefill/prefill.h"

namespace kvattn {
namespace {

constexpr std::array kOps = {Op::kSingleDecode,      Op::kSinglePrefill,      Op::kBatchDecode,
                             Op::kBatchPrefillPaged, Op::kBatchPrefillRagged, Op::kBatchMLAPaged};
constexpr std::array kInputDTypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3,
                                     DType::kE5M2};
constexpr std::array kODTypes = {DType::kF32, DType::kF16, DType::kBF16};
constexpr std::array kMaskModes = {MaskMode::kNone, MaskMode::kCausal, MaskMode::kCustom};
constexpr std::array kPosEncodings = {PosEncoding::kNone, PosEncoding::kRopeLlama,
                                      PosEncoding::kAlibi};
constexpr std::array kKVLayouts = {KVLayout::kNHD, KVLayout::kHND};
constexpr std::array kScaleGranularities = {KVScaleGranularity::kPerTensor,
                                            KVScaleGranularity::kPerHead,
                                            KVScaleGranularity::kPerTokenHead};

// Everything the reference computes: every op, dtype, head-dim pair (unrolled kernels for 64,
// 128 and 256, a generic one for any other), layout and variant.
const CapabilityDecl kCapability{
    .backend = "cpu",
    .device_kind = Device::Kind::kCpu,
    .ops = kOps,
    .q_dtypes = kInputDTypes,
    .kv_dtypes = kInputDTypes,
    .o_dtypes = kODTypes,
    .head_dims = {},
    .mask_modes = kMaskModes,
    .pos_encodings = kPosEncodings,
    .kv_layouts = kKVLayouts,
    .sinks = true,
    .kv_scale_granularities = kScaleGranularities,
    .rules = {},
};

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Status can_implement(const Problem& problem, const Device& device) const override {
    return check_capability(kCapability, problem, device);
  }
  Status available(const Device& device) const override {
    if (!device.is_cpu()) {
      return make_error(ErrorCode::kUnavailable, "cpu: runs on the CPU, not on ",
                        device.to_string());
    }
    return Status::Ok();
  }
  Status planned_kernel(const Problem& problem, const Device& device, std::string* kernel,
                        std::vector<std::string>* taller, std::string* one_token) const override {
    const cpu::CpuKernel* k = nullptr;
    kernel->clear();
    taller->clear();
    one_token->clear();
    KVATTN_RETURN_IF_ERROR(cpu::choose_cpu_kernel(problem, cpu::plan_isa(device), &k));
    *kernel = std::string(k->name);
    if (!cpu::cpu_kernel_forced(k->op)) {
      for (const cpu::CpuKernel* t : cpu::taller_cpu_kernels(*k)) taller->emplace_back(t->name);
    }
    // (Where no decode kernel can take it, e.g. KVATTN_CPU_KERNEL naming one that does not
    // apply, only a batch of one-token requests fails to plan: the verdict stands, without it.)
    const cpu::CpuKernel* decode = nullptr;
    if (cpu::one_token_cpu_kernel(problem, cpu::plan_isa(device), &decode).ok() &&
        decode != nullptr) {
      *one_token = std::string(decode->name);
    }
    return Status::Ok();
  }
  Status plan(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
              Plan* plan) const override {
    const cpu::CpuKernel* k = nullptr;
    KVATTN_RETURN_IF_ERROR(cpu::choose_cpu_kernel(problem, cpu::plan_isa(options.device), &k));
    // What every plan carries is filled here (plan_prefill cuts the work with the kernel's tile,
    // or a taller one's, which it records in its place).
    plan->backend = std::string(name());
    plan->device = options.device;
    plan->problem = problem;
    plan->kernel = std::string(k->name);
    if (is_mla(problem.op)) return cpu::plan_mla(problem, args, options, plan);
    if (is_decode(problem.op)) return cpu::plan_decode(problem, args, options, plan);
    return cpu::plan_prefill(problem, args, options, plan);
  }
  Status run(const Plan& plan, const AttentionArgs& args, void* workspace,
             std::size_t workspace_bytes) const override {
    if (is_mla(plan.problem.op)) return cpu::run_mla(plan, args, workspace, workspace_bytes);
    if (is_decode(plan.problem.op)) return cpu::run_decode(plan, args, workspace, workspace_bytes);
    return cpu::run_prefill(plan, args, workspace, workspace_bytes);
  }

  bool supports_aux(AuxOp, const Device& device) const override { return device.is_cpu(); }
  Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                     const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                     const OpOptions& options) const override {
    return cpu::merge_state(v_a, s_a, v_b, s_b, v_out, s_out, options.num_threads);
  }
  Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                      const TensorView& s_out, const OpOptions& options) const override {
    return cpu::merge_states(v, s, v_out, s_out, options.num_threads);
  }
  Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                               const TensorView& batch_indices, const TensorView& positions,
                               const PagedKVCache& cache, const OpOptions& options) const override {
    return cpu::append_paged_kv_cache(append_k, append_v, batch_indices, positions, cache,
                                      options.num_threads);
  }
  Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                    const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                    const OpOptions& options) const override {
    return cpu::apply_rope(q, k, q_out, k_out, pos_ids, rope, options.num_threads);
  }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace kvattn
