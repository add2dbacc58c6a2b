// The cpu backend's aux ops against the reference's. They use the reference's arithmetic (fp64,
// rounded once), so the results must agree bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/mla.h"
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

// FlashInfer's padding convention (DESIGN.md §2 "Appending"): a row whose batch index is -1 writes
// nothing anywhere. Caches and scale caches start as a canary pattern; after an append where
// every other row is padded (with garbage positions), the bytes must equal the canary everywhere
// except the real rows' slots, and those must hold exactly what an append of the real rows
// alone writes (the real rows alone also checked against an independent conversion for bf16).
TEST(AppendPaddedRows, WriteNothingAndRealRowsLandExactly) {
  std::mt19937 rng(11);
  const int64_t heads = 2, dim = 16, page_size = 4, num_pages = 6;
  std::vector<int32_t> indptr = {0, 2, 5}, indices = {4, 1, 0, 5, 2}, last = {3, 2};
  // Request 0 holds 7 tokens, request 1 holds 10 (pages 0, 5, 2; slot 0..1 of page 2).
  std::vector<int32_t> real_b = {0, 1, 1, 0, 1}, real_p = {6, 9, 0, 3, 4};
  const int64_t nnz_real = 5, nnz = 12;
  std::vector<int32_t> batch(nnz, kPaddedAppendRow), pos(nnz);
  std::vector<int64_t> real_row(nnz_real);
  for (int64_t i = 0, r = 0; i < nnz; ++i) {
    pos[i] = static_cast<int32_t>(-7 + 1000 * i);  // garbage positions on padded rows
    if (i % 2 == 1 && r < nnz_real) {
      batch[i] = real_b[r];
      pos[i] = real_p[r];
      real_row[r++] = i;
    }
  }
  // Rows past the last real one stay padded (as get_batch_indices_positions pads the tail).
  auto k = random_tensor(nnz * heads * dim, DType::kF32, rng, 3);
  auto v = random_tensor(nnz * heads * dim, DType::kF32, rng, 3);
  std::vector<std::byte> k_real(nnz_real * heads * dim * 4), v_real(k_real.size());
  for (int64_t r = 0; r < nnz_real; ++r) {
    const size_t row = heads * dim * 4;
    std::memcpy(k_real.data() + r * row, k.data() + real_row[r] * row, row);
    std::memcpy(v_real.data() + r * row, v.data() + real_row[r] * row, row);
  }
  const int64_t cache_elems = num_pages * page_size * heads * dim;
  const std::byte canary{0xA5};
  const float canary_scale = -3.25f;
  for (const char* backend : {"cpu", "reference"}) {
    for (DType cache_type : {DType::kBF16, DType::kE4M3, DType::kF32}) {
      for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
        for (bool per_token : {false, true}) {
          if (per_token && !is_fp8(cache_type)) continue;
          SCOPED_TRACE(std::string(backend) + " " + std::string(dtype_name(cache_type)) +
                       (layout == KVLayout::kNHD ? " NHD" : " HND") +
                       (per_token ? " per_token_head" : ""));
          // [padded run / real rows only][k / v]
          std::vector<std::byte> caches[2][2];
          std::vector<float> scales[2][2];
          for (int run = 0; run < 2; ++run) {
            for (int kv = 0; kv < 2; ++kv) {
              caches[run][kv].assign(cache_elems * dtype_size(cache_type), canary);
              scales[run][kv].assign(num_pages * page_size * heads, canary_scale);
            }
            PagedKVCache cache;
            auto shape = [&](void* p) {
              return layout == KVLayout::kNHD
                         ? TensorView::contiguous(p, cache_type, {num_pages, page_size, heads, dim})
                         : TensorView::contiguous(p, cache_type, {num_pages, heads, page_size, dim});
            };
            cache.k_cache = shape(caches[run][0].data());
            cache.v_cache = shape(caches[run][1].data());
            cache.kv_indptr = TensorView::contiguous(indptr.data(), DType::kI32, {3});
            cache.kv_indices = TensorView::contiguous(indices.data(), DType::kI32, {5});
            cache.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {2});
            cache.layout = layout;
            if (per_token) {
              cache.scale_granularity = KVScaleGranularity::kPerTokenHead;
              cache.k_scale_cache = TensorView::contiguous(scales[run][0].data(), DType::kF32,
                                                           {num_pages, page_size, heads});
              cache.v_scale_cache = TensorView::contiguous(scales[run][1].data(), DType::kF32,
                                                           {num_pages, page_size, heads});
            }
            const int64_t n = run == 0 ? nnz : nnz_real;
            const Status s = append_paged_kv_cache(
                TensorView::contiguous(run == 0 ? k.data() : k_real.data(), DType::kF32,
                                       {n, heads, dim}),
                TensorView::contiguous(run == 0 ? v.data() : v_real.data(), DType::kF32,
                                       {n, heads, dim}),
                TensorView::contiguous(run == 0 ? batch.data() : real_b.data(),
                                       DType::kI32, {n}),
                TensorView::contiguous(run == 0 ? pos.data() : real_p.data(),
                                       DType::kI32, {n}),
                cache, on(backend));
            ASSERT_TRUE(s.ok()) << s.to_string();
          }
          for (int kv = 0; kv < 2; ++kv) {
            EXPECT_EQ(caches[0][kv], caches[1][kv]) << "padded rows changed the cache";
            EXPECT_EQ(scales[0][kv], scales[1][kv]) << "padded rows changed the scale cache";
          }
          // Which element slots the real rows own; everything else must still be the canary.
          std::vector<bool> owned(cache_elems, false);
          std::vector<bool> owned_scale(num_pages * page_size * heads, false);
          for (int64_t r = 0; r < nnz_real; ++r) {
            const int64_t page = indices[indptr[real_b[r]] + real_p[r] / page_size];
            const int64_t slot = real_p[r] % page_size;
            for (int64_t h = 0; h < heads; ++h) {
              owned_scale[(page * page_size + slot) * heads + h] = true;
              for (int64_t d = 0; d < dim; ++d) {
                const int64_t e = layout == KVLayout::kNHD
                                      ? ((page * page_size + slot) * heads + h) * dim + d
                                      : ((page * heads + h) * page_size + slot) * dim + d;
                owned[e] = true;
              }
            }
          }
          const size_t es = dtype_size(cache_type);
          int64_t untouched = 0;
          for (int kv = 0; kv < 2; ++kv) {
            for (int64_t e = 0; e < cache_elems; ++e) {
              if (owned[e]) continue;
              for (size_t b = 0; b < es; ++b) {
                ASSERT_EQ(caches[0][kv][e * es + b], canary) << "element " << e << " written";
              }
              ++untouched;
            }
            for (size_t e = 0; e < owned_scale.size(); ++e) {
              if (!owned_scale[e]) {
                ASSERT_EQ(scales[0][kv][e], canary_scale) << "scale " << e << " written";
              } else if (per_token) {
                EXPECT_GT(scales[0][kv][e], 0.0f) << "real row's scale not written";
              }
            }
          }
          EXPECT_EQ(untouched, 2 * (cache_elems - nnz_real * heads * dim));
          if (cache_type == DType::kBF16 || cache_type == DType::kF32) {
            // Real rows land exactly: the cache element is the converted source value.
            for (int64_t r = 0; r < nnz_real; ++r) {
              const int64_t page = indices[indptr[real_b[r]] + real_p[r] / page_size];
              const int64_t slot = real_p[r] % page_size;
              for (int64_t h = 0; h < heads; ++h) {
                const int64_t src = (real_row[r] * heads + h) * dim;
                std::vector<std::byte> expect(dim * es);
                testing::from_f32(reinterpret_cast<const float*>(k.data()) + src, dim, cache_type,
                                  expect.data());
                const int64_t e = layout == KVLayout::kNHD
                                      ? ((page * page_size + slot) * heads + h) * dim
                                      : ((page * heads + h) * page_size + slot) * dim;
                EXPECT_EQ(0, std::memcmp(expect.data(), caches[0][0].data() + e * es, dim * es))
                    << "row " << r << " head " << h;
              }
            }
          }
        }
      }
    }
  }
}

TEST(AppendPaddedRows, MlaAppendSkipsPaddedRows) {
  std::mt19937 rng(12);
  const int64_t d_ckv = 32, d_kpe = 8, page_size = 3, num_pages = 4;
  const std::vector<int32_t> indptr = {0, 1, 3}, indices = {2, 0, 3}, last = {2, 3};
  std::vector<int32_t> batch = {-1, 1, -1, 0, 1, -1}, pos = {99, 5, -4, 1, 0, 0};
  const int64_t nnz = 6;
  auto ckv = random_tensor(nnz * d_ckv, DType::kF32, rng, 2);
  auto kpe = random_tensor(nnz * d_kpe, DType::kF32, rng, 2);
  for (const char* backend : {"cpu", "reference"}) {
    SCOPED_TRACE(backend);
    std::vector<std::byte> c(num_pages * page_size * d_ckv * 2, std::byte{0x5A});
    std::vector<std::byte> p(num_pages * page_size * d_kpe * 2, std::byte{0x5A});
    const std::vector<std::byte> c0 = c, p0 = p;
    PagedMLACache cache;
    cache.ckv_cache = TensorView::contiguous(c.data(), DType::kBF16, {num_pages, page_size, d_ckv});
    cache.kpe_cache = TensorView::contiguous(p.data(), DType::kBF16, {num_pages, page_size, d_kpe});
    cache.kv_indptr = TensorView::contiguous(const_cast<int32_t*>(indptr.data()), DType::kI32, {3});
    cache.kv_indices = TensorView::contiguous(const_cast<int32_t*>(indices.data()), DType::kI32, {3});
    cache.kv_last_page_len =
        TensorView::contiguous(const_cast<int32_t*>(last.data()), DType::kI32, {2});
    const Status s = append_paged_mla_kv_cache(
        TensorView::contiguous(ckv.data(), DType::kF32, {nnz, d_ckv}),
        TensorView::contiguous(kpe.data(), DType::kF32, {nnz, d_kpe}),
        TensorView::contiguous(batch.data(), DType::kI32, {nnz}),
        TensorView::contiguous(pos.data(), DType::kI32, {nnz}), cache, on(backend));
    ASSERT_TRUE(s.ok()) << s.to_string();
    // Real rows: (row 1: b1 pos5 -> page 3 slot 2), (row 3: b0 pos1 -> page 2 slot 1),
    // (row 4: b1 pos0 -> page 0 slot 0). Everything else keeps the canary.
    const int64_t real[3][3] = {{1, 3, 2}, {3, 2, 1}, {4, 0, 0}};
    std::vector<bool> owned(num_pages * page_size, false);
    for (const auto& r : real) {
      owned[r[1] * page_size + r[2]] = true;
      std::vector<std::byte> expect(d_ckv * 2);
      testing::from_f32(reinterpret_cast<const float*>(ckv.data()) + r[0] * d_ckv, d_ckv,
                        DType::kBF16, expect.data());
      EXPECT_EQ(0, std::memcmp(expect.data(), c.data() + (r[1] * page_size + r[2]) * d_ckv * 2,
                               d_ckv * 2));
    }
    for (int64_t t = 0; t < num_pages * page_size; ++t) {
      if (owned[t]) continue;
      EXPECT_EQ(0, std::memcmp(c.data() + t * d_ckv * 2, c0.data() + t * d_ckv * 2, d_ckv * 2))
          << "ckv slot " << t;
      EXPECT_EQ(0, std::memcmp(p.data() + t * d_kpe * 2, p0.data() + t * d_kpe * 2, d_kpe * 2))
          << "kpe slot " << t;
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
