// The reference backend: exact (fp64) and slow; every other backend is tested against it.
#include "core/backend.h"

#include <array>

#include "core/capability.h"
#include "core/status_macros.h"
#include "reference/reference.h"

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

const CapabilityDecl kCapability{
    .backend = "reference",
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

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }
  Status can_implement(const Problem& problem, const Device& device) const override {
    return check_capability(kCapability, problem, device);
  }
  Status available(const Device& device) const override {
    if (!device.is_cpu()) {
      return make_error(ErrorCode::kUnavailable, "reference: runs on the CPU, not on ",
                        device.to_string());
    }
    return Status::Ok();
  }
  // The default plan (one item per request and KV head) is accepted but not followed: the
  // reference computes every row itself, in one obvious order.
  Status run(const Plan& plan, const AttentionArgs& args, void*, std::size_t) const override {
    return ref::attention(plan.problem, args);
  }

  bool supports_aux(AuxOp, const Device& device) const override { return device.is_cpu(); }
  Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                     const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                     const OpOptions&) const override {
    return ref::merge_state(v_a, s_a, v_b, s_b, v_out, s_out);
  }
  Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                      const TensorView& s_out, const OpOptions&) const override {
    return ref::merge_states(v, s, v_out, s_out);
  }
  Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                               const TensorView& batch_indices, const TensorView& positions,
                               const PagedKVCache& cache, const OpOptions&) const override {
    return ref::append_paged_kv_cache(append_k, append_v, batch_indices, positions, cache);
  }
  Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                    const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                    const OpOptions&) const override {
    return ref::apply_rope(q, k, q_out, k_out, pos_ids, rope);
  }
};

}  // namespace

const Backend& reference_backend() {
  static const ReferenceBackend backend;
  return backend;
}

}  // namespace kvattn
