// Boundaries of the page table and of the masks: page size 1, last page full or partial, a
// request without pages, a request without queries, causal with more queries than keys.
#include <cmath>

#include "reference/ref_test_util.h"

namespace kvattn::reftest {
namespace {

Problem small_problem() {
  Problem p;
  p.num_qo_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim_qk = 4;
  p.head_dim_vo = 3;
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kF32;
  p.mask_mode = MaskMode::kCausal;
  return p;
}

// All values finite (unused slots hold NaN, so a read past a request's keys would show) and
// equal to the ragged run of the same requests.
void expect_matches_ragged(const Batch& batch, const PagedLayout& lay) {
  const Result ragged = run_ragged(batch), paged = run_paged(batch, lay, false);
  ASSERT_EQ(ragged.out.size(), paged.out.size());
  for (std::size_t i = 0; i < paged.out.size(); ++i) {
    ASSERT_FALSE(std::isnan(paged.out[i])) << i;
    ASSERT_EQ(paged.out[i], ragged.out[i]) << i;
  }
  for (std::size_t i = 0; i < paged.lse.size(); ++i) ASSERT_EQ(paged.lse[i], ragged.lse[i]) << i;
}

TEST(ReferenceBoundary, PageSizeOne) {
  const Batch batch(small_problem(), {2, 1}, {3, 5}, 1);
  PagedLayout lay;
  lay.page_size = 1;
  expect_matches_ragged(batch, lay);
}

TEST(ReferenceBoundary, LastPageFullAndPartial) {
  PagedLayout lay;
  lay.page_size = 4;
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
    lay.layout = layout;
    // 8 = two full pages, 9 = one slot on the last page, 7 = one slot short of full, 4 = one page.
    const Batch batch(small_problem(), {3, 2, 1, 4}, {8, 9, 7, 4}, 2);
    expect_matches_ragged(batch, lay);
  }
}

TEST(ReferenceBoundary, RequestWithoutPagesSeesNoKey) {
  const Batch batch(small_problem(), {2, 3, 1}, {5, 0, 3}, 3);
  PagedLayout lay;
  lay.page_size = 2;
  const Result paged = run_paged(batch, lay, false);
  const int hq = 2, dvo = 3;
  for (int64_t row = 2; row < 5; ++row) {  // the rows of request 1
    for (int h = 0; h < hq; ++h) {
      EXPECT_EQ(paged.lse[row * hq + h], -INFINITY) << row;
      for (int d = 0; d < dvo; ++d) EXPECT_EQ(paged.out[(row * hq + h) * dvo + d], 0.0f) << row;
    }
  }
  expect_matches_ragged(batch, lay);
}

TEST(ReferenceBoundary, BatchDecodeRequestWithoutPages) {
  Problem p = small_problem();
  p.mask_mode = MaskMode::kNone;
  const Batch batch(p, {1, 1}, {0, 3}, 4);
  const Result paged = run_paged(batch, {}, true);
  EXPECT_EQ(paged.lse[0], -INFINITY);
  EXPECT_EQ(paged.out[0], 0.0f);
  const Result second = run_single(batch, 1, true);
  for (int h = 0; h < 2; ++h) EXPECT_EQ(paged.lse[2 + h], second.lse[h]);
}

TEST(ReferenceBoundary, RequestWithoutQueries) {
  const Batch batch(small_problem(), {2, 0, 3}, {4, 6, 5}, 5);
  expect_matches_ragged(batch, {});
  const Result ragged = run_ragged(batch), last = run_single(batch, 2, false);
  for (std::size_t i = 0; i < last.out.size(); ++i) {
    EXPECT_EQ(ragged.out[2 * 2 * 3 + i], last.out[i]) << i;  // rows of request 2 start at row 2
  }
}

TEST(ReferenceBoundary, CausalWithMoreQueriesThanKeys) {
  // qo_len 4, kv_len 2: query i sees j <= i - 2, so rows 0 and 1 see nothing, row 2 sees key 0.
  Dense t(4, 2, 1, 1, 1, 1);
  t.p.mask_mode = MaskMode::kCausal;
  t.v = {3, 7};
  t.run();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(t.o(i, 0, 0), 0.0f) << i;
    EXPECT_EQ(t.lse_at(i, 0), -INFINITY) << i;
  }
  EXPECT_EQ(t.o(2, 0, 0), 3.0f);
  EXPECT_NEAR(t.o(3, 0, 0), 5.0, 1e-6);
}

TEST(ReferenceBoundary, WindowZeroSeesOnlyTheDiagonal) {
  Dense t(3, 3, 1, 1, 1, 1);
  t.p.mask_mode = MaskMode::kCausal;
  t.p.window_left = 0;
  t.v = {1, 2, 4};
  t.run();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(t.o(i, 0, 0), static_cast<float>(1 << i)) << i;
}

TEST(ReferenceBoundary, PackedMaskOfEachRequestStartsAtAByteBoundary) {
  // Two ragged requests of 1 x 3 bits each: request 1's bits start in byte 1, not at bit 3.
  Problem p = small_problem();
  p.num_qo_heads = 1;
  p.head_dim_vo = 1;
  p.mask_mode = MaskMode::kCustom;
  p.op = Op::kBatchPrefillRagged;
  p.batch_size = 2;
  std::vector<float> q(2 * 4, 0.0f), k(6 * 4, 0.0f), v = {1, 2, 4, 8, 16, 32};
  std::vector<int32_t> qo_indptr = {0, 1, 2}, kv_indptr = {0, 3, 6};
  std::vector<uint8_t> mask = {0b011, 0b100};
  std::vector<float> out(2, NAN), lse(2, NAN);
  AttentionArgs a;
  a.q = TensorView::contiguous(q.data(), DType::kF32, {2, 1, 4});
  a.k = TensorView::contiguous(k.data(), DType::kF32, {6, 1, 4});
  a.v = TensorView::contiguous(v.data(), DType::kF32, {6, 1, 1});
  a.qo_indptr = TensorView::contiguous(qo_indptr.data(), DType::kI32, {3});
  a.kv_indptr = TensorView::contiguous(kv_indptr.data(), DType::kI32, {3});
  a.custom_mask = TensorView::contiguous(mask.data(), DType::kU8, {2});
  a.custom_mask_packed = true;
  a.out = TensorView::contiguous(out.data(), DType::kF32, {2, 1, 1});
  a.lse = TensorView::contiguous(lse.data(), DType::kF32, {2, 1});
  ASSERT_TRUE(run_reference(p, a).ok());
  EXPECT_NEAR(out[0], 1.5, 1e-6);   // keys 0, 1
  EXPECT_NEAR(out[1], 32.0, 1e-6);  // key 2 of request 1
}

}  // namespace
}  // namespace kvattn::reftest
