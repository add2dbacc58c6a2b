// The reference backend: exact (fp64) and slow; every other backend is tested against it.
#include <array>

#include "core/backend.h"
#include "core/capability.h"
#include "core/status_macros.h"

namespace kvattn {
namespace {

constexpr std::array kOps = {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode,
                             Op::kBatchPrefillPaged, Op::kBatchPrefillRagged};
constexpr std::array kInputDTypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3,
                                     DType::kE5M2};
constexpr std::array kODTypes = {DType::kF32, DType::kF16, DType::kBF16};
constexpr std::array kMaskModes = {MaskMode::kNone, MaskMode::kCausal, MaskMode::kCustom};
constexpr std::array kPosEncodings = {PosEncoding::kNone, PosEncoding::kRopeLlama,
                                      PosEncoding::kAlibi};
constexpr std::array kKVLayouts = {KVLayout::kNHD, KVLayout::kHND};

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
  Status run(const Plan&, const AttentionArgs&, void*, std::size_t) const override {
    return make_error(ErrorCode::kInternal, "reference: attention not written yet");
  }
};

}  // namespace

const Backend& reference_backend() {
  static const ReferenceBackend backend;
  return backend;
}

}  // namespace kvattn
