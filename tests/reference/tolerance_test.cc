// The comparison rule of testing/tolerance.h: the reference passes against itself on random
// cases of every op, and a backend that is wrong in any of the ways the rule promises to catch
// fails.
#include "testing/tolerance.h"

#include <gtest/gtest.h>

#include <cmath>

#include "reference/element_io.h"
#include "reference/reference.h"
#include "testing/baseline.h"
#include "testing/case_builder.h"

namespace kvattn::testing {
namespace {

CaseSpec spec_of(Op op, DType q, DType kv, DType o, std::vector<int64_t> qo,
                 std::vector<int64_t> kv_lens) {
  CaseSpec s;
  s.problem.op = op;
  s.problem.batch_size = static_cast<int>(kv_lens.size());
  s.problem.num_qo_heads = 4;
  s.problem.num_kv_heads = 2;
  s.problem.head_dim_qk = 16;
  s.problem.head_dim_vo = 16;
  s.problem.page_size = 4;
  s.problem.q_dtype = q;
  s.problem.kv_dtype = kv;
  s.problem.o_dtype = o;
  s.return_lse = true;
  s.qo_lens = std::move(qo);
  s.kv_lens = std::move(kv_lens);
  return s;
}

std::vector<CaseSpec> varied_specs() {
  std::vector<CaseSpec> specs;
  CaseSpec a = spec_of(Op::kBatchPrefillPaged, DType::kBF16, DType::kBF16, DType::kBF16, {3, 9, 2},
                       {5, 17, 0});
  a.problem.mask_mode = MaskMode::kCausal;
  a.problem.pos_encoding_mode = PosEncoding::kRopeLlama;
  a.problem.kv_layout = KVLayout::kHND;
  specs.push_back(a);
  CaseSpec b = spec_of(Op::kBatchDecode, DType::kF16, DType::kE4M3, DType::kF16, {}, {7, 1, 12});
  b.scalars.k_scale = 0.5f;
  b.scalars.v_scale = 2.0f;
  b.problem.pos_encoding_mode = PosEncoding::kAlibi;
  b.problem.logits_soft_cap = 2.0f;
  b.combined_kv_cache = true;
  specs.push_back(b);
  CaseSpec c =
      spec_of(Op::kBatchPrefillRagged, DType::kF32, DType::kF32, DType::kF32, {4, 6}, {4, 9});
  c.problem.mask_mode = MaskMode::kCustom;
  c.packed_custom_mask = true;
  c.problem.window_left = 3;
  specs.push_back(c);
  CaseSpec d = spec_of(Op::kSinglePrefill, DType::kF16, DType::kE5M2, DType::kBF16, {6}, {11});
  d.problem.batch_size = 1;
  d.problem.kv_layout = KVLayout::kHND;
  d.problem.use_fp16_qk_reduction = true;
  d.problem.head_dim_vo = 8;
  specs.push_back(d);
  CaseSpec e = spec_of(Op::kSingleDecode, DType::kE4M3, DType::kE4M3, DType::kF32, {}, {13});
  e.problem.batch_size = 1;
  e.scalars.q_scale = 0.25f;
  e.return_lse = false;
  specs.push_back(e);
  return specs;
}

TEST(Tolerance, ReferencePassesAgainstItselfOnEveryOp) {
  for (const CaseSpec& spec : varied_specs()) {
    Case c = Case::make(spec);
    const CheckResult r = check_against_reference(c, run_with_backend("reference"));
    EXPECT_TRUE(r.ok) << op_name(spec.problem.op) << ": " << r.message;
    EXPECT_GT(r.out.bound(), 0.0) << op_name(spec.problem.op);
  }
}

// A backend that runs the reference and then damages its output with `damage`.
RunBackend damaged(std::function<void(const Problem&, const AttentionArgs&)> damage) {
  return [damage](const Problem& p, const AttentionArgs& args) {
    Status st = run_with_backend("reference")(p, args);
    if (st.ok()) damage(p, args);
    return st;
  };
}

TEST(Tolerance, AnErrorPastTheBoundFails) {
  for (const CaseSpec& spec : varied_specs()) {
    Case c = Case::make(spec);
    const CheckResult clean = check_against_reference(c, run_with_backend("reference"));
    ASSERT_TRUE(clean.ok) << clean.message;
    const double shift = 3.0 * clean.out.bound();
    const CheckResult r = check_against_reference(
        c, damaged([&](const Problem&, const AttentionArgs& a) {
          const int64_t last = a.out.numel() - 1;  // flat index of a contiguous view
          ref::store_element(a.out.data, a.out.dtype, last,
                             ref::load_element(a.out.data, a.out.dtype, last) + shift);
        }));
    EXPECT_FALSE(r.ok) << op_name(spec.problem.op) << ": " << r.message;
  }
}

TEST(Tolerance, NanFailsAndNamesTheElement) {
  Case c = Case::make(varied_specs()[2]);
  const CheckResult r =
      check_against_reference(c, damaged([](const Problem&, const AttentionArgs& a) {
                                ref::store_element(a.out.data, a.out.dtype, 5, NAN);
                              }));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("token 0, head 0, d 5"), std::string::npos) << r.message;
}

TEST(Tolerance, RowThatSeesNoKeyMustBeZeroAndMinusInfinity) {
  // Request 2 of the first spec has no keys.
  Case c = Case::make(varied_specs()[0]);
  const int64_t first_empty_row = 3 + 9;
  const Problem& p = c.problem();
  const int64_t lse_at = first_empty_row * p.num_qo_heads;
  const int64_t out_at = lse_at * p.head_dim_vo;
  const CheckResult lse_zero =
      check_against_reference(c, damaged([&](const Problem&, const AttentionArgs& a) {
                                ref::store_element(a.lse.data, DType::kF32, lse_at, 0.0);
                              }));
  EXPECT_FALSE(lse_zero.ok) << lse_zero.message;
  const CheckResult out_tiny =
      check_against_reference(c, damaged([&](const Problem&, const AttentionArgs& a) {
                                ref::store_element(a.out.data, a.out.dtype, out_at, 1e-6);
                              }));
  EXPECT_FALSE(out_tiny.ok) << out_tiny.message;
}

TEST(Tolerance, SemanticErrorsInFp32Fail) {
  CaseSpec spec = varied_specs()[2];
  spec.problem.mask_mode = MaskMode::kCausal;
  Case c = Case::make(spec);
  auto with = [](auto change) {
    return [change](const Problem& p, const AttentionArgs& a) {
      Problem wrong = p;
      change(wrong);
      return ref::attention(wrong, a);
    };
  };
  EXPECT_FALSE(check_against_reference(c, with([](Problem& p) { p.sm_scale = 0.251f; })).ok);
  EXPECT_FALSE(check_against_reference(c, with([](Problem& p) { p.window_left = 4; })).ok);
  EXPECT_FALSE(
      check_against_reference(c, with([](Problem& p) { p.mask_mode = MaskMode::kNone; })).ok);
}

TEST(Tolerance, BackendErrorFails) {
  Case c = Case::make(varied_specs()[4]);
  const CheckResult r = check_against_reference(c, [](const Problem&, const AttentionArgs&) {
    return Status(ErrorCode::kNotSupported, "nope");
  });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("nope"), std::string::npos);
}

// The baseline is close to the reference, and its error follows the precision: tiny in fp32,
// larger (P rounded to 16 bits, output rounded) for bf16.
TEST(Baseline, ErrorFollowsThePrecision) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    CaseSpec spec = spec_of(Op::kBatchPrefillRagged, dtype, dtype, dtype, {8}, {40});
    spec.problem.batch_size = 1;
    spec.problem.mask_mode = MaskMode::kCausal;
    Case c = Case::make(spec);
    const CheckResult r = check_against_reference(
        c, [](const Problem& p, const AttentionArgs& a) { return baseline_attention(p, a); });
    EXPECT_TRUE(r.ok) << r.message;
    if (dtype == DType::kF32) {
      EXPECT_LT(r.out.max_err, 1e-5) << r.message;
    } else {
      EXPECT_GT(r.out.max_err, 1e-4) << r.message;
      EXPECT_LT(r.out.max_err, 2e-2) << r.message;
    }
    EXPECT_LT(r.lse.max_err, 1e-4) << r.message;
  }
}

// fp16 QK reduction lets a backend's rounded dot product land one f16 step from the
// reference's: the bound widens for it, and only for it.
TEST(Tolerance, Fp16QkReductionWidensTheBound) {
  CaseSpec spec = varied_specs()[3];
  Case with = Case::make(spec);
  spec.problem.use_fp16_qk_reduction = false;
  Case without = Case::make(spec);
  const CheckResult a = check_against_reference(with, run_with_backend("reference"));
  const CheckResult b = check_against_reference(without, run_with_backend("reference"));
  ASSERT_TRUE(a.ok && b.ok) << a.message << "\n" << b.message;
  EXPECT_GT(a.lse.atol, b.lse.atol);
  EXPECT_GT(a.out.atol, b.out.atol);
}

TEST(Tolerance, Fp16QkWideningIsOneF16StepOfTheLargestScore) {
  Problem p;
  p.head_dim_qk = 16;  // default sm_scale 1/4
  RunScalars s;
  s.k_scale = 2.0f;
  EXPECT_EQ(fp16_qk_widening(p, s, 1.0, 1.0, 1.0).lse, 0.0);  // not asked: no widening
  p.use_fp16_qk_reduction = true;
  const ScoreWidening w = fp16_qk_widening(p, s, 1.0, 0.5, 3.0);
  const double delta = 16 * 1.0 * (0.5 * 2.0) / 1024 * 0.25;
  EXPECT_DOUBLE_EQ(w.lse, delta);
  EXPECT_DOUBLE_EQ(w.out, 2 * delta * 3.0);
}

TEST(Tolerance, AtolFollowsTheOutputDtype) {
  EXPECT_DOUBLE_EQ(output_atol(DType::kBF16, 1.0), 1.0 / 128);
  EXPECT_DOUBLE_EQ(output_atol(DType::kF16, 2.0), 2.0 / 1024);
  EXPECT_LT(output_atol(DType::kF32, 1.0), 1e-4);
  EXPECT_DOUBLE_EQ(lse_atol(0.5), std::ldexp(1.0, -16));
}

}  // namespace
}  // namespace kvattn::testing
