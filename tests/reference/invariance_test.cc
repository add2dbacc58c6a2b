// Invariances: the same attention stored or split differently gives the same result. The
// reference does the same fp64 operations in the same order whatever the storage, so equal
// means bit-equal here, except where states are merged (fp64 merge, compared at 1e-6).
#include <cmath>

#include "reference/ref_test_util.h"
#include "reference/reference.h"

namespace kvattn::reftest {
namespace {

Problem base_problem(int hq = 4, int hk = 2, int dqk = 8, int dvo = 8) {
  Problem p;
  p.num_qo_heads = hq;
  p.num_kv_heads = hk;
  p.head_dim_qk = dqk;
  p.head_dim_vo = dvo;
  p.q_dtype = p.kv_dtype = DType::kF32;
  p.o_dtype = DType::kF32;
  p.mask_mode = MaskMode::kCausal;
  return p;
}

// Rows [row_begin, row_begin + rows) of `whole` equal all of `part` (bit for bit; NaN fails).
void expect_rows_equal(const Result& whole, int64_t row_begin, const Result& part, int hq, int dvo,
                       const char* what) {
  const int64_t rows = static_cast<int64_t>(part.lse.size()) / hq;
  for (int64_t n = 0; n < rows * hq; ++n) {
    ASSERT_EQ(whole.lse[row_begin * hq + n], part.lse[n]) << what << " lse row " << n;
    for (int d = 0; d < dvo; ++d) {
      ASSERT_EQ(whole.out[(row_begin * hq + n) * dvo + d], part.out[n * dvo + d])
          << what << " out row " << n << " d " << d;
    }
  }
}

void expect_equal(const Result& a, const Result& b, const char* what) {
  ASSERT_EQ(a.out.size(), b.out.size()) << what;
  for (std::size_t i = 0; i < a.out.size(); ++i) ASSERT_EQ(a.out[i], b.out[i]) << what << " " << i;
  for (std::size_t i = 0; i < a.lse.size(); ++i) ASSERT_EQ(a.lse[i], b.lse[i]) << what << " " << i;
}

TEST(ReferenceInvariance, BatchOfOneEqualsSingle) {
  Problem p = base_problem();
  p.pos_encoding_mode = PosEncoding::kRopeLlama;
  const Batch prefill(p, {5}, {9}, 1);
  const Result single = run_single(prefill, 0, false);
  expect_equal(single, run_ragged(prefill), "ragged");
  expect_equal(single, run_paged(prefill, {}, false), "paged");
  const Batch decode(p, {1}, {9}, 2);
  const Result single_decode = run_single(decode, 0, true);
  expect_equal(single_decode, run_paged(decode, {}, true), "batch decode");
  expect_equal(single_decode, run_single(decode, 0, false), "single prefill of one row");
}

TEST(ReferenceInvariance, BatchEqualsEachRequestAlone) {
  Problem p = base_problem();
  p.window_left = 3;
  const Batch batch(p, {3, 1, 6}, {7, 4, 6}, 3);
  const Result ragged = run_ragged(batch), paged = run_paged(batch, {}, false);
  int64_t row = 0;
  for (int b = 0; b < batch.batch(); ++b) {
    const Result single = run_single(batch, b, false);
    expect_rows_equal(ragged, row, single, p.num_qo_heads, p.head_dim_vo, "ragged");
    expect_rows_equal(paged, row, single, p.num_qo_heads, p.head_dim_vo, "paged");
    row += batch.qo_lens[b];
  }
}

TEST(ReferenceInvariance, SingleNhdEqualsHnd) {
  const Batch batch(base_problem(), {4}, {7}, 4);
  expect_equal(run_single(batch, 0, false, KVLayout::kNHD),
               run_single(batch, 0, false, KVLayout::kHND), "HND");
}

TEST(ReferenceInvariance, PagedEqualsContiguousForAnyPageOrderSizeAndLayout) {
  Problem p = base_problem();
  p.kv_dtype = DType::kE4M3;  // a 1-byte dtype through the same page arithmetic
  Batch batch(p, {2, 3, 1}, {5, 8, 13}, 5);
  batch.scalars.k_scale = 0.5f;
  const Result ragged = run_ragged(batch);
  for (int page_size : {1, 3, 4, 8, 16}) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (bool combined : {false, true}) {
        for (bool shuffle : {false, true}) {
          PagedLayout lay;
          lay.page_size = page_size;
          lay.layout = layout;
          lay.combined = combined;
          lay.shuffle = shuffle;
          lay.seed = static_cast<uint64_t>(page_size) * 31 + combined;
          SCOPED_TRACE(::testing::Message()
                       << "page_size " << page_size << " " << kv_layout_name(layout) << " combined "
                       << combined << " shuffle " << shuffle);
          expect_equal(ragged, run_paged(batch, lay, false), "paged");
        }
      }
    }
  }
}

TEST(ReferenceInvariance, BatchDecodeEqualsSingleDecodePerRequest) {
  Problem p = base_problem(6, 2, 4, 6);
  p.pos_encoding_mode = PosEncoding::kAlibi;
  p.mask_mode = MaskMode::kNone;
  const Batch batch(p, {1, 1, 1}, {1, 4, 9}, 6);
  PagedLayout lay;
  lay.layout = KVLayout::kHND;
  lay.page_size = 2;
  const Result paged = run_paged(batch, lay, true);
  for (int b = 0; b < 3; ++b) {
    expect_rows_equal(paged, b, run_single(batch, b, true), p.num_qo_heads, p.head_dim_vo,
                      "decode");
  }
}

TEST(ReferenceInvariance, GqaEqualsKvHeadsRepeated) {
  Problem gqa = base_problem(6, 2, 4, 4);
  gqa.pos_encoding_mode = PosEncoding::kRopeLlama;
  const Batch grouped(gqa, {3}, {5}, 8);
  // The same keys and values with every KV head repeated for each of its 3 query heads.
  Problem mha = gqa;
  mha.num_kv_heads = 6;
  Batch repeated(mha, {3}, {5}, 8);
  repeated.q = grouped.q;
  for (auto field : {&Batch::k, &Batch::v}) {
    const auto& src = (grouped.*field)[0];
    auto& dst = (repeated.*field)[0];
    const int64_t row_bytes = 4 * sizeof(float);  // one head of D = 4 f32
    for (int64_t j = 0; j < 5; ++j) {
      for (int h = 0; h < 6; ++h) {
        std::memcpy(&dst[(j * 6 + h) * row_bytes], &src[(j * 2 + h / 3) * row_bytes], row_bytes);
      }
    }
  }
  expect_equal(run_single(grouped, 0, false), run_single(repeated, 0, false), "repeated heads");
}

TEST(ReferenceInvariance, CausalSquareEqualsLowerTriangleCustomMask) {
  Problem p = base_problem();
  const Batch batch(p, {4, 6}, {4, 6}, 9);
  const Result causal = run_ragged(batch);
  // The same problem with an explicit lower-triangular mask, per request.
  Problem custom = p;
  custom.mask_mode = MaskMode::kCustom;
  custom.op = Op::kBatchPrefillRagged;
  custom.batch_size = 2;
  std::vector<uint8_t> mask;
  for (int64_t len : {4, 6}) {
    for (int64_t i = 0; i < len; ++i) {
      for (int64_t j = 0; j < len; ++j) mask.push_back(j <= i ? 1 : 0);
    }
  }
  std::vector<std::byte> q, k, v;
  for (int b = 0; b < 2; ++b) {
    q.insert(q.end(), batch.q[b].begin(), batch.q[b].end());
    k.insert(k.end(), batch.k[b].begin(), batch.k[b].end());
    v.insert(v.end(), batch.v[b].begin(), batch.v[b].end());
  }
  std::vector<int32_t> indptr = {0, 4, 10};
  std::vector<float> out(10 * 4 * 8, NAN), lse(10 * 4, NAN);
  AttentionArgs a;
  a.q = TensorView::contiguous(q.data(), DType::kF32, {10, 4, 8});
  a.k = TensorView::contiguous(k.data(), DType::kF32, {10, 2, 8});
  a.v = TensorView::contiguous(v.data(), DType::kF32, {10, 2, 8});
  a.qo_indptr = a.kv_indptr = TensorView::contiguous(indptr.data(), DType::kI32, {3});
  a.custom_mask = TensorView::contiguous(mask.data(), DType::kU8, {52});
  a.out = TensorView::contiguous(out.data(), DType::kF32, {10, 4, 8});
  a.lse = TensorView::contiguous(lse.data(), DType::kF32, {10, 4});
  ASSERT_TRUE(run_reference(custom, a).ok());
  expect_equal(causal, Result{out, lse}, "lower-triangular custom mask");
}

// Splitting the keys of a request into two chunks (two ragged requests over the same queries,
// without causal) and merging the two states equals attending over all keys at once.
TEST(ReferenceInvariance, SplitKeysThenMergeEqualsAllKeys) {
  Problem p = base_problem(2, 1, 4, 3);
  p.mask_mode = MaskMode::kNone;
  const Batch whole(p, {3}, {7}, 10);
  const Result all = run_single(whole, 0, false);
  const int64_t split = 4, dk = 4 * 4, dv = 3 * 4;  // row bytes of K, V (1 KV head)
  Batch first(p, {3}, {split}, 11), second(p, {3}, {7 - split}, 12);
  first.q = second.q = whole.q;
  first.k[0].assign(whole.k[0].begin(), whole.k[0].begin() + split * dk);
  first.v[0].assign(whole.v[0].begin(), whole.v[0].begin() + split * dv);
  second.k[0].assign(whole.k[0].begin() + split * dk, whole.k[0].end());
  second.v[0].assign(whole.v[0].begin() + split * dv, whole.v[0].end());
  Result a = run_single(first, 0, false), b = run_single(second, 0, false);
  std::vector<float> merged(all.out.size(), NAN), merged_lse(all.lse.size(), NAN);
  auto v3 = [](std::vector<float>& x) {
    return TensorView::contiguous(x.data(), DType::kF32, {3, 2, 3});
  };
  auto s2 = [](std::vector<float>& x) {
    return TensorView::contiguous(x.data(), DType::kF32, {3, 2});
  };
  ASSERT_TRUE(
      ref::merge_state(v3(a.out), s2(a.lse), v3(b.out), s2(b.lse), v3(merged), s2(merged_lse))
          .ok());
  for (std::size_t i = 0; i < all.out.size(); ++i) EXPECT_NEAR(merged[i], all.out[i], 1e-6) << i;
  for (std::size_t i = 0; i < all.lse.size(); ++i)
    EXPECT_NEAR(merged_lse[i], all.lse[i], 1e-6) << i;
}

// Strides are honoured: q read out of a fused [N, 3, H, D] projection buffer, K/V rows with a
// padded head stride, and an output with padding between heads give the contiguous result.
TEST(ReferenceInvariance, StridedViewsEqualContiguous) {
  Problem p = base_problem(2, 1, 4, 4);
  p.op = Op::kSinglePrefill;
  const Batch batch(p, {3}, {5}, 15);
  const Result contiguous = run_single(batch, 0, false);
  const float* q = reinterpret_cast<const float*>(batch.q[0].data());
  const float* k = reinterpret_cast<const float*>(batch.k[0].data());
  const float* v = reinterpret_cast<const float*>(batch.v[0].data());
  std::vector<float> qkv(3 * 3 * 2 * 4, NAN), k_padded(5 * 6, NAN), v_padded(5 * 6, NAN);
  for (int i = 0; i < 3; ++i) {
    for (int e = 0; e < 2 * 4; ++e) qkv[i * 3 * 8 + e] = q[i * 8 + e];  // slot 0 of [3, H, D]
  }
  for (int j = 0; j < 5; ++j) {
    for (int d = 0; d < 4; ++d) {
      k_padded[j * 6 + d] = k[j * 4 + d];
      v_padded[j * 6 + d] = v[j * 4 + d];
    }
  }
  std::vector<float> out(3 * 2 * 7, NAN), lse(3 * 2, NAN);
  AttentionArgs a;
  a.q = TensorView::strided(qkv.data(), DType::kF32, {3, 2, 4}, {24, 4, 1});
  a.k = TensorView::strided(k_padded.data(), DType::kF32, {5, 1, 4}, {6, 6, 1});
  a.v = TensorView::strided(v_padded.data(), DType::kF32, {5, 1, 4}, {6, 6, 1});
  a.out = TensorView::strided(out.data(), DType::kF32, {3, 2, 4}, {14, 7, 1});
  a.lse = TensorView::contiguous(lse.data(), DType::kF32, {3, 2});
  ASSERT_TRUE(run_reference(p, a).ok());
  for (int row = 0; row < 6; ++row) {
    EXPECT_EQ(lse[row], contiguous.lse[row]) << row;
    for (int d = 0; d < 4; ++d) EXPECT_EQ(out[row * 7 + d], contiguous.out[row * 4 + d]) << row;
    for (int d = 4; d < 7; ++d) EXPECT_TRUE(std::isnan(out[row * 7 + d])) << "padding written";
  }
}

// With RoPE, a score depends only on the distance between query and key: prepending keys to
// the cache (so the query moves by the same amount) leaves a query that attends to one window of
// keys unchanged.
TEST(ReferenceInvariance, RopeScoresDependOnlyOnRelativePosition) {
  Problem p = base_problem(1, 1, 8, 4);
  p.pos_encoding_mode = PosEncoding::kRopeLlama;
  p.mask_mode = MaskMode::kCausal;
  p.window_left = 2;
  const Batch shorter(p, {1}, {3}, 13);
  Batch longer(p, {1}, {8}, 14);
  longer.q = shorter.q;
  // The last 3 keys of `longer` are the keys of `shorter`.
  std::copy(shorter.k[0].begin(), shorter.k[0].end(), longer.k[0].end() - shorter.k[0].size());
  std::copy(shorter.v[0].begin(), shorter.v[0].end(), longer.v[0].end() - shorter.v[0].size());
  const Result a = run_single(shorter, 0, false), b = run_single(longer, 0, false);
  for (std::size_t i = 0; i < a.out.size(); ++i) EXPECT_NEAR(a.out[i], b.out[i], 1e-6) << i;
  EXPECT_NEAR(a.lse[0], b.lse[0], 1e-6);
}

}  // namespace
}  // namespace kvattn::reftest
