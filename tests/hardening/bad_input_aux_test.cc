// The catalogue of bad inputs to the operations that are not attention: merge_state,
// merge_states, append_paged_kv_cache and apply_rope, each with the exact error kind, through
// the public API on every available backend and "auto". Outputs stay untouched when refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "hardening/backends_under_test.h"
#include "hardening/fixtures.h"
#include "kvattn/attention.h"

namespace kvattn::hardening {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void add_unit_dim(TensorView* t) {
  t->shape[t->rank] = 1;
  t->strides[t->rank] = 1;
  ++t->rank;
}

OpOptions options_for(const std::string& backend) {
  OpOptions opt;
  opt.backend = backend;
  return opt;
}

// ---- merge_state / merge_states ----

struct MergeCase {
  std::string name;
  std::function<void(MergeFixture&)> mutate;
  ErrorCode code;
};

std::vector<MergeCase> merge_cases() {
  using M = MergeFixture;
  return {
      {"merge_state_v_b_shape_mismatch", [](M& f) { f.tv_b.shape[1] = 1; },
       ErrorCode::kInvalidShape},
      {"merge_state_s_a_wrong_rank", [](M& f) { add_unit_dim(&f.ts_a); }, ErrorCode::kInvalidShape},
      {"merge_state_v_a_wrong_rank", [](M& f) { add_unit_dim(&f.tv_a); }, ErrorCode::kInvalidShape},
      {"merge_state_s_a_dtype_f16", [](M& f) { f.ts_a.dtype = DType::kF16; },
       ErrorCode::kInvalidDType},
      {"merge_state_v_a_dtype_fp8",
       [](M& f) {
         f.tv_a.dtype = DType::kE4M3;
         f.tv_b.dtype = DType::kE4M3;
       },
       ErrorCode::kInvalidDType},
      {"merge_state_s_out_missing", [](M& f) { f.ts_out = TensorView{}; },
       ErrorCode::kInvalidArgument},
      {"merge_state_v_out_aliases_v_a", [](M& f) { f.tv_out = f.tv_a; }, ErrorCode::kAliasing},
      {"merge_state_s_out_aliases_s_b", [](M& f) { f.ts_out.data = f.ts_b.data; },
       ErrorCode::kAliasing},
      {"merge_state_v_out_stride_zero", [](M& f) { f.tv_out.strides[0] = 0; },
       ErrorCode::kAliasing},
      {"merge_state_stride_leaves_buffer", [](M& f) { f.tv_a.strides[1] += 1; },
       ErrorCode::kOutOfBounds},
      {"merge_state_huge_shape_tiny_buffer",
       [](M& f) {
         f.tv_a.shape[0] = int64_t{1} << 31;
         f.tv_b.shape[0] = int64_t{1} << 31;
       },
       ErrorCode::kOutOfBounds},
      {"merge_state_offsets_overflow_int64", [](M& f) { f.ts_b.strides[0] = int64_t{1} << 62; },
       ErrorCode::kOverflow},
      {"merge_states_s_wrong_state_count", [](M& f) { f.ts_many.shape[1] = 2; },
       ErrorCode::kInvalidShape},
      {"merge_states_v_out_wrong_heads", [](M& f) { f.tv_merged.shape[1] = 1; },
       ErrorCode::kInvalidShape},
      {"merge_states_s_out_dtype_bf16", [](M& f) { f.ts_merged.dtype = DType::kBF16; },
       ErrorCode::kInvalidDType},
      {"merge_states_v_out_overlaps_v", [](M& f) { f.tv_merged.data = f.tv_many.data; },
       ErrorCode::kAliasing},
      {"merge_states_v_missing", [](M& f) { f.tv_many = TensorView{}; },
       ErrorCode::kInvalidArgument},
      {"merge_states_negative_stride", [](M& f) { f.ts_many.strides[2] = -1; },
       ErrorCode::kOutOfBounds},
  };
}

class MergeBadInput : public ::testing::TestWithParam<MergeCase> {};

TEST_P(MergeBadInput, RefusedWithExactKind) {
  const MergeCase& c = GetParam();
  const bool many = c.name.rfind("merge_states", 0) == 0;
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    MergeFixture f;
    c.mutate(f);
    Status s = many ? kvattn::merge_states(f.tv_many, f.ts_many, f.tv_merged, f.ts_merged,
                                           options_for(backend))
                    : kvattn::merge_state(f.tv_a, f.ts_a, f.tv_b, f.ts_b, f.tv_out, f.ts_out,
                                          options_for(backend));
    EXPECT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_TRUE(all_equal(f.v_out, 0.0f) && all_equal(f.s_out, 0.0f));
    EXPECT_TRUE(all_equal(f.v_merged, 0.0f) && all_equal(f.s_merged, 0.0f));
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, MergeBadInput, ::testing::ValuesIn(merge_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- append_paged_kv_cache ----

struct AppendCase {
  std::string name;
  std::function<void(AppendFixture&)> mutate;
  ErrorCode code;
};

std::vector<AppendCase> append_cases() {
  using A = AppendFixture;
  return {
      {"append_k_scale_nan", [](A& f) { f.cache.k_scale = kNaN; }, ErrorCode::kInvalidScale},
      {"append_v_scale_zero", [](A& f) { f.cache.v_scale = 0.0f; }, ErrorCode::kInvalidScale},
      {"append_k_scale_negative", [](A& f) { f.cache.k_scale = -2.0f; }, ErrorCode::kInvalidScale},
      {"append_v_scale_inf", [](A& f) { f.cache.v_scale = kInf; }, ErrorCode::kInvalidScale},
      {"append_batch_index_out_of_range", [](A& f) { f.batch_indices[1] = 3; },
       ErrorCode::kOutOfBounds},
      // -1 is a padded row (written nowhere); every other negative index is refused.
      {"append_batch_index_negative", [](A& f) { f.batch_indices[0] = -2; },
       ErrorCode::kOutOfBounds},
      {"append_batch_index_int_min",
       [](A& f) { f.batch_indices[0] = std::numeric_limits<int32_t>::min(); },
       ErrorCode::kOutOfBounds},
      {"append_position_past_kv_len", [](A& f) { f.positions[2] = 9; }, ErrorCode::kOutOfBounds},
      {"append_position_negative", [](A& f) { f.positions[3] = -1; }, ErrorCode::kOutOfBounds},
      {"append_into_request_without_pages", [](A& f) { f.batch_indices[0] = 1; },
       ErrorCode::kOutOfBounds},
      {"append_kv_indptr_decreasing", [](A& f) { f.kv_indptr[2] = 1; },
       ErrorCode::kInvalidPageTable},
      {"append_page_index_out_of_range", [](A& f) { f.kv_indices[1] = 7; },
       ErrorCode::kInvalidPageTable},
      {"append_last_page_len_zero", [](A& f) { f.kv_last_page_len[2] = 0; },
       ErrorCode::kInvalidPageTable},
      {"append_last_page_len_past_page_size", [](A& f) { f.kv_last_page_len[0] = 5; },
       ErrorCode::kInvalidPageTable},
      {"append_k_heads_mismatch", [](A& f) { f.tappend_k.shape[1] = 1; }, ErrorCode::kInvalidShape},
      {"append_v_nnz_mismatch", [](A& f) { f.tappend_v.shape[0] = 3; }, ErrorCode::kInvalidShape},
      {"append_positions_length_mismatch", [](A& f) { f.tpositions.shape[0] = 3; },
       ErrorCode::kInvalidShape},
      {"append_v_cache_pages_mismatch", [](A& f) { f.cache.v_cache.shape[0] = 6; },
       ErrorCode::kInvalidShape},
      {"append_cache_dtype_i32", [](A& f) { f.cache.k_cache.dtype = DType::kI32; },
       ErrorCode::kInvalidDType},
      {"append_input_dtype_fp8", [](A& f) { f.tappend_k.dtype = DType::kE5M2; },
       ErrorCode::kInvalidDType},
      {"append_v_cache_dtype_differs", [](A& f) { f.cache.v_cache.dtype = DType::kBF16; },
       ErrorCode::kInvalidDType},
      {"append_positions_dtype_f32", [](A& f) { f.tpositions.dtype = DType::kF32; },
       ErrorCode::kInvalidDType},
      {"append_cache_aliases_append_k", [](A& f) { f.cache.k_cache.data = f.tappend_k.data; },
       ErrorCode::kAliasing},
      {"append_v_cache_is_k_cache", [](A& f) { f.cache.v_cache = f.cache.k_cache; },
       ErrorCode::kAliasing},
      {"append_cache_huge_tiny_buffer",
       [](A& f) {
         f.cache.k_cache.shape[0] = int64_t{1} << 30;
         f.cache.v_cache.shape[0] = int64_t{1} << 30;
       },
       ErrorCode::kOutOfBounds},
      {"append_kv_indptr_in_device_memory",
       [](A& f) { f.cache.kv_indptr.memory = MemoryKind::kCuda; }, ErrorCode::kInvalidArgument},
      {"append_k_missing", [](A& f) { f.tappend_k = TensorView{}; }, ErrorCode::kInvalidArgument},
  };
}

class AppendBadInput : public ::testing::TestWithParam<AppendCase> {};

TEST_P(AppendBadInput, RefusedWithExactKind) {
  const AppendCase& c = GetParam();
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    AppendFixture f;
    c.mutate(f);
    Status s = kvattn::append_paged_kv_cache(f.tappend_k, f.tappend_v, f.tbatch_indices,
                                             f.tpositions, f.cache, options_for(backend));
    EXPECT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_TRUE(all_equal(f.k_cache, uint8_t{0}) && all_equal(f.v_cache, uint8_t{0}))
        << "the cache was written by a refused call";
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, AppendBadInput, ::testing::ValuesIn(append_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- apply_rope ----

struct RopeCase {
  std::string name;
  std::function<void(RopeFixture&)> mutate;
  ErrorCode code;
};

// A host f32 cos/sin cache [rows, cols] over storage that outlives every case.
TensorView rope_cache(int64_t rows, int64_t cols) {
  static std::vector<float> storage(4096, 0.5f);
  return TensorView::contiguous(storage.data(), DType::kF32, {rows, cols});
}
int head_dim(const RopeFixture& f) { return static_cast<int>(f.tq.shape[2]); }

std::vector<RopeCase> rope_cases() {
  using R = RopeFixture;
  return {
      {"rope_rotary_dim_odd", [](R& f) { f.rope.rotary_dim = 3; }, ErrorCode::kInvalidShape},
      {"rope_rotary_dim_negative", [](R& f) { f.rope.rotary_dim = -2; }, ErrorCode::kInvalidShape},
      {"rope_rotary_dim_above_head_dim", [](R& f) { f.rope.rotary_dim = head_dim(f) + 2; },
       ErrorCode::kInvalidShape},
      {"rope_llama31_low_nan",
       [](R& f) {
         f.rope.llama31 = Llama31Scaling{kNaN, 4.0f, 8192.0f};
       },
       ErrorCode::kInvalidScale},
      {"rope_llama31_high_inf",
       [](R& f) {
         f.rope.llama31 = Llama31Scaling{1.0f, kInf, 8192.0f};
       },
       ErrorCode::kInvalidScale},
      {"rope_llama31_high_equals_low",
       [](R& f) {
         f.rope.llama31 = Llama31Scaling{4.0f, 4.0f, 8192.0f};
       },
       ErrorCode::kInvalidScale},
      {"rope_llama31_high_below_low",
       [](R& f) {
         f.rope.llama31 = Llama31Scaling{4.0f, 1.0f, 8192.0f};
       },
       ErrorCode::kInvalidScale},
      {"rope_llama31_old_context_len_zero",
       [](R& f) {
         f.rope.llama31 = Llama31Scaling{1.0f, 4.0f, 0.0f};
       },
       ErrorCode::kInvalidScale},
      {"rope_cache_rank_1",
       [](R& f) {
         f.rope.cos_sin_cache = rope_cache(200, head_dim(f));
         f.rope.cos_sin_cache.rank = 1;
       },
       ErrorCode::kInvalidShape},
      {"rope_cache_dtype_bf16",
       [](R& f) {
         f.rope.cos_sin_cache = rope_cache(200, head_dim(f));
         f.rope.cos_sin_cache.dtype = DType::kBF16;
       },
       ErrorCode::kInvalidDType},
      {"rope_cache_odd_columns",
       [](R& f) { f.rope.cos_sin_cache = rope_cache(200, head_dim(f) - 1); },
       ErrorCode::kInvalidShape},
      {"rope_cache_wider_than_head_dim",
       [](R& f) { f.rope.cos_sin_cache = rope_cache(200, head_dim(f) + 2); },
       ErrorCode::kInvalidShape},
      {"rope_cache_disagrees_with_rotary_dim",
       [](R& f) {
         f.rope.cos_sin_cache = rope_cache(200, head_dim(f));
         f.rope.rotary_dim = 2;
       },
       ErrorCode::kInvalidShape},
      // pos_ids holds 100: a cache of 100 rows ends one short.
      {"rope_cache_position_past_last_row",
       [](R& f) { f.rope.cos_sin_cache = rope_cache(100, head_dim(f)); }, ErrorCode::kOutOfBounds},
      {"rope_cache_buffer_too_small",
       [](R& f) {
         f.rope.cos_sin_cache = rope_cache(200, head_dim(f));
         f.rope.cos_sin_cache.buffer_bytes = 64;
       },
       ErrorCode::kOutOfBounds},
      {"rope_theta_nan", [](R& f) { f.rope.rope_theta = kNaN; }, ErrorCode::kInvalidScale},
      {"rope_scale_zero", [](R& f) { f.rope.rope_scale = 0.0f; }, ErrorCode::kInvalidScale},
      {"rope_theta_negative", [](R& f) { f.rope.rope_theta = -1e4f; }, ErrorCode::kInvalidScale},
      {"rope_odd_head_dim",
       [](R& f) {
         for (TensorView* t : {&f.tq, &f.tk, &f.tq_out, &f.tk_out}) t->shape[2] = 7;
       },
       ErrorCode::kInvalidShape},
      {"rope_head_dims_differ", [](R& f) { f.tk.shape[2] = f.tk_out.shape[2] = 6; },
       ErrorCode::kInvalidShape},
      {"rope_pos_ids_negative", [](R& f) { f.pos_ids[4] = -3; }, ErrorCode::kInvalidArgument},
      {"rope_pos_ids_length_mismatch", [](R& f) { f.tpos_ids.shape[0] = 4; },
       ErrorCode::kInvalidShape},
      {"rope_pos_ids_dtype_f32", [](R& f) { f.tpos_ids.dtype = DType::kF32; },
       ErrorCode::kInvalidDType},
      {"rope_q_out_shape_mismatch", [](R& f) { f.tq_out.shape[1] = 2; }, ErrorCode::kInvalidShape},
      {"rope_k_nnz_mismatch", [](R& f) { f.tk.shape[0] = f.tk_out.shape[0] = 4; },
       ErrorCode::kInvalidShape},
      {"rope_q_dtype_fp8", [](R& f) { f.tq.dtype = DType::kE4M3; }, ErrorCode::kInvalidDType},
      {"rope_q_out_shifted_in_place",
       [](R& f) {
         // Same shape as q, one element in: overlapping, yet not the in-place view.
         f.tq.shape[0] = 4;
         f.tq_out = f.tq;
         f.tq_out.data = static_cast<float*>(f.tq.data) + 1;
         f.tq_out.buffer_bytes = f.tq.buffer_bytes - 4;
         f.tk.shape[0] = f.tk_out.shape[0] = f.tpos_ids.shape[0] = 4;
       },
       ErrorCode::kAliasing},
      {"rope_k_out_overlaps_q_out", [](R& f) { f.tk_out.data = f.tq_out.data; },
       ErrorCode::kAliasing},
      {"rope_q_out_overlaps_k", [](R& f) { f.tq_out.data = f.tk.data; }, ErrorCode::kAliasing},
      {"rope_q_out_without_q", [](R& f) { f.tq = TensorView{}; }, ErrorCode::kInvalidArgument},
      {"rope_pos_ids_missing", [](R& f) { f.tpos_ids = TensorView{}; },
       ErrorCode::kInvalidArgument},
      {"rope_k_stride_leaves_buffer", [](R& f) { f.tk.strides[0] += 1; }, ErrorCode::kOutOfBounds},
      {"rope_q_huge_tiny_buffer", [](R& f) { f.tq.strides[1] = int64_t{1} << 34; },
       ErrorCode::kOutOfBounds},
  };
}

class RopeBadInput : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeBadInput, RefusedWithExactKind) {
  const RopeCase& c = GetParam();
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    RopeFixture f;
    const std::vector<float> q_before = f.q, k_before = f.k;
    c.mutate(f);
    Status s = kvattn::apply_rope(f.tq, f.tk, f.tq_out, f.tk_out, f.tpos_ids, f.rope,
                                  options_for(backend));
    EXPECT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_TRUE(all_equal(f.q_out, 0.0f) && all_equal(f.k_out, 0.0f));
    EXPECT_TRUE(f.q == q_before && f.k == k_before);
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, RopeBadInput, ::testing::ValuesIn(rope_cases()),
                         [](const auto& info) { return info.param.name; });

// The valid fixtures run on the backends that auto picks for them, so each case above breaks one
// thing only. (A backend that does not implement an aux op answers kNotSupported for it.)
TEST(AuxBaseline, ValidFixturesRun) {
  for (const std::string& backend : {"reference", "auto"}) {
    SCOPED_TRACE(std::string("backend ") + backend);
    MergeFixture m;
    Status s = kvattn::merge_state(m.tv_a, m.ts_a, m.tv_b, m.ts_b, m.tv_out, m.ts_out,
                                   options_for(backend));
    EXPECT_TRUE(s.ok()) << s.to_string();
    s = kvattn::merge_states(m.tv_many, m.ts_many, m.tv_merged, m.ts_merged, options_for(backend));
    EXPECT_TRUE(s.ok()) << s.to_string();
    for (DType cache_dtype : {DType::kF32, DType::kE4M3}) {
      for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
        AppendFixture a(cache_dtype, layout);
        s = kvattn::append_paged_kv_cache(a.tappend_k, a.tappend_v, a.tbatch_indices, a.tpositions,
                                          a.cache, options_for(backend));
        EXPECT_TRUE(s.ok()) << s.to_string();
      }
    }
    RopeFixture r;
    s = kvattn::apply_rope(r.tq, r.tk, r.tq_out, r.tk_out, r.tpos_ids, r.rope,
                           options_for(backend));
    EXPECT_TRUE(s.ok()) << s.to_string();
    // In place: the output is exactly the input view.
    s = kvattn::apply_rope(r.tq, r.tk, r.tq, r.tk, r.tpos_ids, r.rope, options_for(backend));
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
}

}  // namespace
}  // namespace kvattn::hardening
