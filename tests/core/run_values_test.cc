// Per-layer run values (DESIGN.md "Plans and per-layer values"): one plan, reused by layers that
// pass their own q/k/v scales, sinks, per-head scales, LSE or not and LSE base, computes what each
// layer asks for; what the plan's backend cannot honour is refused at run with its reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/math_constants.h"
#include "kvattn/attention.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn {
namespace {

using testing::Case;
using testing::CaseSpec;

CaseSpec decode_spec(DType kv) {
  CaseSpec s;
  Problem& p = s.problem;
  p.op = Op::kBatchDecode;
  p.batch_size = 3;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim_qk = p.head_dim_vo = 128;
  p.page_size = 16;
  p.q_dtype = p.o_dtype = DType::kBF16;
  p.kv_dtype = kv;
  s.kv_lens = {70, 0, 300};  // request 1 sees no key: lse -inf
  s.return_lse = true;
  return s;
}

CaseSpec prefill_spec() {
  CaseSpec s = decode_spec(DType::kE4M3);
  s.problem.op = Op::kBatchPrefillPaged;
  s.problem.mask_mode = MaskMode::kCausal;
  s.problem.head_dim_qk = s.problem.head_dim_vo = 64;
  s.qo_lens = {5, 0, 33};
  s.kv_lens = {3, 0, 90};  // causal rows of request 0 past its keys see none
  return s;
}

CaseSpec mla_spec() {
  CaseSpec s;
  s.problem = make_mla_problem(2, 16, 16, 0.25f, 64, 16);
  s.problem.kv_dtype = DType::kE4M3;
  s.qo_lens = {1, 1};
  s.kv_lens = {40, 0};
  s.return_lse = true;
  return s;
}

RunScalars layer_scalars(int layer, bool mla) {
  RunScalars s;
  s.q_scale = mla ? 1.0f : 0.5f + 0.75f * layer;
  s.k_scale = 0.25f + 0.5f * layer;
  s.v_scale = mla ? 1.0f : 2.0f - 0.5f * layer;
  return s;
}

// The plan made once (from layer 0's case) runs every layer's scales; each layer checks against
// the reference computed with that layer's scales.
void expect_one_plan_serves_every_layer(CaseSpec spec, const std::string& backend,
                                        int64_t kv_chunk_size = 0) {
  const bool mla = is_mla(spec.problem.op);
  Case first = Case::make(spec);
  PlanOptions options;
  options.backend = backend;
  options.kv_chunk_size = kv_chunk_size;
  Plan plan;
  ASSERT_TRUE(kvattn::plan(spec.problem, first.args(), options, &plan).ok());
  const std::vector<WorkItem> work = plan.work;
  for (int layer = 0; layer < 3; ++layer) {
    spec.scalars = layer_scalars(layer, mla);
    Case c = Case::make(spec);  // the same seed: the same inputs and page table
    const testing::CheckResult r = testing::check_against_reference(
        c, [&plan](const Problem&, const AttentionArgs& a) { return run(plan, a); });
    EXPECT_TRUE(r.ok) << backend << " layer " << layer << ": " << r.message;
  }
  EXPECT_EQ(plan.problem.to_string(), spec.problem.to_string()) << "the plan was changed";
  EXPECT_EQ(plan.work.size(), work.size());
}

TEST(RunValues, OnePlanServesEveryLayersScales) {
  for (const char* backend : {"reference", "cpu"}) {
    // bf16 queries over an FP8 / bf16 cache: the cpu backend's table and bf16-dot kernels, which
    // take q as stored and fold q_scale into the score scale.
    expect_one_plan_serves_every_layer(decode_spec(DType::kE4M3), backend);
    expect_one_plan_serves_every_layer(decode_spec(DType::kE4M3), backend, /*kv_chunk_size=*/64);
    expect_one_plan_serves_every_layer(decode_spec(DType::kBF16), backend);
    expect_one_plan_serves_every_layer(prefill_spec(), backend);
    expect_one_plan_serves_every_layer(mla_spec(), backend);
  }
}

// A scale really reaches the kernel: the same plan gives different outputs for different scales.
TEST(RunValues, ADifferentScaleGivesADifferentOutput) {
  CaseSpec spec = decode_spec(DType::kE4M3);
  Case c = Case::make(spec);
  PlanOptions options;
  options.backend = "cpu";
  Plan plan;
  AttentionArgs a = c.args();
  ASSERT_TRUE(kvattn::plan(spec.problem, a, options, &plan).ok());
  ASSERT_TRUE(run(plan, a).ok());
  const std::vector<float> out1 = c.out_f32(), lse1 = c.lse_f32();
  a.scalars.q_scale = 3.0f;
  ASSERT_TRUE(run(plan, a).ok());
  EXPECT_NE(c.lse_f32(), lse1) << "q_scale was not applied";
  a.scalars.q_scale = 1.0f;
  a.scalars.v_scale = 2.0f;
  ASSERT_TRUE(run(plan, a).ok());
  EXPECT_EQ(c.lse_f32(), lse1);
  const std::vector<float> out2 = c.out_f32();
  for (std::size_t i = 0; i < out1.size(); ++i) {
    if (out1[i] != 0.0f) {
      EXPECT_NE(out2[i], out1[i]) << "v_scale was not applied at " << i;
      break;
    }
  }
}

// Sinks and per-head K/V scales given at run to a plan whose problem did not declare them: taken
// where the plan's backend has them (checked against the reference of the problem that declares
// them).
TEST(RunValues, SinksAndHeadScalesAddedAtRunWhereTheBackendHasThem) {
  for (const char* backend : {"reference", "cpu"}) {
    CaseSpec planned = decode_spec(DType::kE4M3);
    planned.scalars.k_scale = 1.0f;
    Case first = Case::make(planned);
    PlanOptions options;
    options.backend = backend;
    Plan plan;
    ASSERT_TRUE(kvattn::plan(planned.problem, first.args(), options, &plan).ok());
    CaseSpec layer = planned;
    layer.problem.use_sinks = true;
    layer.problem.kv_scale_granularity = KVScaleGranularity::kPerHead;
    Case c = Case::make(layer);
    const testing::CheckResult r = testing::check_against_reference(
        c, [&plan](const Problem&, const AttentionArgs& a) { return run(plan, a); });
    EXPECT_TRUE(r.ok) << backend << ": " << r.message;
  }
}

// A backend without sinks (fa3 declares none) refuses them at run with its reason, before any
// device is touched; so does plan() for a problem that did not declare them.
TEST(RunValues, SinksTheBackendCannotHonourAreRefusedAtRun) {
  CaseSpec spec = decode_spec(DType::kBF16);
  spec.problem.use_sinks = true;
  Case c = Case::make(spec);
  Plan plan;
  plan.backend = "fa3";
  plan.device = Device::cuda_sm(90);
  plan.problem = spec.problem;
  plan.problem.use_sinks = false;
  const Status s = run(plan, c.args());
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported) << s.to_string();
  EXPECT_NE(s.message().find("sinks: given at run"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("use_sinks=true"), std::string::npos) << s.message();

  Plan p;
  const Status planned = kvattn::plan(plan.problem, c.args(), {}, &p);
  EXPECT_EQ(planned.code(), ErrorCode::kInvalidArgument) << planned.to_string();
}

// LSE base 2 is the natural LSE times log2 e, written by each backend's epilogue (final states
// only: a split request's partials stay natural and the merge converts); -inf stays -inf; the
// output does not change.
void expect_lse_base_two(const CaseSpec& spec, const std::string& backend, int64_t chunk = 0) {
  Case c = Case::make(spec);
  PlanOptions options;
  options.backend = backend;
  options.kv_chunk_size = chunk;
  Plan plan;
  AttentionArgs a = c.args();
  ASSERT_TRUE(kvattn::plan(spec.problem, a, options, &plan).ok());
  ASSERT_TRUE(run(plan, a).ok());
  const std::vector<float> out_e = c.out_f32(), lse_e = c.lse_f32();
  a.scalars.lse_base = LseBase::k2;
  ASSERT_TRUE(run(plan, a).ok());
  EXPECT_EQ(c.out_f32(), out_e) << backend;
  const std::vector<float> lse_2 = c.lse_f32();
  ASSERT_EQ(lse_2.size(), lse_e.size());
  int infinite = 0;
  for (std::size_t i = 0; i < lse_e.size(); ++i) {
    if (std::isinf(lse_e[i])) {
      EXPECT_EQ(lse_2[i], lse_e[i]) << backend << " row " << i;
      ++infinite;
      continue;
    }
    const double want = double(lse_e[i]) * math::kLog2eF64;
    EXPECT_NEAR(lse_2[i], want, 1e-6 * std::max(1.0, std::fabs(want))) << backend << " row " << i;
  }
  EXPECT_GT(infinite, 0) << "the case has a row that sees no key";
}

TEST(RunValues, LseBaseTwoIsAppliedWhereTheLseIsStored) {
  for (const char* backend : {"reference", "cpu"}) {
    expect_lse_base_two(decode_spec(DType::kE4M3), backend);
    expect_lse_base_two(decode_spec(DType::kBF16), backend, /*chunk=*/64);
    expect_lse_base_two(prefill_spec(), backend);
    expect_lse_base_two(mla_spec(), backend);
    expect_lse_base_two(mla_spec(), backend, /*chunk=*/16);
  }
}

// The LSE is a layer's choice: one plan runs layers with and without an lse tensor.
TEST(RunValues, TheLseIsReturnedExactlyWhenATensorIsGiven) {
  CaseSpec spec = decode_spec(DType::kE4M3);
  Case c = Case::make(spec);
  PlanOptions options;
  options.backend = "cpu";
  Plan plan;
  AttentionArgs a = c.args();
  ASSERT_TRUE(kvattn::plan(spec.problem, a, options, &plan).ok());
  ASSERT_TRUE(run(plan, a).ok());
  const std::vector<float> out = c.out_f32();
  AttentionArgs without = a;
  without.lse = TensorView{};
  std::fill(c.lse.begin(), c.lse.end(), std::byte{0});
  ASSERT_TRUE(run(plan, without).ok());
  EXPECT_EQ(c.out_f32(), out);
  for (float x : c.lse_f32()) EXPECT_EQ(x, 0.0f) << "lse written without a tensor";
}

}  // namespace
}  // namespace kvattn
