// Placeholder until the prefill kernels land: every prefill op reports that it is not built.
#include "cpu/prefill/prefill.h"

#include "core/status_macros.h"

namespace kvattn::cpu {

Status plan_prefill(const Problem&, const AttentionArgs&, const PlanOptions&, Plan*) {
  return make_error(ErrorCode::kNotSupported, "cpu prefill not built yet");
}

Status run_prefill(const Plan&, const AttentionArgs&, void*, std::size_t) {
  return make_error(ErrorCode::kNotSupported, "cpu prefill not built yet");
}

}  // namespace kvattn::cpu
