// Interim: tensor validation is being written (issue 6 / foundation). Only problem-level checks
// run until then.
#include "core/status_macros.h"
#include "core/validate.h"

namespace kvattn {

Status validate_attention(const Problem& problem, const AttentionArgs&) {
  return validate_problem(problem);
}
Status validate_merge_state(const TensorView&, const TensorView&, const TensorView&,
                            const TensorView&, const TensorView&, const TensorView&) {
  return Status::Ok();
}
Status validate_merge_states(const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&) {
  return Status::Ok();
}
Status validate_append_paged_kv_cache(const TensorView&, const TensorView&, const TensorView&,
                                      const TensorView&, const PagedKVCache&) {
  return Status::Ok();
}
Status validate_apply_rope(const TensorView&, const TensorView&, const TensorView&,
                           const TensorView&, const TensorView&, const RopeParams&) {
  return Status::Ok();
}

}  // namespace kvattn
