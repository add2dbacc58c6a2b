// The decode kernels' steps of several KV heads (decode_kernel.h: DotTiles::kStepHeads,
// FmaTiles::kStepHeads) against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu_test_util.h"
#include "decode_test_util.h"

namespace kvattn::cputest {
namespace {

using testing::Case;
using testing::CaseSpec;

// A batch decode of two requests over an NHD cache for the step tests: `heads` KV heads of GQA
// group `group`, dims `d`, page size and output type varied by the case index `i`, and the
// variant `kind`: 0 plain, 1 soft cap, 2 sinks, 3 sliding window, 4 per-head scales, 5
// per-(token, head) scales (each weight two bf16: DotTiles::pv_heads; 4 and 5 FP8 caches only,
// plain otherwise).
CaseSpec step_case(DType kv, int d, int heads, int group, int i, int kind, int64_t len0,
                   int64_t len1, uint64_t seed) {
  CaseSpec spec;
  Problem& p = spec.problem;
  p.op = Op::kBatchDecode;
  p.batch_size = 2;
  p.num_kv_heads = heads;
  p.num_qo_heads = heads * group;
  p.head_dim_qk = p.head_dim_vo = d;
  p.page_size = i % 3 ? 16 : 5;
  p.kv_layout = KVLayout::kNHD;
  p.kv_dtype = kv;
  p.o_dtype = i % 2 ? DType::kF32 : DType::kBF16;
  spec.return_lse = true;
  spec.scalars.k_scale = 0.75f;
  spec.scalars.v_scale = 1.5f;
  switch (kind) {
    case 1:
      p.logits_soft_cap = 8.0f;
      break;
    case 2:
      p.use_sinks = true;
      break;
    case 3:
      p.window_left = 40;
      break;
    case 4:
      if (is_fp8(kv)) {
        p.kv_scale_granularity = KVScaleGranularity::kPerHead;
        spec.scalars.k_scale = spec.scalars.v_scale = 1.0f;
      }
      break;
    case 5:
      if (is_fp8(kv)) {
        p.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
        spec.scalars.k_scale = spec.scalars.v_scale = 1.0f;
      }
      break;
    default:
      break;
  }
  spec.kv_lens = {len0, len1};
  spec.seed = seed;
  return spec;
}

// A step case against the reference, and every fourth one split into chunks of a tile (tasks of
// fewer heads).
void expect_step_case_matches(const CaseSpec& spec, int i) {
  expect_matches_reference(spec, CpuIsa::kAvx512);
  if (i % 4 == 0) expect_matches_reference(spec, CpuIsa::kAvx512, {.kv_chunk_size = kTile});
}

// Steps of several heads (decode_kernel.h, DotTiles::kStepHeads): on NHD caches whose rows are
// one 64-value chunk (bf16 d64, FP8 d64) the dot-product kernels compute QK for 4 adjacent KV
// heads a visit (FP8 d128, checked here too, as well: WideRowSteps), and PV for all of them
// (pv_step) where each saw a visible key; a task whose head count is not a multiple takes its last
// heads one at a time. Checked over head counts around the step (1-9), GQA groups 3, 4, 8 and 16,
// lengths around the tile, the variants those kernels take, and split into chunks (tasks of fewer
// heads).
TEST(CpuDecodeHeadSteps, MatchTheReferenceOnNhdCaches) {
  // Forced on: the CPU class may take one head a step (CpuFeatures::decode_lane_head_steps).
  const ScopedEnv steps("KVATTN_CPU_LANE_HEAD_STEPS", "1");
  struct Kernel {
    std::string_view name;
    DType kv;
  };
  const Kernel kernels[] = {
      {kBf16Dot, DType::kBF16}, {kFp8TableDot, DType::kE4M3}, {kFp8TableDot, DType::kE5M2}};
  const int64_t lengths[] = {1, kTile - 1, kTile, kTile + 1, 2 * kTile + 3, 100};
  const int groups[] = {4, 3, 8, 16};
  int i = 0, ran = 0;
  for (const Kernel& kernel : kernels) {
    std::string why;
    if (runnable(kernel.name, &why) == nullptr) continue;
    KernelOverride named(kernel.name);
    for (int d : {64, 128}) {
      if (kernel.kv == DType::kBF16 && d == 128) continue;  // 256-byte rows: WideRowSteps
      for (int heads : {1, 2, 3, 4, 5, 8, 9}) {
        for (int variant = 0; variant < 2; ++variant, ++i) {
          expect_step_case_matches(
              step_case(kernel.kv, d, heads, groups[i % 4], i, (i + variant) % 6, lengths[i % 6],
                        lengths[(i + 3) % 6], 900 + i),
              i);
          ++ran;
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no AVX512_BF16 dot-product kernel runs here";
}

// Steps over rows of two chunks or more (DotTiles::kStepHeads: 8 heads at two chunks, bf16 and FP8
// d128, then a step of 4 (kTailStepHeads); 4 heads at d256): QK over every head of the step per
// key, PV over every head per sub-tile of 8 keys (pv_step) where each head saw a visible key, else
// head by head; a task's heads past the steps one at a time. Checked over head counts 1-9, 12, 13,
// 15 and 16 (8 + 4 + 1 + 1 + 1 at 15), GQA groups 3, 4, 8 and 16
// (padded rows, blocks of 4), lengths around the sub-tile and the tile, the variants those
// kernels take, and split into chunks.
TEST(CpuDecodeHeadSteps, WideRowStepsMatchTheReference) {
  const ScopedEnv steps("KVATTN_CPU_LANE_HEAD_STEPS", "1");  // whatever the CPU class takes
  struct Kernel {
    std::string_view name;
    DType kv;
    int d;
  };
  const Kernel kernels[] = {{kBf16Dot, DType::kBF16, 128},
                            {kBf16Dot, DType::kBF16, 256},
                            {kFp8TableDot, DType::kE4M3, 128},
                            {kFp8TableDot, DType::kE5M2, 128},
                            {kFp8TableDot, DType::kE4M3, 256}};
  const int64_t lengths[] = {1, 7, 8, 9, kTile - 1, kTile, kTile + 1, 2 * kTile + 3, 100};
  const int groups[] = {4, 3, 8, 16};
  int i = 0, ran = 0;
  for (const Kernel& kernel : kernels) {
    std::string why;
    if (runnable(kernel.name, &why) == nullptr) continue;
    KernelOverride named(kernel.name);
    for (int heads : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, 16}) {
      if (kernel.d == 256 && heads != 3 && heads != 8 && heads != 12) continue;  // fewer at d 256
      for (int variant = 0; variant < 2; ++variant, ++i) {
        expect_step_case_matches(
            step_case(kernel.kv, kernel.d, heads, groups[i % 4], i, (i + variant) % 6,
                      lengths[i % 9], lengths[(i + 4) % 9], 1900 + i),
            i);
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no AVX512_BF16 dot-product kernel runs here";
}

// The same kernels over NHD caches one head a step, as AMD Zen 3 / Zen 4 take them at head dims
// 64 and 128 (KVATTN_CPU_LANE_HEAD_STEPS=0, CpuFeatures::decode_lane_head_steps), whatever the
// CPU class takes (d 256 keeps its steps either way): head counts around the steps, GQA groups 3,
// 4, 8 and 16, lengths around the tile, the variants, split into chunks.
TEST(CpuDecodeHeadSteps, LaneTasksOneHeadAStepMatchTheReference) {
  const ScopedEnv steps("KVATTN_CPU_LANE_HEAD_STEPS", "0");
  struct Kernel {
    std::string_view name;
    DType kv;
    int d;
  };
  const Kernel kernels[] = {{kBf16Dot, DType::kBF16, 128},
                            {kBf16Dot, DType::kBF16, 64},
                            {kFp8TableDot, DType::kE4M3, 128},
                            {kFp8TableDot, DType::kE5M2, 64}};
  const int64_t lengths[] = {1, kTile - 1, kTile, kTile + 1, 2 * kTile + 3, 100};
  const int groups[] = {4, 3, 8, 16};
  int i = 0, ran = 0;
  for (const Kernel& kernel : kernels) {
    std::string why;
    if (runnable(kernel.name, &why) == nullptr) continue;
    KernelOverride named(kernel.name);
    for (int heads : {1, 4, 5, 8, 13}) {
      expect_step_case_matches(step_case(kernel.kv, kernel.d, heads, groups[i % 4], i, i % 6,
                                         lengths[i % 6], lengths[(i + 3) % 6], 7900 + i),
                               i);
      ++i;
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "no AVX512_BF16 dot-product kernel runs here";
}

// GQA groups 1 and 2 (MHA and pairs of query heads) on NHD caches: the dot-product kernels' steps
// of 8 / group heads (DotTiles::kStepHeads without query lanes: qk_chunks over the step's heads
// per key, pv_step per sub-tile), and tasks wider than 16 heads where a token's heads are side by
// side (decode_max_task_heads: 64 heads at group 1, 32 at group 2), in the dot-product and the
// fp32-FMA kernels (steps forced). Head counts around the step and the task width (a task of 64
// and one of the rest: 65, 72), lengths around the sub-tile and the tile, the variants, split
// into chunks (tasks of fewer keys).
TEST(CpuDecodeHeadSteps, GroupsOfOneAndTwoTakeWholeTokenRows) {
  const ScopedEnv steps("KVATTN_CPU_FMA_HEAD_STEPS", "1");
  struct Kernel {
    std::string_view name;
    DType kv;
    int d;
  };
  const Kernel kernels[] = {{kBf16Dot, DType::kBF16, 128},     {kBf16Dot, DType::kBF16, 64},
                            {kFp8TableDot, DType::kE4M3, 128}, {kFp8TableDot, DType::kE5M2, 64},
                            {kFma512, DType::kF16, 128},       {kFmaAvx2, DType::kBF16, 64}};
  const int64_t lengths[] = {1, 7, 8, 9, kTile - 1, kTile, kTile + 1, 2 * kTile + 3, 100};
  const int heads[] = {1, 4, 7, 8, 9, 17, 33, 40, 64, 65, 72};
  int i = 0, ran = 0;
  for (const Kernel& kernel : kernels) {
    std::string why;
    if (runnable(kernel.name, &why) == nullptr) continue;
    KernelOverride named(kernel.name);
    for (const int group : {1, 2}) {
      for (const int h : heads) {
        if (group == 2 && h > 40) continue;  // 32 heads a task: 33 and 40 cross it
        expect_step_case_matches(step_case(kernel.kv, kernel.d, h, group, i, i % 6, lengths[i % 9],
                                           lengths[(i + 4) % 9], 6900 + i),
                                 i);
        ++i;
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no AVX2, AVX-512 or AVX512_BF16 kernel runs here";
}

// The fp32-FMA kernels' steps (FmaTiles::kStepHeads: 8 heads, 4 at blocks of 8 query rows;
// qk_heads, 4 keys at a time, and pv_heads, sub-tiles of 8 keys), forced on whatever the CPU class
// takes (KVATTN_CPU_FMA_HEAD_STEPS=1): the AVX2 and AVX-512 kernels, every KV type they take
// (e4m3's NaN codes restored head by head after the step), head dims with a tail chunk (40, 96,
// (192, 128)) and the unrolled 64 / 128 / 256, GQA groups 1, 2, 3, 4, 8 and 16 (blocks of 1, 2, 4
// and 8 rows; 8 and 16 take 4 heads a step on AVX-512, one on AVX2), head counts around the step,
// lengths around the 4-key group, the sub-tile and the tile, the variants, split into chunks. (The
// AVX2 kernel's bf16 rows at blocks of 4 query rows and dims 64 / 128 / 256 are read by parity,
// in steps too: kParityRows, qk_step; its e4m3 rows there by quads one head a step whatever the
// switch: kQuadRows.)
TEST(CpuDecodeHeadSteps, FmaHeadStepsMatchTheReference) {
  const ScopedEnv steps("KVATTN_CPU_FMA_HEAD_STEPS", "1");
  const DType kvs[] = {DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2, DType::kF32};
  const std::pair<int, int> dims[] = {{64, 64}, {128, 128}, {256, 256},
                                      {40, 40}, {96, 96},   {192, 128}};
  const int64_t lengths[] = {1, 3, 4, 5, 8, 9, kTile - 1, kTile, kTile + 1, 2 * kTile + 3, 100};
  const int groups[] = {4, 1, 2, 3, 8, 16};
  const int heads[] = {8, 9, 3, 12, 16, 4, 5};
  int i = 0, ran = 0;
  for (const std::string_view kernel : {kFmaAvx2, kFma512}) {
    std::string why;
    if (runnable(kernel, &why) == nullptr) continue;
    const KernelOverride named(kernel);
    for (const DType kv : kvs) {
      for (const auto& [dqk, dvo] : dims) {
        if (kv == DType::kF32 && dqk != 128 && dqk != 40) continue;  // f32: fewer
        for (int variant = 0; variant < 2; ++variant, ++i) {
          CaseSpec spec = step_case(kv, dqk, heads[i % 7], groups[i % 6], i, (i + variant) % 6,
                                    lengths[i % 11], lengths[(i + 5) % 11], 4900 + i);
          spec.problem.head_dim_vo = dvo;
          expect_step_case_matches(spec, i);
          ++ran;
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no AVX2 or AVX-512 kernel runs here";
}

// The AVX2 kernel's bf16 rows by parity in steps of 8 heads (kParityRows at blocks of 4 query
// rows: FmaTiles::qk_step head after head by qk_tile_parity, PV by pv_heads' sub-tiles, the
// output back from parity order once per head), the class's choice on Zen 3 and forced here: head
// dims 64 / 128 / 256, GQA groups 3 and 4, head counts below, at and above the step (tasks with a
// tail step of one head a step), lengths around the two-key pass, the sub-tile and the tile, the
// variants, split into chunks.
TEST(CpuDecodeHeadSteps, Avx2ParityRowsInStepsMatchTheReference) {
  const ScopedEnv steps("KVATTN_CPU_FMA_HEAD_STEPS", "1");
  std::string why;
  if (runnable(kFmaAvx2, &why) == nullptr) GTEST_SKIP() << why;
  const KernelOverride named(kFmaAvx2);
  const int64_t lengths[] = {1, 2, 3, 7, 8, 9, kTile - 1, kTile, kTile + 1, 2 * kTile + 3, 100};
  const int heads[] = {8, 9, 4, 16, 13, 1};
  int i = 0;
  for (const int d : {64, 128, 256}) {
    for (const int group : {4, 3}) {
      for (int k = 0; k < 4; ++k, ++i) {
        expect_step_case_matches(step_case(DType::kBF16, d, heads[i % 6], group, i, i % 4,
                                           lengths[i % 11], lengths[(i + 6) % 11], 8300 + i),
                                 i);
      }
    }
  }
}

// The e4m3 NaN code in K and V rows of heads inside an fp32-FMA step and after it: each head's
// rows are scanned after the step's PV (poison_e4m3_nans per head), so the reference's NaN
// pattern comes back head by head (K: the key's query rows NaN; V: the column), and no other.
TEST(CpuDecodeHeadSteps, FmaHeadStepsRestoreE4m3NanCodesPerHead) {
  const ScopedEnv steps("KVATTN_CPU_FMA_HEAD_STEPS", "1");
  int ran = 0;
  for (const std::string_view kernel : {kFmaAvx2, kFma512}) {
    std::string why;
    if (runnable(kernel, &why) == nullptr) continue;
    CaseSpec spec = step_case(DType::kE4M3, 128, 9, 4, 1, 0, 70, 45, 5900);
    spec.problem.o_dtype = DType::kF32;
    Case c = Case::make(spec);
    AttentionArgs fresh = c.args_with_fresh_outputs(DType::kF32);
    poke_paged<uint8_t>(c, fresh.paged_k_cache, 0, 40, 2, 5, 0x7F);    // in the step
    poke_paged<uint8_t>(c, fresh.paged_v_cache, 0, 41, 5, 100, 0xFF);  // in the step
    poke_paged<uint8_t>(c, fresh.paged_v_cache, 1, 44, 8, 7, 0x7F);    // the head after it
    PlanOptions reference;
    reference.backend = "reference";
    ASSERT_TRUE(kvattn::run(spec.problem, fresh, reference).ok());
    const std::vector<float> ref_out = c.fresh_out_f32();
    const KernelOverride named(kernel);
    AttentionArgs args = c.args();
    ASSERT_TRUE(kvattn::run(spec.problem, args, {.backend = "cpu"}).ok());
    const std::vector<float> out = c.out_f32();
    int nans = 0;
    for (std::size_t e = 0; e < out.size(); ++e) {
      ASSERT_EQ(std::isnan(out[e]), std::isnan(ref_out[e])) << kernel << " element " << e;
      nans += std::isnan(out[e]);
    }
    // K: head 2's 4 query rows of request 0; V: one column of head 5's (request 0) and head 8's
    // (request 1) 4 rows.
    EXPECT_EQ(nans, 4 * 128 + 4 + 4) << kernel;
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no AVX2 or AVX-512 kernel runs here";
}

// Per-(token, head) V scales ride in the weights of the FP8 dot-product kernel as two bf16 each
// (DotTiles::pv_heads): where one key dominates (its weight exactly 1 at one key) the output is
// that key's V times its scale, which the reference gives to f32 precision; one bf16 weight
// would round the scale (2^-9 of the value, 100x the bound at one key). Every step size (d 64:
// 4 heads, d 128: 2, d 256: 8) and single heads (3 KV heads), one and a few keys, f32 output.
TEST(CpuDecodeHeadSteps, PerTokenScalesAreNotRoundedIntoTheWeights) {
  const ScopedEnv steps("KVATTN_CPU_LANE_HEAD_STEPS", "1");  // whatever the CPU class takes
  std::string why;
  if (runnable(kFp8TableDot, &why) == nullptr) GTEST_SKIP() << why;
  KernelOverride named(kFp8TableDot);
  int i = 1;
  for (DType kv : {DType::kE4M3, DType::kE5M2}) {
    for (int d : {64, 128, 256}) {
      for (int heads : {8, 3}) {
        for (const auto& [len0, len1] : {std::pair<int64_t, int64_t>{1, 2}, {3, kTile + 1}}) {
          CaseSpec spec = step_case(kv, d, heads, 4, i, 5, len0, len1, 2900 + i);
          spec.problem.o_dtype = DType::kF32;
          expect_matches_reference(spec, CpuIsa::kAvx512);
          i += 2;
        }
      }
    }
  }
}

// Inf and NaN in the K and V rows of heads inside a step give the reference's NaN pattern: a
// NaN or inf K element makes that key's score of each query row NaN or +-inf, a NaN V element
// its output column NaN.
TEST(CpuDecodeHeadSteps, InfAndNanInStepRowsGiveTheReferences) {
  const ScopedEnv steps("KVATTN_CPU_LANE_HEAD_STEPS", "1");  // whatever the CPU class takes
  std::string why;
  if (runnable(kBf16Dot, &why) == nullptr) GTEST_SKIP() << why;
  CaseSpec spec;
  Problem& p = spec.problem;
  p.op = Op::kBatchDecode;
  p.batch_size = 2;
  p.num_kv_heads = 8;
  p.num_qo_heads = 32;
  p.head_dim_qk = p.head_dim_vo = 64;
  p.page_size = 16;
  p.kv_dtype = DType::kBF16;
  p.o_dtype = DType::kF32;
  spec.return_lse = true;
  spec.kv_lens = {70, 45};
  Case c = Case::make(spec);
  constexpr uint16_t kPlusInf = 0x7F80, kNan = 0x7FC0;
  AttentionArgs fresh = c.args_with_fresh_outputs(DType::kF32);
  poke_paged(c, fresh.paged_k_cache, 0, 40, 1, 3, kPlusInf);  // head 1 (second of the first step)
  poke_paged(c, fresh.paged_k_cache, 0, 41, 6, 60, kNan);     // head 6 (third of the second step)
  poke_paged(c, fresh.paged_v_cache, 1, 33, 3, 9, kNan);      // head 3 (last of the first step)
  PlanOptions reference;
  reference.backend = "reference";
  ASSERT_TRUE(kvattn::run(p, fresh, reference).ok());
  const std::vector<float> ref_out = c.fresh_out_f32(), ref_lse = c.fresh_lse_f32();
  KernelOverride named(kBf16Dot);
  int nan_outputs = 0;
  for (int64_t chunk : {int64_t{0}, int64_t{16}}) {
    AttentionArgs args = c.args();
    ASSERT_TRUE(kvattn::run(p, args, {.backend = "cpu", .kv_chunk_size = chunk}).ok());
    const std::vector<float> out = c.out_f32(), lse = c.lse_f32();
    for (std::size_t e = 0; e < out.size(); ++e) {
      ASSERT_EQ(std::isnan(out[e]), std::isnan(ref_out[e]))
          << "chunk " << chunk << " element " << e;
      // Weights rounded to bf16 (2^-9 relative) over values in [-1, 1]: 8e-3 is twice 2^-8.
      if (!std::isnan(out[e])) EXPECT_NEAR(out[e], ref_out[e], 8e-3) << e;
      nan_outputs += std::isnan(out[e]);
    }
    for (std::size_t e = 0; e < lse.size(); ++e) {
      ASSERT_EQ(std::isnan(lse[e]), std::isnan(ref_lse[e])) << "lse " << e;
    }
  }
  EXPECT_GT(nan_outputs, 0);
}

// Per-token scales over an e5m2 cache with inf and NaN in visible V rows: the weights' two bf16
// parts (split_bf16) meet an inf as one weight would, so each output element is inf, -inf or NaN
// exactly where the reference's is (a low part of 0 or of the other sign would make inf NaN).
// Heads inside a step (d 64: 4 a step; d 256: 8) and after it.
TEST(CpuDecodeHeadSteps, PerTokenWeightsMeetInfAsTheReferenceDoes) {
  const ScopedEnv steps("KVATTN_CPU_LANE_HEAD_STEPS", "1");  // whatever the CPU class takes
  std::string why;
  if (runnable(kFp8TableDot, &why) == nullptr) GTEST_SKIP() << why;
  constexpr uint8_t kPlusInf = 0x7C, kMinusInf = 0xFC, kNan = 0x7E;
  int inf_outputs = 0;
  for (int d : {64, 256}) {
    CaseSpec spec = step_case(DType::kE5M2, d, 9, 4, 1, 5, 70, 45, 3900 + d);
    spec.problem.o_dtype = DType::kF32;
    Case c = Case::make(spec);
    AttentionArgs fresh = c.args_with_fresh_outputs(DType::kF32);
    poke_paged(c, fresh.paged_v_cache, 0, 40, 1, 3, kPlusInf);   // in the first step
    poke_paged(c, fresh.paged_v_cache, 0, 41, 2, 5, kMinusInf);  // in the first step
    poke_paged(c, fresh.paged_v_cache, 1, 33, 8, 7, kPlusInf);   // the head after the steps
    poke_paged(c, fresh.paged_v_cache, 1, 20, 3, 9, kPlusInf);   // +inf and -inf in one column:
    poke_paged(c, fresh.paged_v_cache, 1, 21, 3, 9, kMinusInf);  // NaN
    poke_paged(c, fresh.paged_v_cache, 0, 7, 6, 11, kNan);
    PlanOptions reference;
    reference.backend = "reference";
    ASSERT_TRUE(kvattn::run(spec.problem, fresh, reference).ok());
    const std::vector<float> ref_out = c.fresh_out_f32();
    KernelOverride named(kFp8TableDot);
    AttentionArgs args = c.args();
    ASSERT_TRUE(kvattn::run(spec.problem, args, {.backend = "cpu"}).ok());
    const std::vector<float> out = c.out_f32();
    for (std::size_t e = 0; e < out.size(); ++e) {
      ASSERT_EQ(std::isnan(out[e]), std::isnan(ref_out[e])) << "d " << d << " element " << e;
      ASSERT_EQ(std::isinf(out[e]), std::isinf(ref_out[e])) << "d " << d << " element " << e;
      if (std::isinf(out[e])) {
        EXPECT_EQ(out[e], ref_out[e]) << "d " << d << " element " << e;
        ++inf_outputs;
      }
    }
  }
  EXPECT_GT(inf_outputs, 0);
}

}  // namespace
}  // namespace kvattn::cputest
