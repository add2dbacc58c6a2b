// The reference's operations that are not attention: merge_state(s), append_paged_kv_cache,
// apply_rope, each through the public API with backend "reference".
#include <cmath>

#include "core/numeric.h"
#include "reference/ref_test_util.h"
#include "reference/reference.h"

namespace kvattn::reftest {
namespace {

OpOptions reference_options() {
  OpOptions o;
  o.backend = "reference";
  return o;
}

TensorView f32_view(std::vector<float>& x, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(x.data(), DType::kF32, shape);
}

TEST(ReferenceMergeState, WeightsEachStateByItsSumOfExponentials) {
  // State a: sum e^lse = 1, o = (1, -2); state b: sum = 3, o = (5, 2).
  std::vector<float> va = {1, -2}, sa = {0}, vb = {5, 2}, sb = {static_cast<float>(std::log(3.0))};
  std::vector<float> vo(2, NAN), so(1, NAN);
  ASSERT_TRUE(merge_state(f32_view(va, {1, 1, 2}), f32_view(sa, {1, 1}), f32_view(vb, {1, 1, 2}),
                          f32_view(sb, {1, 1}), f32_view(vo, {1, 1, 2}), f32_view(so, {1, 1}),
                          reference_options())
                  .ok());
  EXPECT_NEAR(vo[0], (1 + 3 * 5) / 4.0, 1e-6);
  EXPECT_NEAR(vo[1], (-2 + 3 * 2) / 4.0, 1e-6);
  EXPECT_NEAR(so[0], std::log(4.0), 1e-6);
}

TEST(ReferenceMergeState, MinusInfinityStatesAreIdentities) {
  // Row 0: a is empty (its o is NaN garbage, which must not leak); row 1: b is empty;
  // row 2: both empty -> 0 and -inf.
  std::vector<float> va = {NAN, 1.5f, 7}, sa = {-INFINITY, 2, -INFINITY};
  std::vector<float> vb = {2.5f, NAN, 9}, sb = {1, -INFINITY, -INFINITY};
  std::vector<float> vo(3, NAN), so(3, NAN);
  ASSERT_TRUE(merge_state(f32_view(va, {3, 1, 1}), f32_view(sa, {3, 1}), f32_view(vb, {3, 1, 1}),
                          f32_view(sb, {3, 1}), f32_view(vo, {3, 1, 1}), f32_view(so, {3, 1}),
                          reference_options())
                  .ok());
  EXPECT_EQ(vo[0], 2.5f);
  EXPECT_EQ(so[0], 1.0f);
  EXPECT_EQ(vo[1], 1.5f);
  EXPECT_EQ(so[1], 2.0f);
  EXPECT_EQ(vo[2], 0.0f);
  EXPECT_EQ(so[2], -INFINITY);
}

TEST(ReferenceMergeState, SixteenBitValuesRoundOnce) {
  // bf16 in and out: (1 * 1 + 1 * (1 + 2^-6)) / 2 = 1 + 2^-7 is exact in bf16.
  uint16_t va[1] = {num::f32_to_bf16(1.0f)}, vb[1] = {num::f32_to_bf16(1.0f + 1.0f / 64)};
  uint16_t vo[1] = {0};
  std::vector<float> sa = {0.5f}, sb = {0.5f}, so(1);
  ASSERT_TRUE(merge_state(TensorView::contiguous(va, DType::kBF16, {1, 1, 1}), f32_view(sa, {1, 1}),
                          TensorView::contiguous(vb, DType::kBF16, {1, 1, 1}), f32_view(sb, {1, 1}),
                          TensorView::contiguous(vo, DType::kBF16, {1, 1, 1}), f32_view(so, {1, 1}),
                          reference_options())
                  .ok());
  EXPECT_EQ(num::bf16_to_f32(vo[0]), 1.0f + 1.0f / 128);
  EXPECT_NEAR(so[0], 0.5 + std::log(2.0), 1e-6);
}

TEST(ReferenceMergeStates, EqualsPairwiseMergesAndSkipsEmptyStates) {
  // [N = 2, S = 3, H = 1, D = 2]; row 1's middle state is empty.
  std::vector<float> v = {1, 2, 3, 4, 5, 6, -1, -2, NAN, NAN, 0.5f, 0.25f};
  std::vector<float> s = {0.1f, 0.7f, -0.3f, 1.2f, -INFINITY, 0.4f};
  std::vector<float> vo(4, NAN), so(2, NAN);
  ASSERT_TRUE(merge_states(f32_view(v, {2, 3, 1, 2}), f32_view(s, {2, 3, 1}),
                           f32_view(vo, {2, 1, 2}), f32_view(so, {2, 1}), reference_options())
                  .ok());
  for (int n = 0; n < 2; ++n) {
    double sum = 0, o0 = 0, o1 = 0;
    for (int k = 0; k < 3; ++k) {
      if (s[n * 3 + k] == -INFINITY) continue;
      const double w = std::exp(static_cast<double>(s[n * 3 + k]));
      sum += w;
      o0 += w * v[(n * 3 + k) * 2];
      o1 += w * v[(n * 3 + k) * 2 + 1];
    }
    EXPECT_NEAR(vo[n * 2], o0 / sum, 1e-6) << n;
    EXPECT_NEAR(vo[n * 2 + 1], o1 / sum, 1e-6) << n;
    EXPECT_NEAR(so[n], std::log(sum), 1e-6) << n;
  }
}

TEST(ReferenceMergeStates, EmptyLseOutputIsAllowed) {
  std::vector<float> v = {2, 4}, s = {0, 0}, vo(1, NAN);
  ASSERT_TRUE(merge_states(f32_view(v, {1, 2, 1, 1}), f32_view(s, {1, 2, 1}),
                           f32_view(vo, {1, 1, 1}), TensorView{}, reference_options())
                  .ok());
  EXPECT_EQ(vo[0], 3.0f);
}

// A paged cache of `pages` pages of `page_size` slots, H = 1, D = 2, in `dtype`, NaN-filled.
struct SmallCache {
  int page_size;
  std::vector<std::byte> k, v;
  std::vector<int32_t> indptr, indices, last_page_len;
  PagedKVCache cache;
  SmallCache(DType dtype, KVLayout layout, int pages, int ps, std::vector<int32_t> indptr_in,
             std::vector<int32_t> indices_in, std::vector<int32_t> last)
      : page_size(ps),
        indptr(std::move(indptr_in)),
        indices(std::move(indices_in)),
        last_page_len(std::move(last)) {
    k.assign(pages * ps * 2 * dtype_size(dtype), std::byte{0xff});
    v = k;
    const bool nhd = layout == KVLayout::kNHD;
    const int64_t shape[4] = {pages, nhd ? ps : 1, nhd ? 1 : ps, 2};
    cache.k_cache = TensorView::contiguous(k.data(), dtype, shape, 4);
    cache.v_cache = TensorView::contiguous(v.data(), dtype, shape, 4);
    auto iv = [](std::vector<int32_t>& x) {
      return TensorView::contiguous(x.data(), DType::kI32, {static_cast<int64_t>(x.size())});
    };
    cache.kv_indptr = iv(indptr);
    cache.kv_indices = iv(indices);
    cache.kv_last_page_len = iv(last_page_len);
    cache.layout = layout;
  }
};

TEST(ReferenceAppendPagedKvCache, QuantizesWithTheScaleAndSaturates) {
  // One request, pages {1, 0} of 2 slots; positions 0..2 land in page 1 slots 0, 1, page 0 slot 0.
  SmallCache c(DType::kE4M3, KVLayout::kHND, 2, 2, {0, 2}, {1, 0}, {1});
  c.cache.k_scale = 2.0f;
  c.cache.v_scale = 0.5f;
  std::vector<float> k = {3, -1000, 0.5f, 1, NAN, 2}, v = {1, 2, 3, 4, 5, 300};
  std::vector<int32_t> batch = {0, 0, 0}, pos = {0, 1, 2};
  ASSERT_TRUE(append_paged_kv_cache(f32_view(k, {3, 1, 2}), f32_view(v, {3, 1, 2}),
                                    TensorView::contiguous(batch.data(), DType::kI32, {3}),
                                    TensorView::contiguous(pos.data(), DType::kI32, {3}), c.cache,
                                    reference_options())
                  .ok());
  auto stored = [](const std::vector<std::byte>& buf, int page, int slot, int d) {
    return num::e4m3_to_f32(static_cast<uint8_t>(buf[(page * 2 + slot) * 2 + d]));
  };
  EXPECT_EQ(stored(c.k, 1, 0, 0), 1.5f);     // 3 / 2
  EXPECT_EQ(stored(c.k, 1, 0, 1), -448.0f);  // -500 saturates
  EXPECT_EQ(stored(c.k, 1, 1, 0), 0.25f);
  EXPECT_TRUE(std::isnan(stored(c.k, 0, 0, 0)));
  EXPECT_EQ(stored(c.k, 0, 0, 1), 1.0f);
  EXPECT_EQ(stored(c.v, 1, 0, 0), 2.0f);          // 1 / 0.5
  EXPECT_EQ(stored(c.v, 0, 0, 1), 448.0f);        // 600 saturates
  EXPECT_TRUE(std::isnan(stored(c.k, 0, 1, 0)));  // slot 1 of page 0 untouched
}

// per_token_head (DESIGN.md §2): each (token, head) row gets scale = amax|x| / 448 (e4m3), stored
// at its slot of the [P, page_size, H] scale cache, and the row is stored divided by it; a row of
// zeros gets scale 1. Then attending reads real = stored * scale back.
TEST(ReferenceAppendPagedKvCache, PerTokenHeadStoresTheRowScale) {
  SmallCache c(DType::kE4M3, KVLayout::kHND, 2, 2, {0, 2}, {1, 0}, {1});
  std::vector<float> k_scales(2 * 2, -1.0f), v_scales(2 * 2, -1.0f);
  c.cache.scale_granularity = KVScaleGranularity::kPerTokenHead;
  c.cache.k_scale_cache = f32_view(k_scales, {2, 2, 1});
  c.cache.v_scale_cache = f32_view(v_scales, {2, 2, 1});
  // Token 0: k amax 896 -> scale 2; token 1: zeros -> scale 1. v amax 3.5 -> 3.5 / 448.
  std::vector<float> k = {896, -224, 0, 0}, v = {3.5f, 1.75f, 0, 0};
  std::vector<int32_t> batch = {0, 0}, pos = {0, 1};
  ASSERT_TRUE(append_paged_kv_cache(f32_view(k, {2, 1, 2}), f32_view(v, {2, 1, 2}),
                                    TensorView::contiguous(batch.data(), DType::kI32, {2}),
                                    TensorView::contiguous(pos.data(), DType::kI32, {2}), c.cache,
                                    reference_options())
                  .ok());
  auto stored = [](const std::vector<std::byte>& buf, int page, int slot, int d) {
    return num::e4m3_to_f32(static_cast<uint8_t>(buf[(page * 2 + slot) * 2 + d]));
  };
  // Position 0 and 1 are page 1 slots 0 and 1.
  EXPECT_EQ(k_scales[1 * 2 + 0], 2.0f);
  EXPECT_EQ(stored(c.k, 1, 0, 0), 448.0f);
  EXPECT_EQ(stored(c.k, 1, 0, 1), -112.0f);
  EXPECT_EQ(k_scales[1 * 2 + 1], 1.0f);
  EXPECT_EQ(stored(c.k, 1, 1, 0), 0.0f);
  EXPECT_EQ(v_scales[1 * 2 + 0], static_cast<float>(3.5 / 448.0));
  EXPECT_NEAR(stored(c.v, 1, 0, 0) * v_scales[2], 3.5f, 3.5f / 16);  // e4m3: 3 mantissa bits
  EXPECT_EQ(stored(c.v, 1, 0, 0), 448.0f);
  EXPECT_EQ(k_scales[0], -1.0f);  // page 0 untouched
  // Validation: a per_head append is refused, a missing scale cache too.
  c.cache.scale_granularity = KVScaleGranularity::kPerHead;
  Status st = append_paged_kv_cache(f32_view(k, {2, 1, 2}), f32_view(v, {2, 1, 2}),
                                    TensorView::contiguous(batch.data(), DType::kI32, {2}),
                                    TensorView::contiguous(pos.data(), DType::kI32, {2}), c.cache,
                                    reference_options());
  EXPECT_EQ(st.code(), ErrorCode::kNotSupported) << st.to_string();
  c.cache.scale_granularity = KVScaleGranularity::kPerTokenHead;
  c.cache.v_scale_cache = TensorView{};
  st = append_paged_kv_cache(f32_view(k, {2, 1, 2}), f32_view(v, {2, 1, 2}),
                             TensorView::contiguous(batch.data(), DType::kI32, {2}),
                             TensorView::contiguous(pos.data(), DType::kI32, {2}), c.cache,
                             reference_options());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
}

TEST(ReferenceAppendPagedKvCache, RefusesAPositionPastTheRequestsPages) {
  SmallCache c(DType::kF32, KVLayout::kNHD, 2, 2, {0, 1}, {0}, {2});
  std::vector<float> k = {1, 2}, v = {3, 4};
  std::vector<int32_t> batch = {0}, pos = {2};
  Status st =
      ref::append_paged_kv_cache(f32_view(k, {1, 1, 2}), f32_view(v, {1, 1, 2}),
                                 TensorView::contiguous(batch.data(), DType::kI32, {1}),
                                 TensorView::contiguous(pos.data(), DType::kI32, {1}), c.cache);
  EXPECT_FALSE(st.ok());
}

// Appending every token of two requests into an empty paged cache and attending over it equals
// attending over the same K/V held contiguously.
TEST(ReferenceAppendPagedKvCache, AppendThenAttendEqualsContiguous) {
  Problem p;
  p.num_qo_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim_qk = p.head_dim_vo = 2;
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kF32;
  p.mask_mode = MaskMode::kCausal;
  const Batch batch(p, {2, 3}, {3, 5}, 21);
  const Result ragged = run_ragged(batch);

  // Pages of 2 slots: request 0 gets pages {3, 0}, request 1 gets {2, 4, 1}.
  SmallCache c(DType::kF32, KVLayout::kNHD, 5, 2, {0, 2, 5}, {3, 0, 2, 4, 1}, {1, 1});
  std::vector<std::byte> k, v;
  std::vector<int32_t> batch_indices, positions;
  for (int b = 0; b < 2; ++b) {
    k.insert(k.end(), batch.k[b].begin(), batch.k[b].end());
    v.insert(v.end(), batch.v[b].begin(), batch.v[b].end());
    for (int j = 0; j < batch.kv_lens[b]; ++j) {
      batch_indices.push_back(b);
      positions.push_back(j);
    }
  }
  ASSERT_TRUE(append_paged_kv_cache(TensorView::contiguous(k.data(), DType::kF32, {8, 1, 2}),
                                    TensorView::contiguous(v.data(), DType::kF32, {8, 1, 2}),
                                    TensorView::contiguous(batch_indices.data(), DType::kI32, {8}),
                                    TensorView::contiguous(positions.data(), DType::kI32, {8}),
                                    c.cache, reference_options())
                  .ok());
  Problem paged = p;
  paged.op = Op::kBatchPrefillPaged;
  paged.batch_size = 2;
  paged.page_size = 2;
  std::vector<std::byte> q;
  for (int b = 0; b < 2; ++b) q.insert(q.end(), batch.q[b].begin(), batch.q[b].end());
  std::vector<int32_t> qo_indptr = {0, 2, 5};
  std::vector<float> out(5 * 2 * 2, NAN), lse(5 * 2, NAN);
  AttentionArgs a;
  a.q = TensorView::contiguous(q.data(), DType::kF32, {5, 2, 2});
  a.qo_indptr = TensorView::contiguous(qo_indptr.data(), DType::kI32, {3});
  a.paged_k_cache = c.cache.k_cache;
  a.paged_v_cache = c.cache.v_cache;
  a.kv_indptr = c.cache.kv_indptr;
  a.kv_indices = c.cache.kv_indices;
  a.kv_last_page_len = c.cache.kv_last_page_len;
  a.out = f32_view(out, {5, 2, 2});
  a.lse = f32_view(lse, {5, 2});
  ASSERT_TRUE(run_reference(paged, a).ok());
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], ragged.out[i]) << i;
  for (std::size_t i = 0; i < lse.size(); ++i) EXPECT_EQ(lse[i], ragged.lse[i]) << i;
}

TEST(ReferenceApplyRope, RotatesPairsAtTheirPositionsInPlace) {
  // q [2 tokens, 1 head, D = 4], rotate halves; k left alone (k_out empty).
  std::vector<float> q = {1, 0, 0, 2, 1, 0, 0, 2}, k = {9, 9, 9, 9, 9, 9, 9, 9};
  std::vector<int32_t> pos = {0, 3};
  RopeParams rope;
  rope.rope_theta = 100.0f;
  TensorView qv = f32_view(q, {2, 1, 4});
  ASSERT_TRUE(apply_rope(qv, f32_view(k, {2, 1, 4}), qv, TensorView{},
                         TensorView::contiguous(pos.data(), DType::kI32, {2}), rope,
                         reference_options())
                  .ok());
  EXPECT_EQ(q[0], 1.0f);  // position 0: unchanged
  EXPECT_EQ(q[3], 2.0f);
  // Position 3: pair (x0, x2) at angle 3, pair (x1, x3) at angle 3 * 100^(-1/2) = 0.3.
  EXPECT_NEAR(q[4], std::cos(3.0), 1e-6);
  EXPECT_NEAR(q[6], std::sin(3.0), 1e-6);
  EXPECT_NEAR(q[5], -2 * std::sin(0.3), 1e-6);
  EXPECT_NEAR(q[7], 2 * std::cos(0.3), 1e-6);
  for (float x : k) EXPECT_EQ(x, 9.0f);
}

TEST(ReferenceApplyRope, InterleavedPairsNeighbours) {
  std::vector<float> k = {1, 0, 0, 1}, k_out(4, NAN);
  std::vector<int32_t> pos = {2};
  RopeParams rope;
  rope.interleave = true;
  rope.rope_scale = 4.0f;  // angles: pair 0: 2/4, pair 1: (2/4) * 1e4^(-1/2)
  ASSERT_TRUE(
      apply_rope(TensorView{}, f32_view(k, {1, 1, 4}), TensorView{}, f32_view(k_out, {1, 1, 4}),
                 TensorView::contiguous(pos.data(), DType::kI32, {1}), rope, reference_options())
          .ok());
  const double a0 = 0.5, a1 = 0.5 * 0.01;
  EXPECT_NEAR(k_out[0], std::cos(a0), 1e-6);
  EXPECT_NEAR(k_out[1], std::sin(a0), 1e-6);
  EXPECT_NEAR(k_out[2], -std::sin(a1), 1e-6);
  EXPECT_NEAR(k_out[3], std::cos(a1), 1e-6);
}

// apply_rope on q and k by their positions, then attention without RoPE, equals fused RoPE.
TEST(ReferenceApplyRope, ApplyThenAttendEqualsFusedRope) {
  Problem p;
  p.op = Op::kSinglePrefill;
  p.num_qo_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim_qk = 8;
  p.head_dim_vo = 4;
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kF32;
  p.mask_mode = MaskMode::kCausal;
  p.pos_encoding_mode = PosEncoding::kRopeLlama;
  p.rope_theta = 500.0f;
  p.rope_interleave = true;
  Batch batch(p, {3}, {6}, 31);
  const Result fused = run_single(batch, 0, false);

  RopeParams rope;
  rope.rope_theta = p.rope_theta;
  rope.interleave = true;
  std::vector<int32_t> q_pos = {3, 4, 5}, k_pos = {0, 1, 2, 3, 4, 5};
  TensorView q = TensorView::contiguous(batch.q[0].data(), DType::kF32, {3, 2, 8});
  TensorView k = TensorView::contiguous(batch.k[0].data(), DType::kF32, {6, 1, 8});
  ASSERT_TRUE(apply_rope(q, TensorView{}, q, TensorView{},
                         TensorView::contiguous(q_pos.data(), DType::kI32, {3}), rope,
                         reference_options())
                  .ok());
  ASSERT_TRUE(apply_rope(TensorView{}, k, TensorView{}, k,
                         TensorView::contiguous(k_pos.data(), DType::kI32, {6}), rope,
                         reference_options())
                  .ok());
  batch.p.pos_encoding_mode = PosEncoding::kNone;
  const Result unfused = run_single(batch, 0, false);
  // The rotated q and k were stored as f32 in between: agreement to f32 precision.
  for (std::size_t i = 0; i < fused.out.size(); ++i)
    EXPECT_NEAR(unfused.out[i], fused.out[i], 1e-5);
  for (std::size_t i = 0; i < fused.lse.size(); ++i)
    EXPECT_NEAR(unfused.lse[i], fused.lse[i], 1e-5);
}

TEST(ReferenceApplyRope, RotaryDimBelowHeadDimPassesTheRestThrough) {
  // D = 6, rotary_dim = 4 at position 3, theta 100: pair 0 at angle 3, pair 1 at 3 * 100^(-1/2).
  for (bool interleave : {false, true}) {
    SCOPED_TRACE(interleave ? "interleaved" : "halves");
    std::vector<float> q = {1, 0, 0, 2, 7, 8}, q_out(6, NAN);
    std::vector<int32_t> pos = {3};
    RopeParams rope;
    rope.rope_theta = 100.0f;
    rope.rotary_dim = 4;
    rope.interleave = interleave;
    ASSERT_TRUE(apply_rope(f32_view(q, {1, 1, 6}), TensorView{}, f32_view(q_out, {1, 1, 6}),
                           TensorView{}, TensorView::contiguous(pos.data(), DType::kI32, {1}), rope,
                           reference_options())
                    .ok());
    // Halves: pairs (x0, x2) = (1, 0) and (x1, x3) = (0, 2). Interleaved: (x0, x1) = (1, 0) and
    // (x2, x3) = (0, 2).
    const int a0 = 0, b0 = interleave ? 1 : 2, a1 = interleave ? 2 : 1, b1 = 3;
    EXPECT_NEAR(q_out[a0], std::cos(3.0), 1e-6);
    EXPECT_NEAR(q_out[b0], std::sin(3.0), 1e-6);
    EXPECT_NEAR(q_out[a1], -2 * std::sin(0.3), 1e-6);
    EXPECT_NEAR(q_out[b1], 2 * std::cos(0.3), 1e-6);
    EXPECT_EQ(q_out[4], 7.0f);
    EXPECT_EQ(q_out[5], 8.0f);
  }
}

TEST(ReferenceApplyRope, Llama31ScalesEachWavelengthRegime) {
  // D = 6, theta 1000: f = 1, 0.1, 0.01, wavelengths 6.3, 63, 628. old_context_len 100 with
  // factors 1 and 4 puts the cut-offs at 100 / 4 = 25 and 100 / 1 = 100: pair 0 keeps its
  // frequency, pair 2 is divided by rope_scale, pair 1 is blended; the position is not scaled.
  std::vector<float> k = {1, 1, 1, 0, 0, 0}, k_out(6, NAN);
  std::vector<int32_t> pos = {5};
  RopeParams rope;
  rope.rope_theta = 1000.0f;
  rope.rope_scale = 8.0f;
  rope.llama31 = Llama31Scaling{1.0f, 4.0f, 100.0f};
  ASSERT_TRUE(
      apply_rope(TensorView{}, f32_view(k, {1, 1, 6}), TensorView{}, f32_view(k_out, {1, 1, 6}),
                 TensorView::contiguous(pos.data(), DType::kI32, {1}), rope, reference_options())
          .ok());
  const double pi = 3.14159265358979323846;
  const double smooth = (100.0 / (2 * pi / 0.1) - 1.0) / (4.0 - 1.0);  // 0.197
  const double angle[3] = {5 * 1.0, 5 * ((1 - smooth) * 0.1 / 8 + smooth * 0.1), 5 * 0.01 / 8};
  for (int t = 0; t < 3; ++t) {
    EXPECT_NEAR(k_out[t], std::cos(angle[t]), 1e-6) << t;
    EXPECT_NEAR(k_out[t + 3], std::sin(angle[t]), 1e-6) << t;
  }
}

TEST(ReferenceApplyRope, CosSinCacheEqualsTheComputedRotation) {
  // A cache filled with the angles (p / scale) * theta^(-2t/R), R = 6 < D = 8, gives the
  // computed rotation; theta and scale are then ignored (set to other values for the cached run).
  const int64_t nnz = 3, heads = 2, dim = 8, rot = 6, max_pos = 10;
  std::vector<float> cache(max_pos * rot);
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t t = 0; t < rot / 2; ++t) {
      const double angle = (p / 2.0) * std::pow(500.0, -2.0 * t / rot);
      cache[p * rot + t] = static_cast<float>(std::cos(angle));
      cache[p * rot + rot / 2 + t] = static_cast<float>(std::sin(angle));
    }
  }
  std::vector<int32_t> pos = {9, 0, 4};
  for (bool interleave : {false, true}) {
    SCOPED_TRACE(interleave ? "interleaved" : "halves");
    std::vector<float> q(nnz * heads * dim);
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(1.7 * i + 0.3);
    std::vector<float> computed(q.size(), NAN), cached(q.size(), NAN);
    RopeParams rope;
    rope.rope_theta = 500.0f;
    rope.rope_scale = 2.0f;
    rope.rotary_dim = rot;
    rope.interleave = interleave;
    const TensorView pv = TensorView::contiguous(pos.data(), DType::kI32, {nnz});
    ASSERT_TRUE(apply_rope(f32_view(q, {nnz, heads, dim}), TensorView{},
                           f32_view(computed, {nnz, heads, dim}), TensorView{}, pv, rope,
                           reference_options())
                    .ok());
    RopeParams by_cache;
    by_cache.rope_theta = 3.0f;
    by_cache.interleave = interleave;
    by_cache.cos_sin_cache = f32_view(cache, {max_pos, rot});
    ASSERT_TRUE(apply_rope(f32_view(q, {nnz, heads, dim}), TensorView{},
                           f32_view(cached, {nnz, heads, dim}), TensorView{}, pv, by_cache,
                           reference_options())
                    .ok());
    for (std::size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(cached[i], computed[i], 1e-6) << i;
    EXPECT_NE(computed, q);
  }
}

}  // namespace
}  // namespace kvattn::reftest
