// The catalogue of bad attention inputs (issue 6): each class of malformed call and the exact
// error kind it must get, through the public API (plan, run(problem), run(plan)) on every
// available backend and "auto". Each case starts from a valid fixture and breaks one thing; the
// outputs must be untouched afterwards (refused before any backend wrote).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "hardening/backends_under_test.h"
#include "hardening/bad_input_cases.h"
#include "hardening/fixtures.h"
#include "kvattn/attention.h"

namespace kvattn::hardening {
namespace {

std::vector<AttentionCase> problem_cases() {
  const bool kProblem = false;
  return {
      {"h_qo_not_multiple_of_h_kv", kAll, [](F& f) { f.problem.num_qo_heads = 3; },
       ErrorCode::kInvalidShape, kProblem},
      {"num_kv_heads_zero", kAll, [](F& f) { f.problem.num_kv_heads = 0; },
       ErrorCode::kInvalidShape, kProblem},
      {"num_qo_heads_negative", kAll, [](F& f) { f.problem.num_qo_heads = -4; },
       ErrorCode::kInvalidShape, kProblem},
      {"head_dim_qk_zero", kAll, [](F& f) { f.problem.head_dim_qk = 0; }, ErrorCode::kInvalidShape,
       kProblem},
      {"head_dim_vo_zero", kAll, [](F& f) { f.problem.head_dim_vo = 0; }, ErrorCode::kInvalidShape,
       kProblem},
      {"head_dim_unsupported", kAll, [](F& f) { f.problem.head_dim_qk = 4096; },
       ErrorCode::kInvalidShape, kProblem},
      {"head_dim_odd_with_rope", kAll,
       [](F& f) {
         f.problem.pos_encoding_mode = PosEncoding::kRopeLlama;
         f.problem.head_dim_qk = 7;
       },
       ErrorCode::kInvalidShape, kProblem},
      {"empty_batch", kBatch, [](F& f) { f.problem.batch_size = 0; }, ErrorCode::kInvalidShape,
       kProblem},
      {"negative_batch", kBatch, [](F& f) { f.problem.batch_size = -1; }, ErrorCode::kInvalidShape,
       kProblem},
      {"single_op_batch_of_two", kSingle, [](F& f) { f.problem.batch_size = 2; },
       ErrorCode::kInvalidShape, kProblem},
      {"page_size_zero", kPaged, [](F& f) { f.problem.page_size = 0; }, ErrorCode::kInvalidShape,
       kProblem},
      {"sm_scale_nan", kAll, [](F& f) { f.problem.sm_scale = kNaN; }, ErrorCode::kInvalidScale,
       kProblem},
      {"sm_scale_inf", kAll, [](F& f) { f.problem.sm_scale = kInf; }, ErrorCode::kInvalidScale,
       kProblem},
      {"sm_scale_negative", kAll, [](F& f) { f.problem.sm_scale = -0.5f; },
       ErrorCode::kInvalidScale, kProblem},
      {"sm_scale_zero", kAll, [](F& f) { f.problem.sm_scale = 0.0f; }, ErrorCode::kInvalidScale,
       kProblem},
      // The scales are a layer's run values: a plan made for the valid call refuses them in run.
      {"q_scale_inf", kAll, [](F& f) { f.args.scalars.q_scale = -kInf; }, ErrorCode::kInvalidScale},
      {"k_scale_nan", kAll, [](F& f) { f.args.scalars.k_scale = kNaN; }, ErrorCode::kInvalidScale},
      {"v_scale_negative", kAll, [](F& f) { f.args.scalars.v_scale = -1.0f; },
       ErrorCode::kInvalidScale},
      {"lse_base_out_of_range", kAll,
       [](F& f) { f.args.scalars.lse_base = static_cast<LseBase>(7); },
       ErrorCode::kInvalidArgument},
      {"rope_theta_zero", kAll,
       [](F& f) {
         f.problem.pos_encoding_mode = PosEncoding::kRopeLlama;
         f.problem.rope_theta = 0.0f;
       },
       ErrorCode::kInvalidScale, kProblem},
      {"soft_cap_nan", kAll, [](F& f) { f.problem.logits_soft_cap = kNaN; },
       ErrorCode::kInvalidArgument, kProblem},
      {"o_dtype_fp8", kAll,
       [](F& f) {
         f.problem.o_dtype = DType::kE4M3;
         f.args.out.dtype = DType::kE4M3;
       },
       ErrorCode::kInvalidDType, kProblem},
      {"q_dtype_integer", kAll,
       [](F& f) {
         f.problem.q_dtype = DType::kI32;
         f.args.q.dtype = DType::kI32;
       },
       ErrorCode::kInvalidDType, kProblem},
      {"op_code_out_of_range", kAll, [](F& f) { f.problem.op = static_cast<Op>(9); },
       ErrorCode::kInvalidArgument, kProblem},
      {"mask_mode_code_out_of_range", kAll,
       [](F& f) { f.problem.mask_mode = static_cast<MaskMode>(-1); }, ErrorCode::kInvalidArgument,
       kProblem},
      {"kv_layout_code_out_of_range", kAll,
       [](F& f) { f.problem.kv_layout = static_cast<KVLayout>(5); }, ErrorCode::kInvalidArgument,
       kProblem},
      {"kv_dtype_code_out_of_range", kAll,
       [](F& f) { f.problem.kv_dtype = static_cast<DType>(42); }, ErrorCode::kInvalidDType,
       kProblem},
      {"plan_num_threads_negative", kAll, nullptr, ErrorCode::kInvalidArgument, kProblem},
      {"plan_kv_chunk_size_negative", kAll, nullptr, ErrorCode::kInvalidArgument, kProblem},
  };
}

std::vector<AttentionCase> tensor_cases() {
  return {
      {"q_missing", kAll, [](F& f) { f.args.q = TensorView{}; }, ErrorCode::kInvalidArgument, true,
       MaskMode::kNone, false, true},
      {"out_missing", kAll, [](F& f) { f.args.out = TensorView{}; }, ErrorCode::kInvalidArgument,
       true, MaskMode::kNone, false, true},
      {"q_wrong_rank", kAll, [](F& f) { add_unit_dim(&f.args.q); }, ErrorCode::kInvalidShape},
      {"out_wrong_rank", kAll, [](F& f) { add_unit_dim(&f.args.out); }, ErrorCode::kInvalidShape},
      {"keys_wrong_rank", kAll, [](F& f) { add_unit_dim(&keys(f)); }, ErrorCode::kInvalidShape},
      {"q_dtype_mismatch", kAll, [](F& f) { f.args.q.dtype = DType::kBF16; },
       ErrorCode::kInvalidDType},
      {"keys_dtype_mismatch", kAll, [](F& f) { keys(f).dtype = DType::kF16; },
       ErrorCode::kInvalidDType},
      {"values_dtype_fp8_mismatch", kAll, [](F& f) { values(f).dtype = DType::kE4M3; },
       ErrorCode::kInvalidDType},
      {"out_dtype_mismatch", kAll, [](F& f) { f.args.out.dtype = DType::kBF16; },
       ErrorCode::kInvalidDType},
      {"q_head_count_mismatch", kAll, [](F& f) { f.args.q.shape[f.args.q.rank - 2] = 2; },
       ErrorCode::kInvalidShape},
      {"kv_head_count_mismatch", kAll,
       [](F& f) {
         TensorView& k = keys(f);
         const bool hnd_first = k.rank == 3 && f.problem.kv_layout == KVLayout::kHND;
         k.shape[hnd_first ? 0 : k.rank - 2] = 1;
       },
       ErrorCode::kInvalidShape},
      {"q_head_dim_mismatch", kAll, [](F& f) { f.args.q.shape[f.args.q.rank - 1] = 6; },
       ErrorCode::kInvalidShape},
      {"out_uses_head_dim_qk_layout", kAll,
       [](F& f) {
         // out viewed with D_vo - 1 columns: inside its buffer, but not D_vo.
         f.args.out.shape[f.args.out.rank - 1] = 5;
       },
       ErrorCode::kInvalidShape},
      {"values_head_dim_mismatch", kAll, [](F& f) { values(f).shape[values(f).rank - 1] = 4; },
       ErrorCode::kInvalidShape},
      {"lse_dtype_bf16", kAll, [](F& f) { f.args.lse.dtype = DType::kBF16; },
       ErrorCode::kInvalidDType},
      {"lse_wrong_shape", kAll, [](F& f) { add_unit_dim(&f.args.lse); }, ErrorCode::kInvalidShape},
      {"keys_given_to_paged_op", kPaged, [](F& f) { f.args.k = f.args.paged_k_cache; },
       ErrorCode::kInvalidArgument},
      {"cache_given_to_op_with_kv", kWithKv, [](F& f) { f.args.paged_k_cache = f.args.k; },
       ErrorCode::kInvalidArgument},
      {"qo_indptr_given_to_decode", bit(Op::kBatchDecode) | kSingle,
       [](F& f) { f.args.qo_indptr = f.args.out; }, ErrorCode::kInvalidArgument},
      {"null_data_with_elements", kAll, [](F& f) { f.args.q.data = nullptr; },
       ErrorCode::kInvalidArgument},
      {"negative_dim", kAll, [](F& f) { f.args.q.shape[0] = -1; }, ErrorCode::kInvalidShape},
      {"negative_stride", kAll, [](F& f) { f.args.q.strides[0] = -1; }, ErrorCode::kOutOfBounds},
      {"stride_leaves_buffer", kAll, [](F& f) { f.args.q.strides[0] *= 2; },
       ErrorCode::kOutOfBounds},
      {"buffer_one_byte_short", kAll, [](F& f) { keys(f).buffer_bytes -= 1; },
       ErrorCode::kOutOfBounds},
      {"negative_buffer_bytes", kAll, [](F& f) { f.args.out.buffer_bytes = -8; },
       ErrorCode::kOutOfBounds},
      {"offsets_past_32_bits_tiny_buffer", kAll, [](F& f) { keys(f).shape[0] = int64_t{1} << 30; },
       ErrorCode::kOutOfBounds},
      {"stride_past_32_bits_tiny_buffer", kAll,
       [](F& f) { values(f).strides[0] = int64_t{1} << 33; }, ErrorCode::kOutOfBounds},
      {"out_offsets_past_32_bits", kAll, [](F& f) { f.args.out.strides[0] = int64_t{3} << 31; },
       ErrorCode::kOutOfBounds},
      {"offsets_overflow_int64", kAll,
       [](F& f) {
         f.args.q.shape[0] = int64_t{1} << 40;
         f.args.q.strides[0] = int64_t{1} << 40;
       },
       ErrorCode::kOverflow},
      {"byte_extent_overflows_int64", kAll,
       [](F& f) {
         // Element offsets fit int64, their byte count (x4) does not.
         f.args.out.shape[0] = 3;
         f.args.out.strides[0] = int64_t{1} << 61;
       },
       ErrorCode::kOverflow},
      {"range_wraps_address_space", kAll,
       [](F& f) { f.args.lse.data = reinterpret_cast<void*>(~uintptr_t{0} - 7); },
       ErrorCode::kOverflow},
      {"query_rows_past_int32", bit(Op::kSinglePrefill),
       [](F& f) {
         // Stride 0 keeps the view inside its buffer; the row count alone is the problem.
         for (TensorView* t : {&f.args.q, &f.args.out, &f.args.lse}) {
           t->shape[0] = int64_t{1} << 31;
           t->strides[0] = 0;
         }
       },
       ErrorCode::kOverflow},
      {"index_tensor_in_device_memory", kBatch,
       [](F& f) { f.args.kv_indptr.memory = MemoryKind::kCuda; }, ErrorCode::kInvalidArgument},
      {"data_tensors_in_different_memories", kAll,
       [](F& f) { f.args.out.memory = MemoryKind::kCuda; }, ErrorCode::kInvalidArgument},
      {"out_stride_zero_self_overlap", kAll,
       [](F& f) { f.args.out.strides[f.args.out.rank - 1] = 0; }, ErrorCode::kAliasing},
      {"out_aliases_q", kAll,
       [](F& f) {
         f.args.out.data = f.args.q.data;
         f.args.out.buffer_bytes = f.args.q.buffer_bytes;
       },
       ErrorCode::kAliasing},
      {"out_overlaps_keys", kAll,
       [](F& f) {
         // Starts inside the key tensor, a few elements in.
         f.args.out.data = static_cast<float*>(keys(f).data) + 3;
         f.args.out.buffer_bytes = keys(f).buffer_bytes;
       },
       ErrorCode::kAliasing},
      {"lse_aliases_out", kAll,
       [](F& f) {
         f.args.lse.data = f.args.out.data;
         f.args.lse.buffer_bytes = f.args.out.buffer_bytes;
       },
       ErrorCode::kAliasing},
      {"lse_overlaps_kv_indptr", kBatch,
       [](F& f) {
         f.args.lse.data = f.args.kv_indptr.data;
         f.args.lse.buffer_bytes = f.args.out.buffer_bytes;
       },
       ErrorCode::kAliasing},
  };
}

std::vector<AttentionCase> index_cases() {
  return {
      {"kv_indptr_not_starting_at_0", kBatch, [](F& f) { f.kv_indptr[0] = 1; },
       ErrorCode::kInvalidPageTable},
      {"kv_indptr_decreasing", kBatch, [](F& f) { f.kv_indptr[2] = f.kv_indptr[1] - 1; },
       ErrorCode::kInvalidPageTable},
      {"kv_indptr_negative", kBatch, [](F& f) { f.kv_indptr[1] = -2; },
       ErrorCode::kInvalidPageTable},
      {"kv_indptr_wrong_length", kBatch, [](F& f) { f.args.kv_indptr.shape[0] -= 1; },
       ErrorCode::kInvalidShape},
      {"kv_indptr_dtype_f32", kBatch, [](F& f) { f.args.kv_indptr.dtype = DType::kF32; },
       ErrorCode::kInvalidDType},
      {"kv_indptr_missing", kBatch, [](F& f) { f.args.kv_indptr = TensorView{}; },
       ErrorCode::kInvalidArgument},
      {"page_index_out_of_range", kPaged,
       [](F& f) { f.kv_indices[2] = static_cast<int32_t>(f.num_pages); },
       ErrorCode::kInvalidPageTable},
      {"page_index_negative", kPaged, [](F& f) { f.kv_indices[0] = -1; },
       ErrorCode::kInvalidPageTable},
      {"page_index_huge", kPaged,
       [](F& f) { f.kv_indices[4] = std::numeric_limits<int32_t>::max(); },
       ErrorCode::kInvalidPageTable},
      {"last_page_len_zero", kPaged, [](F& f) { f.kv_last_page_len[0] = 0; },
       ErrorCode::kInvalidPageTable},
      {"last_page_len_past_page_size", kPaged,
       [](F& f) { f.kv_last_page_len[2] = f.problem.page_size + 1; }, ErrorCode::kInvalidPageTable},
      {"last_page_len_wrong_length", kPaged, [](F& f) { f.args.kv_last_page_len.shape[0] -= 1; },
       ErrorCode::kInvalidShape},
      {"kv_indptr_total_past_kv_indices", kPaged, [](F& f) { f.args.kv_indices.shape[0] -= 1; },
       ErrorCode::kInvalidPageTable},
      {"page_size_disagrees_with_cache", kPaged, [](F& f) { f.problem.page_size = 2; },
       ErrorCode::kInvalidShape, false},
      {"num_pages_disagree_k_v", kPaged, [](F& f) { f.args.paged_v_cache.shape[0] -= 1; },
       ErrorCode::kInvalidShape},
      {"qo_indptr_not_starting_at_0", kRaggedQ, [](F& f) { f.qo_indptr[0] = 1; },
       ErrorCode::kInvalidPageTable},
      {"qo_indptr_decreasing", kRaggedQ, [](F& f) { f.qo_indptr[2] = 1; },
       ErrorCode::kInvalidPageTable},
      {"qo_indptr_total_disagrees_with_q", kRaggedQ, [](F& f) { f.qo_indptr[3] = 5; },
       ErrorCode::kInvalidPageTable},
      {"kv_indptr_total_disagrees_with_k", kRaggedKv, [](F& f) { f.kv_indptr[3] = 13; },
       ErrorCode::kInvalidPageTable},
      {"v_rows_disagree_with_k", kRaggedKv, [](F& f) { f.args.v.shape[0] -= 1; },
       ErrorCode::kInvalidShape},
      {"decode_q_rows_not_batch", bit(Op::kBatchDecode), [](F& f) { f.args.q.shape[0] = 2; },
       ErrorCode::kInvalidShape},
      {"single_v_len_disagrees_with_k", kSingle, [](F& f) { f.args.v.shape[0] -= 1; },
       ErrorCode::kInvalidShape},
      {"out_rows_disagree_with_q", bit(Op::kSinglePrefill) | kBatch,
       [](F& f) { f.args.out.shape[0] -= 1; }, ErrorCode::kInvalidShape},
  };
}

std::vector<AttentionCase> mask_and_alibi_cases() {
  std::vector<AttentionCase> cases;
  for (bool packed : {false, true}) {
    const std::string form = packed ? "_packed" : "_unpacked";
    cases.push_back({"custom_mask_too_short" + form, kAll,
                     [](F& f) { f.args.custom_mask.shape[0] -= 1; }, ErrorCode::kInvalidShape, true,
                     MaskMode::kCustom, packed});
    cases.push_back({"custom_mask_missing" + form, kAll,
                     [](F& f) { f.args.custom_mask = TensorView{}; }, ErrorCode::kInvalidArgument,
                     true, MaskMode::kCustom, packed});
    cases.push_back({"custom_mask_dtype_i32" + form, kAll,
                     [](F& f) {
                       f.args.custom_mask.dtype = DType::kI32;
                       f.args.custom_mask.shape[0] /= 4;
                     },
                     ErrorCode::kInvalidDType, true, MaskMode::kCustom, packed});
    cases.push_back({"custom_mask_overlaps_out" + form, kAll,
                     [](F& f) { f.args.out.data = f.args.custom_mask.data; }, ErrorCode::kAliasing,
                     true, MaskMode::kCustom, packed});
  }
  cases.push_back({"custom_mask_packing_flipped", kAll,
                   [](F& f) { f.args.custom_mask_packed = true; }, ErrorCode::kInvalidShape, true,
                   MaskMode::kCustom, false});
  cases.push_back({"custom_mask_without_custom_mode", kAll,
                   [](F& f) { f.problem.mask_mode = MaskMode::kCausal; },
                   ErrorCode::kInvalidArgument, false, MaskMode::kCustom, false});
  cases.push_back({"packed_flag_without_custom_mode", kAll,
                   [](F& f) { f.args.custom_mask_packed = true; }, ErrorCode::kInvalidArgument});
  auto with_slopes = [](F& f, int64_t n) {
    f.problem.pos_encoding_mode = PosEncoding::kAlibi;
    f.alibi_slopes.assign(static_cast<std::size_t>(n), 0.25f);
    f.args.alibi_slopes = f32_view(f.alibi_slopes, {n});
  };
  cases.push_back({"alibi_slopes_wrong_length", kAll,
                   [=](F& f) { with_slopes(f, f.problem.num_qo_heads - 1); },
                   ErrorCode::kInvalidShape, false});
  cases.push_back({"alibi_slopes_nan", kAll,
                   [=](F& f) {
                     with_slopes(f, f.problem.num_qo_heads);
                     f.alibi_slopes[1] = kNaN;
                   },
                   ErrorCode::kInvalidArgument, false});
  cases.push_back({"alibi_slopes_dtype_bf16", kAll,
                   [=](F& f) {
                     with_slopes(f, f.problem.num_qo_heads);
                     f.args.alibi_slopes.dtype = DType::kBF16;
                   },
                   ErrorCode::kInvalidDType, false});
  cases.push_back({"alibi_slopes_without_alibi", kAll,
                   [=](F& f) {
                     with_slopes(f, f.problem.num_qo_heads);
                     f.problem.pos_encoding_mode = PosEncoding::kNone;
                   },
                   ErrorCode::kInvalidArgument});
  return cases;
}

struct Param {
  const AttentionCase* c;
  Op op;
};

std::vector<Param> all_params() {
  static const std::vector<AttentionCase> cases = [] {
    std::vector<AttentionCase> all;
    for (auto part : {problem_cases(), tensor_cases(), index_cases(), mask_and_alibi_cases(),
                      variant_cases()}) {
      for (AttentionCase& c : part) all.push_back(std::move(c));
    }
    return all;
  }();
  std::vector<Param> params;
  for (const AttentionCase& c : cases) {
    for (Op op : kOps) {
      if (c.ops & bit(op)) params.push_back({&c, op});
    }
  }
  return params;
}

PlanOptions options_for(const AttentionCase& c, const std::string& backend) {
  PlanOptions opt;
  opt.backend = backend;
  if (c.name == "plan_num_threads_negative") opt.num_threads = -1;
  if (c.name == "plan_kv_chunk_size_negative") opt.kv_chunk_size = -16;
  return opt;
}

class AttentionBadInput : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionBadInput, RefusedWithExactKind) {
  const AttentionCase& c = *GetParam().c;
  const Op op = GetParam().op;
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    AttentionFixture f(op, c.mask, c.packed_mask);
    if (c.mutate) c.mutate(f);
    const PlanOptions opt = options_for(c, backend);
    Plan plan;
    Status planned = kvattn::plan(f.problem, f.args, opt, &plan);
    if (c.plan_needs_no_data && is_batch(op)) {
      EXPECT_TRUE(planned.ok()) << planned.to_string();
    } else {
      EXPECT_EQ(planned.code(), c.code) << planned.to_string();
      EXPECT_FALSE(planned.message().empty());
    }
    Status ran = kvattn::run(f.problem, f.args, opt);
    EXPECT_EQ(ran.code(), c.code) << ran.to_string();
    if (c.args_only) {
      // A plan made for the valid call, run on the broken tensors.
      AttentionFixture good(op, c.mask, c.packed_mask);
      Plan good_plan;
      Status ok = kvattn::plan(good.problem, good.args, opt, &good_plan);
      ASSERT_TRUE(ok.ok()) << ok.to_string();
      Status reran = kvattn::run(good_plan, f.args);
      EXPECT_EQ(reran.code(), c.code) << reran.to_string();
    }
    EXPECT_TRUE(all_equal(f.out, 0.0f)) << "out was written by a refused call";
    EXPECT_TRUE(all_equal(f.lse, 0.0f)) << "lse was written by a refused call";
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, AttentionBadInput, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.c->name + "_" + std::string(op_name(info.param.op));
                         });

// The fixtures themselves are valid, so each case above breaks one thing: every backend plans
// and runs them to finite outputs. (Whether a backend computes them right is its cross-check
// tests' business.)
struct BaselineParam {
  Op op;
  MaskMode mask;
  bool packed;
  KVLayout layout;
};

class AttentionBaseline : public ::testing::TestWithParam<BaselineParam> {};

TEST_P(AttentionBaseline, ValidFixtureRunsOnEveryBackend) {
  const BaselineParam& p = GetParam();
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    AttentionFixture f(p.op, p.mask, p.packed, p.layout);
    PlanOptions opt;
    opt.backend = backend;
    Status s = kvattn::run(f.problem, f.args, opt);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (float x : f.out) ASSERT_TRUE(std::isfinite(x));
    for (float x : f.lse) ASSERT_FALSE(std::isnan(x));
  }
}

std::vector<BaselineParam> baseline_params() {
  std::vector<BaselineParam> params;
  for (Op op : kOps) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      if (op == Op::kBatchPrefillRagged && layout == KVLayout::kHND) continue;
      params.push_back({op, MaskMode::kNone, false, layout});
    }
    params.push_back({op, MaskMode::kCustom, false, KVLayout::kNHD});
    params.push_back({op, MaskMode::kCustom, true, KVLayout::kNHD});
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Catalogue, AttentionBaseline, ::testing::ValuesIn(baseline_params()),
                         [](const ::testing::TestParamInfo<BaselineParam>& info) {
                           const BaselineParam& p = info.param;
                           return std::string(op_name(p.op)) + "_" +
                                  std::string(kv_layout_name(p.layout)) + "_" +
                                  std::string(mask_mode_name(p.mask)) + (p.packed ? "_packed" : "");
                         });

}  // namespace
}  // namespace kvattn::hardening

namespace kvattn::hardening {
namespace {

// Planning a batch operation from its index tensors alone (FlashInfer's plan has no q, out or
// cache): the plan runs on the full arguments to the same bits as one planned with them, and
// page ids past the cache that run is given are still refused there.
TEST(PlanFromIndexTensors, RunsLikeAFullPlanAndRunStillChecksThePageCount) {
  for (Op op : {Op::kBatchDecode, Op::kBatchPrefillPaged, Op::kBatchPrefillRagged}) {
    for (const std::string& backend : backends_under_test()) {
      SCOPED_TRACE(std::string(op_name(op)) + " on " + backend);
      AttentionFixture full(op), index_only(op);
      AttentionArgs plan_args = index_only.args;
      plan_args.q = plan_args.out = plan_args.lse = plan_args.k = plan_args.v = TensorView{};
      plan_args.paged_k_cache = plan_args.paged_v_cache = TensorView{};
      PlanOptions opt;
      opt.backend = backend;
      Plan from_index, from_all;
      ASSERT_TRUE(kvattn::plan(index_only.problem, plan_args, opt, &from_index).ok());
      ASSERT_TRUE(kvattn::plan(full.problem, full.args, opt, &from_all).ok());
      ASSERT_TRUE(kvattn::run(from_index, index_only.args).ok());
      ASSERT_TRUE(kvattn::run(from_all, full.args).ok());
      EXPECT_EQ(index_only.out, full.out);
      EXPECT_EQ(index_only.lse, full.lse);
      if (!is_paged(op)) continue;
      // The same page table over a cache with fewer pages than its largest page id.
      AttentionFixture small(op);
      const int64_t max_page =
          *std::max_element(small.kv_indices.begin(), small.kv_indices.end());
      for (TensorView* cache : {&small.args.paged_k_cache, &small.args.paged_v_cache}) {
        cache->shape[0] = max_page;
      }
      Status ran = kvattn::run(from_index, small.args);
      EXPECT_EQ(ran.code(), ErrorCode::kInvalidPageTable) << ran.to_string();
      EXPECT_TRUE(all_equal(small.out, 0.0f));
    }
  }
}

}  // namespace
}  // namespace kvattn::hardening
