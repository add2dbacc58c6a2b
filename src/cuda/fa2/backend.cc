// fa2 on the host side: capability (always compiled, so selection works on any machine) and,
// when CUDA support is built, the launch of its kernels.
#include "core/backend.h"
#include "core/cuda_query.h"
#include "core/status_macros.h"
#include "cuda/fa2/capability.h"

namespace kvattn {
namespace {

class Fa2Backend final : public Backend {
 public:
  std::string_view name() const override { return "fa2"; }
  Status can_implement(const Problem& problem, const Device& device) const override {
    return check_capability(fa2::capability(), problem, device);
  }
  Status available(const Device& device) const override {
    if (!detail::cuda_support_built()) {
      return make_error(ErrorCode::kUnavailable, "fa2: not built (CUDA support is off)");
    }
    if (!device.is_cuda()) {
      return make_error(ErrorCode::kUnavailable, "fa2: device ", device.to_string(),
                        " is not a CUDA GPU");
    }
    std::vector<CudaDeviceInfo> devices;
    std::string why;
    detail::query_cuda_devices(&devices, &why);
    for (const CudaDeviceInfo& d : devices) {
      if (d.sm == device.sm && (device.described || d.index == device.index)) {
        return Status::Ok();
      }
    }
    return make_error(ErrorCode::kUnavailable, "fa2: no such device here (",
                      devices.empty() ? why : "no sm" + std::to_string(device.sm) + " GPU", ")");
  }
  Status run(const Plan&, const AttentionArgs&, void*, std::size_t) const override {
    return make_error(ErrorCode::kUnavailable, "fa2: kernels not built");
  }
};

}  // namespace

const Backend& fa2_backend() {
  static const Fa2Backend backend;
  return backend;
}

}  // namespace kvattn
