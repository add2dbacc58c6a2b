// MLA (batch_mla_paged, append_paged_mla_kv_cache): a hand-computed case on reference and cpu;
// the cpu kernels against the reference over heads 16/64/128, page sizes 1/16/64, lengths around
// the tile, causal prefill, FP8 caches, empty requests, forced split-KV, at every ISA level;
// the append quantizing to FP8 with the cache's scale.
#include "cpu/mla/mla.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "cpu_test_util.h"
#include "kvattn/mla.h"

namespace kvattn::cputest {
namespace {

using testing::CaseSpec;

constexpr int kTile = cpu::kMlaTileKeys;
constexpr float kSmScale = 0.0721687836f;  // 1/sqrt(192)

// Runs `body` with each MLA kernel of the table this machine runs named (a problem a kernel
// does not compute takes the default choice): the AMX tile kernel where the CPU and OS allow it,
// the AVX512_BF16 one, the portable one.
template <class Body>
void for_each_tile_kernel(Body body) {
  for (const cpu::CpuKernel* k : runnable_kernels(cpu::KernelOp::kMla)) {
    SCOPED_TRACE(std::string(k->name));
    KernelOverride named(k->name);
    body();
  }
}

CaseSpec mla_spec(int heads, int page_size, std::vector<int64_t> qo, std::vector<int64_t> kv,
                  DType kv_dtype = DType::kBF16, bool causal = false) {
  CaseSpec spec;
  spec.problem = make_mla_problem(static_cast<int>(kv.size()), heads, page_size, kSmScale);
  Problem& p = spec.problem;
  p.kv_dtype = kv_dtype;
  p.mask_mode = causal ? MaskMode::kCausal : MaskMode::kNone;
  spec.return_lse = true;
  if (is_fp8(kv_dtype)) spec.scalars.k_scale = 0.375f;
  spec.qo_lens = std::move(qo);
  spec.kv_lens = std::move(kv);
  return spec;
}

// Two keys; head h's q_nope is a·e_0 and its q_pe c·e_0; key 0 has ckv e_0 (kpe 0), key 1 has
// ckv 2·e_1 and kpe e_0. So s_0 = a·sm, s_1 = c·sm, o = p_0·e_0 + p_1·2·e_1 with p the softmax of
// (s_0, s_1), lse = log(e^s_0 + e^s_1). Exact in bf16; every head differs through a = h / 4.
TEST(CpuMla, HandComputedOnEveryBackend) {
  constexpr int kHeads = 16, kCkv = 512, kKpe = 64;
  const float sm = 0.5f, c = 1.0f;
  std::vector<uint16_t> q_nope(kHeads * kCkv, 0), q_pe(kHeads * kKpe, 0);
  for (int h = 0; h < kHeads; ++h) {
    q_nope[h * kCkv] = num::f32_to_bf16(h / 4.0f);
    q_pe[h * kKpe] = num::f32_to_bf16(c);
  }
  std::vector<uint16_t> ckv(2 * kCkv, 0), kpe(2 * kKpe, 0);
  ckv[0] = num::f32_to_bf16(1.0f);
  ckv[kCkv + 1] = num::f32_to_bf16(2.0f);
  kpe[kKpe] = num::f32_to_bf16(1.0f);
  std::vector<int32_t> qo_indptr = {0, 1}, kv_indptr = {0, 1}, kv_indices = {0}, last = {2};
  for (const char* backend : {"reference", "cpu"}) {
    std::vector<float> out(kHeads * kCkv, NAN), lse(kHeads, NAN);
    Problem p = make_mla_problem(1, kHeads, /*page_size=*/2, sm);
    p.o_dtype = DType::kF32;
    AttentionArgs a;
    a.q_nope = TensorView::contiguous(q_nope.data(), DType::kBF16, {1, kHeads, kCkv});
    a.q_pe = TensorView::contiguous(q_pe.data(), DType::kBF16, {1, kHeads, kKpe});
    a.ckv_cache = TensorView::contiguous(ckv.data(), DType::kBF16, {1, 2, kCkv});
    a.kpe_cache = TensorView::contiguous(kpe.data(), DType::kBF16, {1, 2, kKpe});
    a.qo_indptr = TensorView::contiguous(qo_indptr.data(), DType::kI32, {2});
    a.kv_indptr = TensorView::contiguous(kv_indptr.data(), DType::kI32, {2});
    a.kv_indices = TensorView::contiguous(kv_indices.data(), DType::kI32, {1});
    a.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {1});
    a.out = TensorView::contiguous(out.data(), DType::kF32, {1, kHeads, kCkv});
    a.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, kHeads});
    PlanOptions options;
    options.backend = backend;
    ASSERT_TRUE(run(p, a, options).ok()) << backend;
    for (int h = 0; h < kHeads; ++h) {
      const double s0 = h / 4.0 * sm, s1 = c * sm;
      const double p0 = 1.0 / (1.0 + std::exp(s1 - s0)), p1 = 1.0 - p0;
      // f32 accumulation and bf16 probabilities on cpu: a few bf16 ulps of 1.
      const double tol = std::string(backend) == "cpu" ? 8e-3 : 1e-6;
      EXPECT_NEAR(out[h * kCkv + 0], p0, tol) << backend << " head " << h;
      EXPECT_NEAR(out[h * kCkv + 1], 2 * p1, 2 * tol) << backend << " head " << h;
      EXPECT_EQ(out[h * kCkv + 2], 0.0f) << backend << " head " << h;
      EXPECT_NEAR(lse[h], std::log(std::exp(s0) + std::exp(s1)), 1e-5) << backend << " head " << h;
    }
  }
}

// Heads x page sizes x lengths below, at and above the tile, decode.
TEST(CpuMla, DecodeMatchesReference) {
  for_each_tile_kernel([&] {
    for (CpuIsa isa : isa_levels()) {
      for (int heads : {16, 64, 128}) {
        for (int page_size : {1, 16, 64}) {
          std::vector<int64_t> kv = {1, kTile - 1, kTile, kTile + 1, 3 * kTile + 5};
          if (heads == 128) kv = {kTile + 1, 2 * kTile};
          std::vector<int64_t> qo(kv.size(), 1);
          expect_matches_reference(mla_spec(heads, page_size, qo, kv), isa);
        }
      }
    }
  });
}

// Causal prefill (qo_len > 1), including more queries than keys (rows that see nothing: o = 0,
// lse = -inf) and an empty request of each kind.
TEST(CpuMla, CausalPrefillAndEmptyRequests) {
  for_each_tile_kernel([&] {
    for (CpuIsa isa : isa_levels()) {
      for (int heads : {16, 32, 48, 64}) {
        expect_matches_reference(mla_spec(heads, 16, {5, 0, 3, 9, 2},
                                          {3, 7, 0, kTile + 4, 2 * kTile}, DType::kBF16, true),
                                 isa);
        expect_matches_reference(mla_spec(heads, 1, {4, 2}, {70, 33}, DType::kBF16, false), isa);
      }
    }
  });
}

TEST(CpuMla, Fp8AndF16Caches) {
  for_each_tile_kernel([&] {
    for (CpuIsa isa : isa_levels()) {
      for (DType kv : {DType::kE4M3, DType::kE5M2, DType::kF16}) {
        expect_matches_reference(mla_spec(16, 16, {1, 3}, {kTile + 7, 50}, kv, true), isa);
        expect_matches_reference(mla_spec(128, 64, {1}, {2 * kTile + 3}, kv), isa);
      }
      CaseSpec f16 = mla_spec(32, 16, {2, 1}, {45, 64});
      f16.problem.q_dtype = f16.problem.o_dtype = DType::kF16;
      expect_matches_reference(f16, isa);
    }
  });
}

// Scores whose running max creeps up by less than the AMX kernel's rescale slack (8 log2 units)
// over several KV tiles, then jumps past it, at a different pace per head (head h's query is
// (h % 16 + 1) times head 0's, so in one vector of 16 heads some move and some do not): the lazily
// moved max must give the reference's output and LSE on every kernel.
TEST(CpuMla, RunningMaxThatCreepsThenJumps) {
  constexpr int64_t kKeys = 1100;
  for_each_tile_kernel([&] {
    for (CpuIsa isa : isa_levels()) {
      for (int heads : {16, 128}) {
        IsaLimit limit(isa);
        CaseSpec spec = mla_spec(heads, 64, {1}, {kKeys});
        testing::Case c = testing::Case::make(spec);
        const Problem& p = spec.problem;
        const int64_t d_ckv = p.head_dim_ckv, d_kpe = p.head_dim_kpe, ps = p.page_size;
        std::vector<float> q_nope(heads * d_ckv), q_pe(heads * d_kpe, 0.0f);
        for (int h = 0; h < heads; ++h) {
          for (int64_t d = 0; d < d_ckv; ++d) q_nope[h * d_ckv + d] = 0.25f * (h % 16 + 1);
        }
        // Score of key j for head h: 0.25 (h % 16 + 1) * 512 * t_j * sm_scale, 13.3 (h % 16 + 1)
        // t_j in log2 units: t_j climbs 0.0015 a key (2.6 (h % 16 + 1) log2 units a 128-key
        // tile), then jumps by 3 at key 700. The values are the keys' ckv rows.
        std::vector<float> ckv(c.num_pages * ps * d_ckv, 0.0f), kpe(c.num_pages * ps * d_kpe, 0.0f);
        for (int64_t j = 0; j < kKeys; ++j) {
          const float t = 0.0015f * static_cast<float>(j) + (j >= 700 ? 3.0f : 0.0f);
          const int64_t slot = int64_t{c.kv_indices[j / ps]} * ps + j % ps;
          for (int64_t d = 0; d < d_ckv; ++d) {
            ckv[slot * d_ckv + d] = d % 2 == 0 ? t : t * (1.0f + 1.0f / 64);
          }
        }
        testing::from_f32(q_nope.data(), static_cast<int64_t>(q_nope.size()), p.q_dtype,
                          c.q.data());
        testing::from_f32(q_pe.data(), static_cast<int64_t>(q_pe.size()), p.q_dtype, c.q_pe.data());
        testing::from_f32(ckv.data(), static_cast<int64_t>(ckv.size()), p.kv_dtype,
                          c.k_cache.data());
        testing::from_f32(kpe.data(), static_cast<int64_t>(kpe.size()), p.kv_dtype,
                          c.v_cache.data());
        const testing::CheckResult r = testing::check_against_reference(c, run_cpu());
        EXPECT_TRUE(r.ok) << cpu_isa_name(isa) << ", heads " << heads << ": " << r.message;
      }
    }
  });
}

// A NaN in the cache (the e4m3 NaN code, S.1111.111) reaches the output of the rows that see
// it, on every kernel, as in the reference; it is never read as a finite value.
TEST(CpuMla, Fp8NanCodeStaysNan) {
  for (CpuIsa isa : isa_levels()) {
    for_each_tile_kernel([&] {
      IsaLimit limit(isa);
      testing::Case c = testing::Case::make(mla_spec(16, 16, {1}, {40}, DType::kE4M3));
      c.k_cache[static_cast<size_t>(c.kv_indices[1]) * 16 * 512 + 3 * 512 + 7] =
          std::byte{0x7F};  // key 19, ckv dim 7
      PlanOptions options;
      options.backend = "cpu";
      ASSERT_TRUE(kvattn::run(c.problem(), c.args(), options).ok());
      for (float x : c.out_f32()) ASSERT_TRUE(std::isnan(x)) << cpu_isa_name(isa);
    });
  }
}

// A NaN score (the e4m3 NaN code in a key's kpe, which only the score reads) makes the rows that
// see the key NaN, their LSE included, on every kernel (the numerics policy, cpu/common/epilogue.h):
// a NaN sum once read as an empty row (lse = -inf), which a split-KV merge would then drop.
TEST(CpuMla, NanScoreMakesTheRowAndItsLseNan) {
  for (CpuIsa isa : isa_levels()) {
    for_each_tile_kernel([&] {
      IsaLimit limit(isa);
      testing::Case c = testing::Case::make(mla_spec(16, 16, {1}, {40}, DType::kE4M3));
      c.v_cache[static_cast<size_t>(c.kv_indices[1]) * 16 * 64 + 3 * 64] =
          std::byte{0x7F};  // key 19, kpe dim 0
      PlanOptions options;
      options.backend = "cpu";
      ASSERT_TRUE(kvattn::run(c.problem(), c.args(), options).ok());
      for (float x : c.lse_f32()) ASSERT_TRUE(std::isnan(x)) << cpu_isa_name(isa);
      for (float x : c.out_f32()) ASSERT_TRUE(std::isnan(x)) << cpu_isa_name(isa);
    });
  }
}

// The tile kernels widen e4m3 to bf16 with integer bit placement: every one of the 256 codes
// gives the value the reference decodes (NaN stays NaN), over a 16-code tail too.
TEST(CpuMla, E4m3ToBf16IsExactForEveryCode) {
  if (detail::effective_cpu_isa() < CpuIsa::kAvx512) GTEST_SKIP() << "needs AVX-512";
  std::vector<uint8_t> codes(256 + 16);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i);
  std::vector<uint16_t> bf16(codes.size());
  ASSERT_TRUE(cpu::mla_e4m3_to_bf16(codes.data(), static_cast<int>(codes.size()), bf16.data()));
  for (size_t i = 0; i < codes.size(); ++i) {
    const float want = num::e4m3_to_f32(codes[i]), got = num::bf16_to_f32(bf16[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << i;
    } else {
      EXPECT_EQ(got, want) << "code " << i;
    }
  }
}

// Split-KV: forced chunks (tile-aligned and not) and the automatic split of one long request.
TEST(CpuMla, SplitKvMatchesReference) {
  for_each_tile_kernel([&] {
    for (CpuIsa isa : isa_levels()) {
      for (int64_t chunk : {int64_t{kTile}, int64_t{50}, int64_t{0}}) {
        expect_matches_reference(mla_spec(64, 16, {1, 2}, {300, 129}, DType::kBF16, true), isa,
                                 {2, chunk});
      }
      expect_matches_reference(mla_spec(16, 16, {1}, {3000}), isa, {2, 0});
    }
  });
}

// The automatic plan splits a single long request so that every thread has work.
TEST(CpuMla, PlanSplitsFewLongRequests) {
  testing::Case c = testing::Case::make(mla_spec(128, 16, {1}, {4096}));
  Plan plan;
  PlanOptions options;
  options.backend = "cpu";
  options.num_threads = 4;
  ASSERT_TRUE(kvattn::plan(c.problem(), c.args(), options, &plan).ok());
  EXPECT_GT(plan.work.size(), 1u);
  EXPECT_EQ(plan.num_partial_states, static_cast<int64_t>(plan.work.size()));
}

// As FlashInfer's plan: an MLA plan is made from the index tensors alone (no q, caches or
// outputs), reused by run with the full arguments, on each CPU backend.
TEST(CpuMla, PlanFromIndexTensorsAlone) {
  testing::Case c = testing::Case::make(mla_spec(64, 16, {1, 3}, {100, 40}, DType::kBF16, true));
  AttentionArgs full = c.args();
  AttentionArgs index;
  index.qo_indptr = full.qo_indptr;
  index.kv_indptr = full.kv_indptr;
  index.kv_indices = full.kv_indices;
  index.kv_last_page_len = full.kv_last_page_len;
  for (const char* backend : {"reference", "cpu"}) {
    PlanOptions options;
    options.backend = backend;
    Plan plan;
    const Status planned = kvattn::plan(c.problem(), index, options, &plan);
    ASSERT_TRUE(planned.ok()) << backend << ": " << planned.to_string();
    const testing::CheckResult r = testing::check_against_reference(
        c, [&plan](const Problem&, const AttentionArgs& args) { return kvattn::run(plan, args); });
    EXPECT_TRUE(r.ok) << backend << ": " << r.message;
    // Run needs every tensor.
    EXPECT_EQ(kvattn::run(plan, index).code(), ErrorCode::kInvalidArgument) << backend;
  }
}

// append_paged_mla_kv_cache writes ckv and kpe at (batch_indices, positions), quantizing to FP8
// with the cache's k_scale (saturating), on each CPU backend.
TEST(CpuMla, AppendQuantizesWithTheCacheScale) {
  constexpr int kCkv = 64, kKpe = 16, kPageSize = 4, kPages = 3;
  const float scale = 0.5f;
  std::vector<float> ckv_in(2 * kCkv), kpe_in(2 * kKpe);
  for (size_t i = 0; i < ckv_in.size(); ++i) ckv_in[i] = (static_cast<float>(i) - 60.0f) * 3.7f;
  for (size_t i = 0; i < kpe_in.size(); ++i) kpe_in[i] = static_cast<float>(i) * 0.3f - 2.0f;
  std::vector<int32_t> batch = {1, 0}, pos = {5, 0};
  std::vector<int32_t> indptr = {0, 1, 3}, indices = {2, 0, 1}, last = {1, 2};
  for (const char* backend : {"reference", "cpu"}) {
    std::vector<uint8_t> ckv(kPages * kPageSize * kCkv, 0), kpe(kPages * kPageSize * kKpe, 0);
    PagedMLACache cache;
    cache.ckv_cache = TensorView::contiguous(ckv.data(), DType::kE4M3, {kPages, kPageSize, kCkv});
    cache.kpe_cache = TensorView::contiguous(kpe.data(), DType::kE4M3, {kPages, kPageSize, kKpe});
    cache.kv_indptr = TensorView::contiguous(indptr.data(), DType::kI32, {3});
    cache.kv_indices = TensorView::contiguous(indices.data(), DType::kI32, {3});
    cache.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {2});
    cache.k_scale = scale;
    OpOptions options;
    options.backend = backend;
    ASSERT_TRUE(append_paged_mla_kv_cache(
                    TensorView::contiguous(ckv_in.data(), DType::kF32, {2, kCkv}),
                    TensorView::contiguous(kpe_in.data(), DType::kF32, {2, kKpe}),
                    TensorView::contiguous(batch.data(), DType::kI32, {2}),
                    TensorView::contiguous(pos.data(), DType::kI32, {2}), cache, options)
                    .ok())
        << backend;
    // Token 0 -> request 1, position 5: its second page (id 1), slot 1. Token 1 -> request 0,
    // position 0: page 2, slot 0.
    const int64_t slots[2] = {1 * kPageSize + 1, 2 * kPageSize + 0};
    for (int t = 0; t < 2; ++t) {
      for (int d = 0; d < kCkv; ++d) {
        ASSERT_EQ(ckv[slots[t] * kCkv + d], num::f32_to_e4m3(ckv_in[t * kCkv + d] / scale))
            << backend << " token " << t << " d " << d;
      }
      for (int d = 0; d < kKpe; ++d) {
        ASSERT_EQ(kpe[slots[t] * kKpe + d], num::f32_to_e4m3(kpe_in[t * kKpe + d] / scale))
            << backend << " token " << t << " d " << d;
      }
    }
    // A wrong latent width names the argument.
    const Status bad = append_paged_mla_kv_cache(
        TensorView::contiguous(ckv_in.data(), DType::kF32, {2, kCkv / 2}),
        TensorView::contiguous(kpe_in.data(), DType::kF32, {2, kKpe}),
        TensorView::contiguous(batch.data(), DType::kI32, {2}),
        TensorView::contiguous(pos.data(), DType::kI32, {2}), cache, options);
    EXPECT_EQ(bad.code(), ErrorCode::kInvalidShape);
    EXPECT_NE(bad.message().find("ckv_cache"), std::string::npos) << bad.message();
  }
}

}  // namespace
}  // namespace kvattn::cputest
