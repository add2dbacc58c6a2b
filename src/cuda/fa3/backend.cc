// fa3 is declared with its real constraints; its kernels are not built yet, which availability
// reports apart from capability.
#include "core/backend.h"
#include "core/cuda_query.h"
#include "core/status_macros.h"
#include "cuda/fa3/capability.h"

namespace kvattn {
namespace {

class Fa3Backend final : public Backend {
 public:
  std::string_view name() const override { return "fa3"; }
  Status can_implement(const Problem& problem, const Device& device) const override {
    return check_capability(fa3::capability(), problem, device);
  }
  Status available(const Device&) const override {
    return make_error(ErrorCode::kUnavailable, "fa3: not built (its SM90a kernels are not part "
                                               "of this version of kvattn)");
  }
  Status run(const Plan&, const AttentionArgs&, void*, std::size_t) const override {
    return make_error(ErrorCode::kUnavailable, "fa3: not built");
  }
};

}  // namespace

const Backend& fa3_backend() {
  static const Fa3Backend backend;
  return backend;
}

}  // namespace kvattn
