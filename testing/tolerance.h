// Comparing a backend's attention output with the fp64 reference, with a tolerance that follows
// the precision (STYLE.md, FA3's rule):
//   max |backend - reference| <= 2 x max |baseline - reference| + atol
// where the baseline is the plain low-precision implementation of testing/baseline.h. The same
// rule holds for the LSE. On top of it, exactly: a row that sees no key (reference LSE = -inf)
// must give o = 0 and LSE = -inf, and a NaN where the reference is finite always fails.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"
#include "testing/case_builder.h"

namespace kvattn::testing {

// The worst element of one compared tensor.
struct ErrorSummary {
  double max_err = 0.0;       // max |backend - reference| over rows that see a key
  int64_t worst_index = -1;   // flat row-major index of that element (-1: none)
  double baseline_err = 0.0;  // max |baseline - reference| over the same rows
  double atol = 0.0;
  double bound() const { return 2.0 * baseline_err + atol; }
};

struct CheckResult {
  bool ok = false;
  std::string message;  // what failed (or the figures when it passed), for a test's output
  ErrorSummary out, lse;
  bool lse_checked = false;
};

// Extra absolute tolerance on the output and the LSE.
struct ScoreWidening {
  double out = 0.0;
  double lse = 0.0;
};

// The widening for fp16 QK reduction from the largest stored |q|, |k|, |v| (before their
// scales); zero when the problem does not ask for it. See tolerance.cc for the derivation.
ScoreWidening fp16_qk_widening(const Problem& problem, const RunScalars& scalars, double max_abs_q,
                               double max_abs_k, double max_abs_v);

// Absolute tolerances (see tolerance.cc for why these values).
double output_atol(DType o_dtype, double ref_max_abs);
double lse_atol(double lse_max_abs);

// The comparison itself, on flattened row-major tensors: out [rows, D] and lse [rows], where a
// "row" is one (query, head). The reference is unrounded (f32 output of the fp64 reference) with
// its LSE always present; baseline_* are the baseline's; got_lse may be empty (not asked).
// `widening` adds to both atols where the semantics allow a score to move by a step (fp16 QK
// reduction).
CheckResult compare_with_reference(const Problem& problem, int64_t rows,
                                   const std::vector<float>& ref_out,
                                   const std::vector<float>& ref_lse,
                                   const std::vector<float>& baseline_out,
                                   const std::vector<float>& baseline_lse,
                                   const std::vector<float>& got_out,
                                   const std::vector<float>& got_lse, ScoreWidening widening = {});

// Runs the backend under test on `c` (into the case's own NaN-filled outputs, c.args()), the
// reference and the baseline (into fresh outputs of their own), and compares.
using RunBackend = std::function<Status(const Problem&, const AttentionArgs&)>;
CheckResult check_against_reference(Case& c, const RunBackend& run_backend);

// A RunBackend that plans and runs through the public API on the named backend.
RunBackend run_with_backend(const std::string& backend, int num_threads = 0);

}  // namespace kvattn::testing
