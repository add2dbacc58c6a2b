// The bad-input catalogue for MLA (batch_mla_paged): each case starts from a valid call and
// breaks one thing; every available backend and "auto" must refuse it with the exact error kind
// through plan and run, before writing any output, and the message must name the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "hardening/backends_under_test.h"
#include "kvattn/attention.h"
#include "kvattn/mla.h"

namespace kvattn::hardening {
namespace {

// 3 requests, qo_lens {2, 1, 3}, kv_lens {5, 0, 9}, page size 4 (request 1 has no pages), 5
// pages; H 16, D_ckv 64, D_kpe 16; bf16 throughout, o bf16 and lse f32.
struct MlaFixture {
  static constexpr int kHeads = 16, kCkv = 64, kKpe = 16, kPageSize = 4, kPages = 5, kRows = 6;
  MlaFixture() {
    problem = make_mla_problem(3, kHeads, kPageSize, 0.125f, kCkv, kKpe);
    problem.mask_mode = MaskMode::kCausal;
    auto fill = [](std::vector<uint16_t>* v, size_t n) {
      v->resize(n);
      for (size_t i = 0; i < n; ++i) (*v)[i] = num::f32_to_bf16(std::sin(0.37f * i));
    };
    fill(&q_nope, kRows * kHeads * kCkv);
    fill(&q_pe, kRows * kHeads * kKpe);
    fill(&ckv, kPages * kPageSize * kCkv);
    fill(&kpe, kPages * kPageSize * kKpe);
    out.assign(kRows * kHeads * kCkv, 0);
    lse.assign(kRows * kHeads, 0.0f);
    qo_indptr = {0, 2, 3, 6};
    kv_indptr = {0, 2, 2, 5};
    kv_indices = {4, 0, 1, 3, 2};
    kv_last_page_len = {1, 0, 1};
    args.q_nope = TensorView::contiguous(q_nope.data(), DType::kBF16, {kRows, kHeads, kCkv});
    args.q_pe = TensorView::contiguous(q_pe.data(), DType::kBF16, {kRows, kHeads, kKpe});
    args.ckv_cache = TensorView::contiguous(ckv.data(), DType::kBF16, {kPages, kPageSize, kCkv});
    args.kpe_cache = TensorView::contiguous(kpe.data(), DType::kBF16, {kPages, kPageSize, kKpe});
    args.qo_indptr = TensorView::contiguous(qo_indptr.data(), DType::kI32, {4});
    args.kv_indptr = TensorView::contiguous(kv_indptr.data(), DType::kI32, {4});
    args.kv_indices = TensorView::contiguous(kv_indices.data(), DType::kI32, {5});
    args.kv_last_page_len = TensorView::contiguous(kv_last_page_len.data(), DType::kI32, {3});
    args.out = TensorView::contiguous(out.data(), DType::kBF16, {kRows, kHeads, kCkv});
    args.lse = TensorView::contiguous(lse.data(), DType::kF32, {kRows, kHeads});
  }
  MlaFixture(const MlaFixture&) = delete;
  MlaFixture& operator=(const MlaFixture&) = delete;

  Problem problem;
  std::vector<uint16_t> q_nope, q_pe, ckv, kpe, out;
  std::vector<float> lse;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
  AttentionArgs args;
};

struct MlaCase {
  std::string name;
  std::function<void(MlaFixture&)> mutate;
  ErrorCode code;
  std::string names;  // a word the message must contain
  // A data tensor planning does not need (plan reads the index tensors only): plan accepts its
  // absence, run refuses it.
  bool plan_needs_no_data = false;
};

std::vector<MlaCase> cases() {
  using F = MlaFixture;
  return {
      {"sm_scale_missing", [](F& f) { f.problem.sm_scale.reset(); }, ErrorCode::kInvalidArgument,
       "sm_scale"},
      {"problem_ckv_width_zero", [](F& f) { f.problem.head_dim_ckv = 0; }, ErrorCode::kInvalidShape,
       "head_dim_ckv"},
      {"problem_kpe_width_too_large", [](F& f) { f.problem.head_dim_kpe = 5000; },
       ErrorCode::kInvalidShape, "head_dim_kpe"},
      {"q_nope_wrong_latent_width", [](F& f) { f.args.q_nope.shape[2] = F::kCkv / 2; },
       ErrorCode::kInvalidShape, "q_nope"},
      {"q_pe_wrong_latent_width",
       [](F& f) {
         f.args.q_pe =
             TensorView::contiguous(f.q_pe.data(), DType::kBF16, {F::kRows, F::kHeads, 8});
       },
       ErrorCode::kInvalidShape, "q_pe"},
      {"ckv_cache_wrong_latent_width", [](F& f) { f.args.ckv_cache.shape[2] = 32; },
       ErrorCode::kInvalidShape, "ckv_cache"},
      {"kpe_cache_wrong_latent_width", [](F& f) { f.args.kpe_cache.shape[2] = 8; },
       ErrorCode::kInvalidShape, "kpe_cache"},
      {"kpe_cache_fewer_pages", [](F& f) { f.args.kpe_cache.shape[0] = 4; },
       ErrorCode::kInvalidShape, "kpe_cache"},
      {"out_width_not_ckv", [](F& f) { f.args.out.shape[2] = F::kCkv - F::kKpe; },
       ErrorCode::kInvalidShape, "out"},
      {"problem_widths_disagree_with_derived", [](F& f) { f.problem.head_dim_qk = 128; },
       ErrorCode::kInvalidShape, "head_dim_qk"},
      {"num_kv_heads_not_one", [](F& f) { f.problem.num_kv_heads = 2; }, ErrorCode::kInvalidShape,
       "num_kv_heads"},
      {"heads_below_16", [](F& f) { f.problem.num_qo_heads = 8; }, ErrorCode::kInvalidShape,
       "num_qo_heads"},
      {"q_dtype_f32", [](F& f) { f.problem.q_dtype = DType::kF32; }, ErrorCode::kInvalidDType,
       "q dtype"},
      {"o_dtype_other_16bit", [](F& f) { f.problem.o_dtype = DType::kF16; },
       ErrorCode::kInvalidDType, "o dtype"},
      {"soft_cap_not_defined", [](F& f) { f.problem.logits_soft_cap = 30.0f; },
       ErrorCode::kInvalidArgument, "logits_soft_cap"},
      {"custom_mask_not_defined", [](F& f) { f.problem.mask_mode = MaskMode::kCustom; },
       ErrorCode::kInvalidArgument, "custom"},
      {"kv_indices_out_of_range", [](F& f) { f.kv_indices[3] = 5; }, ErrorCode::kInvalidPageTable,
       "kv_indices"},
      {"kv_indptr_decreasing", [](F& f) { f.kv_indptr[2] = 1; }, ErrorCode::kInvalidPageTable,
       "kv_indptr"},
      {"last_page_len_zero", [](F& f) { f.kv_last_page_len[0] = 0; }, ErrorCode::kInvalidPageTable,
       "kv_last_page_len"},
      {"last_page_len_past_page", [](F& f) { f.kv_last_page_len[2] = 5; },
       ErrorCode::kInvalidPageTable, "kv_last_page_len"},
      {"qo_indptr_total_mismatch", [](F& f) { f.qo_indptr[3] = 5; }, ErrorCode::kInvalidPageTable,
       "qo_indptr"},
      {"ckv_cache_past_its_buffer", [](F& f) { f.args.ckv_cache.buffer_bytes -= 2; },
       ErrorCode::kOutOfBounds, "ckv_cache"},
      {"q_given_for_mla", [](F& f) { f.args.q = f.args.q_nope; }, ErrorCode::kInvalidArgument, "q"},
      // Tensors of variants MLA does not define are refused, never ignored (found by fuzzing).
      {"sinks_given_for_mla", [](F& f) { f.args.sinks = f.args.lse; },
       ErrorCode::kInvalidArgument, "sinks"},
      {"k_scale_tensor_given_for_mla", [](F& f) { f.args.k_scale = f.args.lse; },
       ErrorCode::kInvalidArgument, "k_scale"},
      {"scale_cache_given_for_mla", [](F& f) { f.args.v_scale_cache = f.args.lse; },
       ErrorCode::kInvalidArgument, "v_scale_cache"},
      {"q_pe_missing", [](F& f) { f.args.q_pe = TensorView(); }, ErrorCode::kInvalidArgument,
       "q_pe", true},
      // The LSE is a layer's choice (an lse tensor or none); MLA's run scales are k_scale alone.
      {"q_scale_not_one_for_mla", [](F& f) { f.args.scalars.q_scale = 2.0f; },
       ErrorCode::kInvalidScale, "q_scale"},
      {"out_aliases_ckv_cache",
       [](F& f) {
         f.args.out = TensorView::contiguous(f.ckv.data(), DType::kBF16, {1, F::kHeads, F::kCkv});
         f.qo_indptr = {0, 1, 1, 1};
         f.args.q_nope.shape[0] = f.args.q_pe.shape[0] = f.args.lse.shape[0] = 1;
       },
       ErrorCode::kAliasing, "out"},
      {"ckv_cache_dtype_not_kv_dtype", [](F& f) { f.args.ckv_cache.dtype = DType::kF16; },
       ErrorCode::kInvalidDType, "ckv_cache"},
  };
}

class MlaBadInput : public ::testing::TestWithParam<MlaCase> {};

TEST_P(MlaBadInput, RefusedWithExactKindBeforeAnyWrite) {
  const MlaCase& c = GetParam();
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    MlaFixture f;
    c.mutate(f);
    PlanOptions opt;
    opt.backend = backend;
    Plan plan;
    const Status planned = kvattn::plan(f.problem, f.args, opt, &plan);
    if (c.plan_needs_no_data) {
      EXPECT_TRUE(planned.ok()) << planned.to_string();
    } else {
      EXPECT_EQ(planned.code(), c.code) << planned.to_string();
      EXPECT_NE(planned.message().find(c.names), std::string::npos) << planned.to_string();
    }
    const Status ran = kvattn::run(f.problem, f.args, opt);
    EXPECT_EQ(ran.code(), c.code) << ran.to_string();
    EXPECT_NE(ran.message().find(c.names), std::string::npos) << ran.to_string();
    for (uint16_t x : f.out) ASSERT_EQ(x, 0) << "out was written by a refused call";
    for (float x : f.lse) ASSERT_EQ(x, 0.0f) << "lse was written by a refused call";
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, MlaBadInput, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<MlaCase>& info) {
                           return info.param.name;
                         });

// The fixture itself is valid on every backend (so each case above breaks exactly one thing),
// and the MLA tensors given to any other op are refused rather than ignored.
TEST(MlaBadInput, FixtureRunsAndMlaTensorsAreRefusedElsewhere) {
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    MlaFixture f;
    PlanOptions opt;
    opt.backend = backend;
    const Status s = kvattn::run(f.problem, f.args, opt);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (float x : f.lse) ASSERT_FALSE(std::isnan(x));

    MlaFixture g;
    Problem decode = g.problem;
    decode.op = Op::kBatchDecode;
    decode.num_kv_heads = 16;
    AttentionArgs a = g.args;
    a.qo_indptr = TensorView();
    const Status refused = kvattn::run(decode, a, opt);
    EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument) << refused.to_string();
  }
}

}  // namespace
}  // namespace kvattn::hardening

namespace kvattn::hardening {
namespace {

// MLA plans from its index tensors alone (FlashInfer's plan takes no q or cache): the plan runs
// on the full arguments to the same bits as one planned with them.
TEST(MlaPlanFromIndexTensors, RunsLikeAFullPlan) {
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    MlaFixture full, index_only;
    AttentionArgs plan_args = index_only.args;
    plan_args.q_nope = plan_args.q_pe = plan_args.ckv_cache = plan_args.kpe_cache = TensorView{};
    plan_args.out = plan_args.lse = TensorView{};
    PlanOptions opt;
    opt.backend = backend;
    Plan from_index, from_all;
    ASSERT_TRUE(kvattn::plan(index_only.problem, plan_args, opt, &from_index).ok());
    ASSERT_TRUE(kvattn::plan(full.problem, full.args, opt, &from_all).ok());
    ASSERT_TRUE(kvattn::run(from_index, index_only.args).ok());
    ASSERT_TRUE(kvattn::run(from_all, full.args).ok());
    EXPECT_EQ(index_only.out, full.out);
    EXPECT_EQ(index_only.lse, full.lse);
  }
}

}  // namespace
}  // namespace kvattn::hardening
