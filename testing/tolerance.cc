#include "testing/tolerance.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "reference/reference.h"
#include "testing/baseline.h"

namespace kvattn::testing {
namespace {

constexpr int kMaxReportedFailures = 5;

// Views over plain vectors shaped like an attention output / LSE of `p` with `total_qo` rows.
TensorView out_view(const Problem& p, int64_t total_qo, void* data, DType dtype) {
  if (p.op == Op::kSingleDecode) {
    return TensorView::contiguous(data, dtype, {p.num_qo_heads, p.head_dim_vo});
  }
  return TensorView::contiguous(data, dtype, {total_qo, p.num_qo_heads, p.head_dim_vo});
}
TensorView lse_view(const Problem& p, int64_t total_qo, float* data) {
  if (p.op == Op::kSingleDecode) return TensorView::contiguous(data, DType::kF32, {p.num_qo_heads});
  return TensorView::contiguous(data, DType::kF32, {total_qo, p.num_qo_heads});
}

double max_abs_finite(const std::vector<float>& values) {
  double m = 0.0;
  for (float x : values) {
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  }
  return m;
}

ScoreWidening fp16_score_widening(Case& c) {
  const Problem& p = c.problem();
  if (!p.use_fp16_qk_reduction) return {};
  AttentionArgs a = c.args();
  const bool paged = is_paged(p.op);
  return fp16_qk_widening(p, a.scalars, max_abs_finite(view_to_f32(a.q)),
                          max_abs_finite(view_to_f32(paged ? a.paged_k_cache : a.k)),
                          max_abs_finite(view_to_f32(paged ? a.paged_v_cache : a.v)));
}

std::string describe_index(const Problem& p, int64_t flat, int64_t dim) {
  const int64_t row = dim > 0 ? flat / dim : flat;
  std::ostringstream os;
  os << "[token " << row / p.num_qo_heads << ", head " << row % p.num_qo_heads;
  if (dim > 0) os << ", d " << flat % dim;
  os << "]";
  return os.str();
}

}  // namespace

// The widening for fp16 QK reduction. A backend that rounds its own fp32 dot product to f16 may
// land one f16 step away from the reference's rounding of the exact product; the baseline rarely
// shows it (its fp32 dot product is too close to the exact one). One step is at most
// delta = 2^-10 |q·k| sm_scale, with |q·k| <= ||q|| ||k|| <= D max|q| max|k| (RoPE keeps norms).
// Scores shifted by up to delta move the LSE by at most delta and the softmax weights by at most
// 2 delta in total, so the output by at most 2 delta max|v|.
ScoreWidening fp16_qk_widening(const Problem& p, const RunScalars& s, double max_abs_q,
                               double max_abs_k, double max_abs_v) {
  if (!p.use_fp16_qk_reduction) return {};
  constexpr double kF16Epsilon = 1.0 / 1024;  // 2^-10: one ulp relative to the value
  const double max_q = max_abs_q * s.q_scale, max_k = max_abs_k * s.k_scale;
  const double delta = kF16Epsilon * p.head_dim_qk * max_q * max_k * p.effective_sm_scale();
  return {2.0 * delta * max_abs_v * s.v_scale, delta};
}

// Output atol: one unit in the last place of the output dtype at the output's scale (a
// relative epsilon times max |reference|). Two correct implementations that both round to
// o_dtype can differ by one ulp wherever their unrounded values straddle a rounding boundary,
// and the baseline may by chance round like the reference, so 2 x baseline alone cannot cover
// that. For f32 outputs, ulps are far below the noise of fp32 accumulation in another order and
// of approximate exp2 (~sqrt(kv_len) f32 ulps): 2^-16 leaves room for that and is still three
// orders of magnitude below any semantic error (a missed key, a wrong scale).
double output_atol(DType o_dtype, double ref_max_abs) {
  double epsilon = 0.0;
  switch (o_dtype) {
    case DType::kF16:
      epsilon = std::ldexp(1.0, -10);
      break;
    case DType::kBF16:
      epsilon = std::ldexp(1.0, -7);
      break;
    default:
      epsilon = std::ldexp(1.0, -16);
      break;
  }
  return epsilon * std::max(ref_max_abs, 1e-30);
}

// LSE atol: the LSE is f32 everywhere, m + log(sum) with exp2/log2 approximations and sums in any
// order: a few hundred f32 ulps at max(1, |lse|) (2^-16 relative) covers that; a semantic error
// moves it by far more.
double lse_atol(double lse_max_abs) { return std::ldexp(1.0, -16) * std::max(1.0, lse_max_abs); }

CheckResult compare_with_reference(const Problem& p, int64_t rows,
                                   const std::vector<float>& ref_out,
                                   const std::vector<float>& ref_lse,
                                   const std::vector<float>& baseline_out,
                                   const std::vector<float>& baseline_lse,
                                   const std::vector<float>& got_out,
                                   const std::vector<float>& got_lse, ScoreWidening widening) {
  CheckResult r;
  r.lse_checked = !got_lse.empty();
  const int64_t dim = rows > 0 ? static_cast<int64_t>(ref_out.size()) / rows : 0;
  std::ostringstream failures;
  int failure_count = 0;
  auto fail = [&](const std::string& what) {
    if (failure_count++ < kMaxReportedFailures) failures << "  " << what << "\n";
  };
  if (got_out.size() != ref_out.size() || (r.lse_checked && got_lse.size() != ref_lse.size())) {
    r.message = "output sizes differ from the reference's";
    return r;
  }

  double out_scale = 0.0, lse_scale = 0.0;
  for (int64_t row = 0; row < rows; ++row) {
    if (ref_lse[row] == -INFINITY) continue;
    lse_scale = std::max(lse_scale, static_cast<double>(std::fabs(ref_lse[row])));
    for (int64_t d = 0; d < dim; ++d) {
      out_scale = std::max(out_scale, static_cast<double>(std::fabs(ref_out[row * dim + d])));
    }
  }
  r.out.atol = output_atol(p.o_dtype, out_scale) + widening.out;
  r.lse.atol = lse_atol(lse_scale) + widening.lse;

  for (int64_t row = 0; row < rows; ++row) {
    const bool sees_nothing = ref_lse[row] == -INFINITY;
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t at = row * dim + d;
      const double got = got_out[at], want = ref_out[at];
      if (sees_nothing) {
        if (got != 0.0) {
          fail("o" + describe_index(p, at, dim) + " = " + std::to_string(got) +
               ": the row sees no key, o must be 0");
        }
        continue;
      }
      if (!std::isfinite(want)) {
        fail("reference o" + describe_index(p, at, dim) + " is not finite (bad input?)");
        continue;
      }
      if (!std::isfinite(got)) {
        fail("o" + describe_index(p, at, dim) + " = " + std::to_string(got) +
             " where the reference is " + std::to_string(want));
        continue;
      }
      const double err = std::fabs(got - want);
      if (r.out.worst_index < 0 || err > r.out.max_err) {
        r.out.max_err = err;
        r.out.worst_index = at;
      }
      r.out.baseline_err = std::max(r.out.baseline_err, std::fabs(baseline_out[at] - want));
    }
    if (!r.lse_checked) continue;
    const double got = got_lse[row], want = ref_lse[row];
    if (sees_nothing) {
      if (got != -INFINITY) {
        fail("lse" + describe_index(p, row, 0) + " = " + std::to_string(got) +
             ": the row sees no key, lse must be -inf");
      }
      continue;
    }
    if (!std::isfinite(got)) {
      fail("lse" + describe_index(p, row, 0) + " = " + std::to_string(got) +
           " where the reference is " + std::to_string(want));
      continue;
    }
    const double err = std::fabs(got - want);
    if (r.lse.worst_index < 0 || err > r.lse.max_err) {
      r.lse.max_err = err;
      r.lse.worst_index = row;
    }
    r.lse.baseline_err = std::max(r.lse.baseline_err, std::fabs(baseline_lse[row] - want));
  }

  std::ostringstream summary;
  summary << "out: max |err| " << r.out.max_err;
  if (r.out.worst_index >= 0) summary << " at " << describe_index(p, r.out.worst_index, dim);
  summary << ", bound 2 x " << r.out.baseline_err << " (baseline) + " << r.out.atol
          << " (atol) = " << r.out.bound();
  if (r.lse_checked) {
    summary << "; lse: max |err| " << r.lse.max_err;
    if (r.lse.worst_index >= 0) summary << " at " << describe_index(p, r.lse.worst_index, 0);
    summary << ", bound 2 x " << r.lse.baseline_err << " + " << r.lse.atol << " = "
            << r.lse.bound();
  }
  if (r.out.max_err > r.out.bound()) fail("out error past the bound");
  if (r.lse_checked && r.lse.max_err > r.lse.bound()) fail("lse error past the bound");
  r.ok = failure_count == 0;
  r.message = summary.str();
  if (!r.ok) {
    r.message += "\n" + std::to_string(failure_count) + " failure(s):\n" + failures.str() +
                 "problem: " + p.to_string();
  }
  return r;
}

CheckResult check_against_reference(Case& c, const RunBackend& run_backend) {
  const Problem& p = c.problem();
  const int64_t total_qo = p.op == Op::kSingleDecode ? 1 : c.total_qo();
  const int64_t rows = total_qo * p.num_qo_heads;
  const int64_t out_elements = rows * p.head_dim_vo;
  // Before the backend runs: reading the inputs through c.args() remakes the case's outputs.
  const ScoreWidening widening = fp16_score_widening(c);

  // The reference, unrounded (f32 output) and always with its LSE: the LSE says which rows see
  // no key.
  Problem ref_problem = p;
  ref_problem.o_dtype = DType::kF32;
  std::vector<float> ref_out(out_elements), ref_lse(rows);
  AttentionArgs ref_args = c.args();
  ref_args.out = out_view(p, total_qo, ref_out.data(), DType::kF32);
  ref_args.lse = lse_view(p, total_qo, ref_lse.data());
  CheckResult failed;
  Status st = ref::attention(ref_problem, ref_args);
  if (!st.ok()) {
    failed.message = "reference failed: " + st.to_string();
    return failed;
  }

  const Problem& baseline_problem = p;
  std::vector<std::byte> baseline_raw(out_elements * dtype_size(p.o_dtype));
  std::vector<float> baseline_out(out_elements), baseline_lse(rows);
  AttentionArgs baseline_args = c.args();
  baseline_args.out = out_view(p, total_qo, baseline_raw.data(), p.o_dtype);
  baseline_args.lse = lse_view(p, total_qo, baseline_lse.data());
  st = baseline_attention(baseline_problem, baseline_args);
  if (!st.ok()) {
    failed.message = "baseline failed: " + st.to_string();
    return failed;
  }
  to_f32(baseline_raw.data(), p.o_dtype, out_elements, baseline_out.data());

  AttentionArgs args = c.args();
  st = run_backend(p, args);
  if (!st.ok()) {
    failed.message = "backend failed: " + st.to_string() + "\nproblem: " + p.to_string();
    return failed;
  }
  const std::vector<float> got_out = c.out_f32();
  const std::vector<float> got_lse = c.spec().return_lse ? c.lse_f32() : std::vector<float>{};
  CheckResult r = compare_with_reference(p, rows, ref_out, ref_lse, baseline_out, baseline_lse,
                                         got_out, got_lse, widening);
  if (!r.ok) r.message += " (case seed " + std::to_string(c.spec().seed) + ")";
  return r;
}

RunBackend run_with_backend(const std::string& backend, int num_threads) {
  return [backend, num_threads](const Problem& problem, const AttentionArgs& args) {
    PlanOptions options;
    options.backend = backend;
    options.num_threads = num_threads;
    return kvattn::run(problem, args, options);
  };
}

}  // namespace kvattn::testing
