#include "tools/run_check.h"

#include <cmath>

#include "core/status_macros.h"
#include "kvattn/attention.h"
#include "testing/baseline.h"
#include "testing/case_builder.h"

namespace kvattn::tools {
namespace {

std::vector<float> as_f32(const std::vector<std::byte>& bytes, DType dtype) {
  const auto n = static_cast<int64_t>(bytes.size() / dtype_size(dtype));
  std::vector<float> out(static_cast<size_t>(n));
  testing::to_f32(bytes.data(), dtype, n, out.data());
  return out;
}

double max_abs_finite(const std::vector<std::byte>& bytes, DType dtype) {
  double m = 0;
  for (float v : as_f32(bytes, dtype)) {
    if (std::isfinite(v)) m = std::max(m, static_cast<double>(std::fabs(v)));
  }
  return m;
}

// fp16 QK reduction shifts every score by up to delta = one f16 ulp of |q.k| (the widening of
// testing/tolerance.cc, computed here from the case's own tensors): the LSE moves by at most
// delta, the output by at most 2 delta max|v|.
testing::ScoreWidening fp16_score_widening(const io::OwnedCase& c) {
  const Problem& p = c.problem;
  if (!p.use_fp16_qk_reduction) return {};
  const bool paged = is_paged(p.op);
  const double max_q = max_abs_finite(c.inputs.at("q"), p.q_dtype) * c.run.q_scale;
  const double max_k =
      max_abs_finite(c.inputs.at(paged ? "paged_k_cache" : "k"), p.kv_dtype) * c.run.k_scale;
  const double max_v =
      max_abs_finite(c.inputs.at(paged ? "paged_v_cache" : "v"), p.kv_dtype) * c.run.v_scale;
  constexpr double kF16Epsilon = 1.0 / 1024;
  const double delta = kF16Epsilon * p.head_dim_qk * max_q * max_k * p.effective_sm_scale();
  return {2.0 * delta * max_v, delta};
}

}  // namespace

Status check_against_reference(const io::OwnedCase& c, const io::OutputBuffers& got,
                               testing::CheckResult* result) {
  const Problem& p = c.problem;
  const int64_t rows = (p.op == Op::kSingleDecode ? 1 : c.total_qo()) * p.num_qo_heads;

  Problem ref_problem = p;
  ref_problem.o_dtype = DType::kF32;
  io::OutputBuffers ref;
  AttentionArgs ref_args = c.args_with_outputs(&ref, DType::kF32, /*with_lse=*/true);
  PlanOptions reference;
  reference.backend = "reference";
  Status s = run(ref_problem, ref_args, reference);
  if (!s.ok()) return Status(s.code(), "reference failed: " + s.message());

  const Problem& baseline_problem = p;
  io::OutputBuffers baseline;
  AttentionArgs baseline_args = c.args_with_outputs(&baseline, p.o_dtype, /*with_lse=*/true);
  s = testing::baseline_attention(baseline_problem, baseline_args);
  if (!s.ok()) return Status(s.code(), "baseline failed: " + s.message());

  *result = testing::compare_with_reference(
      p, rows, as_f32(ref.out, DType::kF32), as_f32(ref.lse, DType::kF32),
      as_f32(baseline.out, p.o_dtype), as_f32(baseline.lse, DType::kF32),
      as_f32(got.out, p.o_dtype),
      c.run.return_lse ? as_f32(got.lse, DType::kF32) : std::vector<float>{},
      fp16_score_widening(c));
  return Status::Ok();
}

}  // namespace kvattn::tools
