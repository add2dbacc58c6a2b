// The cpu backend's aux ops against the reference's. They use the reference's arithmetic (fp64,
// rounded once), so the results must agree bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvattn/attention.h"
#include "testing/case_builder.h"

namespace kvattn {
namespace {

OpOptions on(const char* backend) {
  OpOptions o;
  o.backend = backend;
  return o;
}

std::vector<std::byte> random_tensor(int64_t n, DType dtype, std::mt19937& rng, float range) {
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> values(n);
  for (float& x : values) x = dist(rng);
  std::vector<std::byte> out(n * dtype_size(dtype));
  testing::from_f32(values.data(), n, dtype, out.data());
  return out;
}

TEST(CpuMergeState, MatchesTheReferenceBitForBit) {
  std::mt19937 rng(3);
  const int64_t n = 37, h = 3, d = 40;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto va = random_tensor(n * h * d, dtype, rng, 2), vb = random_tensor(n * h * d, dtype, rng, 2);
    std::vector<float> sa(n * h), sb(n * h);
    std::uniform_real_distribution<float> lse(-5, 5);
    for (int64_t i = 0; i < n * h; ++i) {
      sa[i] = i % 7 == 0 ? -INFINITY : lse(rng);
      sb[i] = i % 5 == 0 ? -INFINITY : lse(rng);
    }
    std::vector<std::byte> out_cpu(va.size()), out_ref(va.size());
    std::vector<float> s_cpu(n * h), s_ref(n * h);
    auto view = [&](void* p) { return TensorView::contiguous(p, dtype, {n, h, d}); };
    auto sview = [&](float* p) { return TensorView::contiguous(p, DType::kF32, {n, h}); };
    ASSERT_TRUE(merge_state(view(va.data()), sview(sa.data()), view(vb.data()), sview(sb.data()),
                            view(out_cpu.data()), sview(s_cpu.data()), on("cpu"))
                    .ok());
    ASSERT_TRUE(merge_state(view(va.data()), sview(sa.data()), view(vb.data()), sview(sb.data()),
                            view(out_ref.data()), sview(s_ref.data()), on("reference"))
                    .ok());
    EXPECT_EQ(out_cpu, out_ref) << dtype_name(dtype);
    EXPECT_EQ(0, std::memcmp(s_cpu.data(), s_ref.data(), s_cpu.size() * 4));
  }
}

TEST(CpuMergeStates, MatchesTheReferenceBitForBit) {
  std::mt19937 rng(4);
  const int64_t n = 19, states = 5, h = 2, d = 24;
  auto v = random_tensor(n * states * h * d, DType::kF32, rng, 3);
  std::vector<float> s(n * states * h);
  std::uniform_real_distribution<float> lse(-8, 8);
  for (size_t i = 0; i < s.size(); ++i) s[i] = i % 3 == 0 ? -INFINITY : lse(rng);
  for (int64_t i = 0; i < states * h; ++i) s[i] = -INFINITY;  // row 0 sees nothing
  std::vector<float> out_cpu(n * h * d), out_ref(n * h * d), s_cpu(n * h), s_ref(n * h);
  const TensorView vv = TensorView::contiguous(v.data(), DType::kF32, {n, states, h, d});
  const TensorView sv = TensorView::contiguous(s.data(), DType::kF32, {n, states, h});
  auto o = [&](float* p) { return TensorView::contiguous(p, DType::kF32, {n, h, d}); };
  auto l = [&](float* p) { return TensorView::contiguous(p, DType::kF32, {n, h}); };
  ASSERT_TRUE(merge_states(vv, sv, o(out_cpu.data()), l(s_cpu.data()), on("cpu")).ok());
  ASSERT_TRUE(merge_states(vv, sv, o(out_ref.data()), l(s_ref.data()), on("reference")).ok());
  EXPECT_EQ(0, std::memcmp(out_cpu.data(), out_ref.data(), out_cpu.size() * 4));
  EXPECT_EQ(0, std::memcmp(s_cpu.data(), s_ref.data(), s_cpu.size() * 4));
  EXPECT_EQ(out_cpu[0], 0.0f);
  EXPECT_EQ(s_cpu[0], -INFINITY);
}

TEST(CpuAppendPagedKvCache, QuantizesAndSaturatesLikeTheReference) {
  std::mt19937 rng(5);
  const int64_t heads = 2, dim = 24, page_size = 5, num_pages = 7;
  for (DType cache_type : {DType::kE4M3, DType::kE5M2, DType::kBF16, DType::kF16}) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (bool per_token : {false, true}) {
        if (per_token && !is_fp8(cache_type)) continue;
        std::vector<int32_t> indptr = {0, 3, 7}, indices = {6, 0, 2, 1, 5, 3, 4}, last = {2, 5};
        const int64_t nnz = 9;
        std::vector<int32_t> batch(nnz), pos(nnz);
        for (int64_t i = 0; i < nnz; ++i) {
          batch[i] = static_cast<int32_t>(i % 2);
          pos[i] = static_cast<int32_t>(i % 2 == 0 ? i : 10 + i);
        }
        // Values up to 1000 with scale 0.5: past e4m3's 448 after dividing, so they saturate.
        auto k = random_tensor(nnz * heads * dim, DType::kF32, rng, 1000);
        auto v = random_tensor(nnz * heads * dim, DType::kF32, rng, 3);
        const int64_t cache_elems = num_pages * page_size * heads * dim;
        std::vector<std::byte> caches[2][2];  // [cpu/ref][k/v]
        for (auto& c : caches) {
          for (auto& t : c) t.assign(cache_elems * dtype_size(cache_type), std::byte{0});
        }
        std::vector<float> scales[2][2];  // per_token_head: [cpu/ref][k/v] [P, page_size, H]
        for (auto& c : scales) {
          for (auto& t : c) t.assign(num_pages * page_size * heads, 0.0f);
        }
        for (int which = 0; which < 2; ++which) {
          PagedKVCache cache;
          auto shape = [&](void* p) {
            return layout == KVLayout::kNHD
                       ? TensorView::contiguous(p, cache_type, {num_pages, page_size, heads, dim})
                       : TensorView::contiguous(p, cache_type, {num_pages, heads, page_size, dim});
          };
          cache.k_cache = shape(caches[which][0].data());
          cache.v_cache = shape(caches[which][1].data());
          cache.kv_indptr = TensorView::contiguous(indptr.data(), DType::kI32, {3});
          cache.kv_indices = TensorView::contiguous(indices.data(), DType::kI32, {7});
          cache.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {2});
          cache.layout = layout;
          if (per_token) {
            cache.scale_granularity = KVScaleGranularity::kPerTokenHead;
            cache.k_scale_cache = TensorView::contiguous(scales[which][0].data(), DType::kF32,
                                                         {num_pages, page_size, heads});
            cache.v_scale_cache = TensorView::contiguous(scales[which][1].data(), DType::kF32,
                                                         {num_pages, page_size, heads});
          } else {
            cache.k_scale = 0.5f;
            cache.v_scale = 0.25f;
          }
          const Status s = append_paged_kv_cache(
              TensorView::contiguous(k.data(), DType::kF32, {nnz, heads, dim}),
              TensorView::contiguous(v.data(), DType::kF32, {nnz, heads, dim}),
              TensorView::contiguous(batch.data(), DType::kI32, {nnz}),
              TensorView::contiguous(pos.data(), DType::kI32, {nnz}), cache,
              on(which == 0 ? "cpu" : "reference"));
          ASSERT_TRUE(s.ok()) << s.to_string();
        }
        EXPECT_EQ(caches[0][0], caches[1][0]) << dtype_name(cache_type);
        EXPECT_EQ(caches[0][1], caches[1][1]) << dtype_name(cache_type);
        EXPECT_EQ(scales[0][0], scales[1][0]) << dtype_name(cache_type);
        EXPECT_EQ(scales[0][1], scales[1][1]) << dtype_name(cache_type);
        if (per_token) {
          int written = 0;
          for (float s : scales[0][0]) written += s > 0.0f;
          EXPECT_EQ(written, nnz * heads) << "one scale per appended (token, head)";
          continue;
        }
        if (cache_type == DType::kE4M3) {
          bool saturated = false;
          for (std::byte b : caches[0][0]) saturated |= (static_cast<uint8_t>(b) & 0x7F) == 0x7E;
          EXPECT_TRUE(saturated)
              << "no code at the e4m3 maximum: the test lost its saturation case";
        }
      }
    }
  }
}

TEST(CpuApplyRope, MatchesTheReferenceInPlaceAndInterleaved) {
  std::mt19937 rng(6);
  const int64_t nnz = 13, hq = 4, hk = 2, dim = 64;
  for (bool interleave : {false, true}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      auto q = random_tensor(nnz * hq * dim, dtype, rng, 2);
      auto k = random_tensor(nnz * hk * dim, dtype, rng, 2);
      std::vector<int32_t> pos(nnz);
      for (int64_t i = 0; i < nnz; ++i) pos[i] = static_cast<int32_t>(i * 997 % 5000);
      RopeParams rope;
      rope.interleave = interleave;
      rope.rope_scale = 2.0f;
      auto q_cpu = q, k_cpu = k;
      std::vector<std::byte> q_ref(q.size()), k_ref(k.size());
      const TensorView pv = TensorView::contiguous(pos.data(), DType::kI32, {nnz});
      auto qv = [&](void* p) { return TensorView::contiguous(p, dtype, {nnz, hq, dim}); };
      auto kv = [&](void* p) { return TensorView::contiguous(p, dtype, {nnz, hk, dim}); };
      ASSERT_TRUE(apply_rope(qv(q_cpu.data()), kv(k_cpu.data()), qv(q_cpu.data()), kv(k_cpu.data()),
                             pv, rope, on("cpu"))
                      .ok());
      ASSERT_TRUE(apply_rope(qv(q.data()), kv(k.data()), qv(q_ref.data()), kv(k_ref.data()), pv,
                             rope, on("reference"))
                      .ok());
      EXPECT_EQ(q_cpu, q_ref);
      EXPECT_EQ(k_cpu, k_ref);
      EXPECT_NE(q_cpu, q);
    }
  }
}

// rotary_dim < D, Llama 3.1 scaling and a cos/sin cache: cpu in place equals reference out of
// place and the other way round, which also checks that out of place copies dims [R, D).
TEST(CpuApplyRope, MatchesTheReferenceWithRotaryDimLlama31AndCache) {
  std::mt19937 rng(7);
  const int64_t nnz = 11, hq = 3, hk = 1, dim = 64, max_pos = 6000;
  std::vector<float> cache(max_pos * 48);
  std::uniform_real_distribution<float> unit(-1, 1);
  for (float& x : cache) x = unit(rng);
  for (int variant = 0; variant < 3; ++variant) {
    for (bool interleave : {false, true}) {
      for (bool cpu_in_place : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "variant " << variant << " interleave " << interleave
                                          << " cpu_in_place " << cpu_in_place);
        const DType dtype = DType::kBF16;
        auto q = random_tensor(nnz * hq * dim, dtype, rng, 2);
        auto k = random_tensor(nnz * hk * dim, dtype, rng, 2);
        std::vector<int32_t> pos(nnz);
        for (int64_t i = 0; i < nnz; ++i) pos[i] = static_cast<int32_t>(i * 997 % max_pos);
        RopeParams rope;
        rope.interleave = interleave;
        rope.rope_scale = 8.0f;
        if (variant == 0) rope.rotary_dim = 40;
        if (variant == 1) rope.llama31 = Llama31Scaling{};
        if (variant == 2) {
          rope.cos_sin_cache = TensorView::contiguous(cache.data(), DType::kF32, {max_pos, 48});
        }
        const TensorView pv = TensorView::contiguous(pos.data(), DType::kI32, {nnz});
        auto qv = [&](void* p) { return TensorView::contiguous(p, dtype, {nnz, hq, dim}); };
        auto kv = [&](void* p) { return TensorView::contiguous(p, dtype, {nnz, hk, dim}); };
        auto run = [&](const char* backend, bool in_place, std::vector<std::byte>& q_res,
                       std::vector<std::byte>& k_res) {
          q_res.assign(q.size(), std::byte{0});
          k_res.assign(k.size(), std::byte{0});
          std::vector<std::byte> q_in = q, k_in = k;
          if (in_place) {
            q_res = q;
            k_res = k;
          }
          void* qi = in_place ? q_res.data() : q_in.data();
          void* ki = in_place ? k_res.data() : k_in.data();
          ASSERT_TRUE(
              apply_rope(qv(qi), kv(ki), qv(q_res.data()), kv(k_res.data()), pv, rope, on(backend))
                  .ok());
        };
        std::vector<std::byte> q_cpu, k_cpu, q_ref, k_ref;
        run("cpu", cpu_in_place, q_cpu, k_cpu);
        run("reference", !cpu_in_place, q_ref, k_ref);
        EXPECT_EQ(q_cpu, q_ref);
        EXPECT_EQ(k_cpu, k_ref);
        EXPECT_NE(q_cpu, q);
        if (variant == 0 && !interleave) {
          // The last element of each head is past rotary_dim: unchanged.
          const std::size_t es = dtype_size(dtype);
          for (int64_t r = 0; r < nnz * hq; ++r) {
            const std::size_t off = ((r + 1) * dim - 1) * es;
            EXPECT_EQ(std::memcmp(q_cpu.data() + off, q.data() + off, es), 0) << r;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvattn
