// The test-case builder itself: page tables well formed, every real token's K/V slot holds a
// value and every other slot garbage (NaN), and the views cover exactly the owned buffers.
#include "testing/case_builder.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kvattn::testing {
namespace {

int64_t count_nan(const TensorView& t) {
  int64_t n = 0;
  for (float f : view_to_f32(t)) n += std::isnan(f);
  return n;
}

TEST(CaseBuilderTest, PagedCacheHoldsExactlyTheRequestTokens) {
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
    for (bool combined : {false, true}) {
      CaseSpec spec;
      spec.problem.op = Op::kBatchPrefillPaged;
      spec.problem.batch_size = 4;
      spec.problem.num_qo_heads = 4;
      spec.problem.num_kv_heads = 2;
      spec.problem.head_dim_qk = spec.problem.head_dim_vo = 8;
      spec.problem.page_size = 3;
      spec.problem.kv_layout = layout;
      spec.problem.kv_dtype = DType::kF16;
      spec.kv_lens = {5, 0, 3, 7};
      spec.qo_lens = {2, 1, 3, 1};
      spec.extra_pages = 2;
      spec.combined_kv_cache = combined;
      Case c = Case::make(spec);
      AttentionArgs a = c.args();
      EXPECT_EQ(c.kv_indptr, (std::vector<int32_t>{0, 2, 2, 3, 6}));
      EXPECT_EQ(c.kv_last_page_len, (std::vector<int32_t>{2, 0, 3, 1}));
      EXPECT_EQ(c.num_pages, 8);
      EXPECT_EQ(c.total_qo(), 7);
      EXPECT_EQ(a.q.shape_string(), "[7, 4, 8]");
      EXPECT_EQ(a.out.shape_string(), "[7, 4, 8]");
      // Real tokens: 15, each H_kv * D values in K and in V; everything else is NaN.
      const int64_t slots = c.num_pages * 3 * 2 * 8;
      EXPECT_EQ(count_nan(a.paged_k_cache), slots - 15 * 2 * 8);
      EXPECT_EQ(count_nan(a.paged_v_cache), slots - 15 * 2 * 8);
      EXPECT_LE(a.paged_v_cache.extent_elements() * 2, a.paged_v_cache.buffer_bytes);
    }
  }
}

TEST(CaseBuilderTest, FlopsAndBytesFollowTheDesign) {
  CaseSpec spec;
  spec.problem.op = Op::kSinglePrefill;
  spec.problem.num_qo_heads = 2;
  spec.problem.num_kv_heads = 1;
  spec.problem.head_dim_qk = spec.problem.head_dim_vo = 4;
  spec.problem.mask_mode = MaskMode::kCausal;
  spec.problem.q_dtype = spec.problem.kv_dtype = spec.problem.o_dtype = DType::kBF16;
  spec.kv_lens = {10};
  spec.qo_lens = {4};
  Case c = Case::make(spec);
  EXPECT_DOUBLE_EQ(c.flops(), (2.0 * 10 - 4) * 4 * 2 * 8);
  EXPECT_EQ(c.bytes_moved(), 4 * 2 * 4 * 2 + 10 * 1 * 8 * 2 + 4 * 2 * 4 * 2);
}

TEST(CaseBuilderTest, PackedMaskIsByteAlignedPerRequest) {
  CaseSpec spec;
  spec.problem.op = Op::kBatchPrefillRagged;
  spec.problem.batch_size = 2;
  spec.problem.mask_mode = MaskMode::kCustom;
  spec.kv_lens = {3, 5};
  spec.qo_lens = {3, 2};
  spec.packed_custom_mask = true;
  Case c = Case::make(spec);
  EXPECT_EQ(c.custom_mask.size(), (9 + 7) / 8 + (10 + 7) / 8);
  spec.packed_custom_mask = false;
  Case d = Case::make(spec);
  EXPECT_EQ(d.custom_mask.size(), 9u + 10u);
}

}  // namespace
}  // namespace kvattn::testing
