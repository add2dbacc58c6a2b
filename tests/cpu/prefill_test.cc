// The CPU prefill path (plan_prefill + run_prefill) against the fp64 reference, at every ISA
// level this machine has: every variant, dtype triple, head-dim pair, layout and page size, and
// the lengths around each tile size.
#include "cpu/prefill/prefill.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "cpu/kernel_table.h"
#include "cpu/prefill/tile_config.h"
#include "cpu/prefill_test_util.h"
#include "cpu_test_util.h"

namespace kvattn::cpu::test {
namespace {

TEST(CpuPrefillVariants, MatchReferenceAtEveryIsa) {
  for (const KernelLevel& isa : available_levels()) {
    for (const Variant& v : variants()) {
      // Two requests: one with a cached prefix (qo < kv), one square; lengths off the tiles.
      testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {19, 33}, {83, 33});
      spec.return_lse = true;
      v.apply(spec);
      expect_matches_reference(spec, isa, v.name);
    }
  }
}

TEST(CpuPrefillVariants, RaggedKVAndSingleAtEveryIsa) {
  for (const KernelLevel& isa : available_levels()) {
    for (const Variant& v : variants()) {
      testing::CaseSpec ragged = small_spec(Op::kBatchPrefillRagged, {7, 40}, {30, 70});
      v.apply(ragged);
      expect_matches_reference(ragged, isa, "ragged " + v.name);
      testing::CaseSpec single = small_spec(Op::kSinglePrefill, {37}, {50});
      v.apply(single);
      expect_matches_reference(single, isa, "single " + v.name);
    }
  }
}

// Per-(token, head) FP8 scales at every kernel this machine has (the bf16-dot kernel folds each
// key's V scale into P as two bf16, hi + lo, and multiplies the scores by the K scales:
// bf16_pairs.h, prefill_avx512_bf16.cc): one key (its weight exactly 1, where one bf16 would
// round the scale past the bound), lengths around the KV tile (64 keys at these dims, 32 at d
// 256), the op kinds, both layouts, dims 64 / 128 / 256, (192, 128) and (40, 24), sliding window,
// soft cap and ALiBi (few keys dominate: a rounded P errs there up to 2.5x the baseline's error,
// uncorrelated with it); f32 output.
TEST(CpuPrefillScales, PerTokenScalesAtEveryIsa) {
  const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}, {40, 24}};
  const Op ops[] = {Op::kBatchPrefillPaged, Op::kBatchPrefillRagged, Op::kSinglePrefill};
  for (const KernelLevel& isa : available_levels()) {
    int i = 0;
    for (const auto& dim : dims) {
      for (const DType kv : {DType::kE4M3, DType::kE5M2}) {
        for (const auto& [qo, len] : {std::pair<int64_t, int64_t>{1, 1}, {5, 31}, {9, 65}}) {
          const Op op = ops[i % 3];
          testing::CaseSpec spec = op == Op::kSinglePrefill ? small_spec(op, {qo}, {len})
                                                            : small_spec(op, {qo, 2}, {len, 33});
          Problem& p = spec.problem;
          p.head_dim_qk = dim[0];
          p.head_dim_vo = dim[1];
          p.kv_dtype = kv;
          p.o_dtype = DType::kF32;
          p.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
          p.kv_layout = i % 2 ? KVLayout::kHND : KVLayout::kNHD;
          p.mask_mode = MaskMode::kCausal;
          if (i % 4 == 1) p.window_left = 12;
          if (i % 4 == 2) p.logits_soft_cap = 8.0f;
          if (i % 4 == 3) p.pos_encoding_mode = PosEncoding::kAlibi;
          spec.return_lse = true;
          expect_matches_reference(spec, isa,
                                   "per-token d " + std::to_string(dim[0]) + "/" +
                                       std::to_string(dim[1]) + " kv " + std::to_string(len));
          ++i;
        }
      }
    }
  }
}

TEST(CpuPrefillDTypes, EveryQueryKVOutputTriple) {
  const DType inputs[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2};
  const DType outputs[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (const KernelLevel& isa : available_levels()) {
    for (DType q : inputs) {
      for (DType kv : inputs) {
        for (DType o : outputs) {
          // The full grid at the best level; each lower level runs it with one output type.
          if (find_cpu_kernel(isa.kernel)->isa !=
                  find_cpu_kernel(available_levels().back().kernel)->isa &&
              o != DType::kF32) {
            continue;
          }
          testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {21}, {45});
          spec.problem.q_dtype = q;
          spec.problem.kv_dtype = kv;
          spec.problem.o_dtype = o;
          spec.problem.mask_mode = MaskMode::kCausal;
          spec.return_lse = true;
          if (is_fp8(q)) spec.scalars.q_scale = 0.75f;
          if (is_fp8(kv)) {
            spec.scalars.k_scale = 0.5f;
            spec.scalars.v_scale = 3.0f;
            spec.value_range = 4.0f;
          }
          expect_matches_reference(spec, isa,
                                   std::string("q ") + std::string(dtype_name(q)) + " kv " +
                                       std::string(dtype_name(kv)) + " o " +
                                       std::string(dtype_name(o)));
        }
      }
    }
  }
}

TEST(CpuPrefillHeadDims, FastAndGenericPairs) {
  const std::pair<int, int> dims[] = {{64, 64}, {128, 128}, {256, 256}, {192, 128},
                                      {40, 40}, {96, 32},   {18, 70},   {8, 8}};
  for (const KernelLevel& isa : available_levels()) {
    for (auto [dqk, dvo] : dims) {
      testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {17, 5}, {70, 5});
      spec.problem.head_dim_qk = dqk;
      spec.problem.head_dim_vo = dvo;
      spec.problem.mask_mode = MaskMode::kCausal;
      spec.problem.pos_encoding_mode = PosEncoding::kRopeLlama;
      spec.return_lse = true;
      expect_matches_reference(spec, isa,
                               "dims " + std::to_string(dqk) + "/" + std::to_string(dvo));
    }
  }
}

TEST(CpuPrefillLayouts, PagedCachesAndSingleLayouts) {
  for (const KernelLevel& isa : available_levels()) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (int page_size : {1, 16, 7}) {
        for (bool combined : {false, true}) {
          testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {12, 30, 1}, {44, 30, 17});
          spec.problem.kv_layout = layout;
          spec.problem.page_size = page_size;
          spec.problem.mask_mode = MaskMode::kCausal;
          spec.combined_kv_cache = combined;
          expect_matches_reference(spec, isa,
                                   std::string(kv_layout_name(layout)) + " page " +
                                       std::to_string(page_size) + (combined ? " combined" : ""));
        }
      }
      testing::CaseSpec single = small_spec(Op::kSinglePrefill, {29}, {61});
      single.problem.kv_layout = layout;
      single.problem.mask_mode = MaskMode::kCausal;
      expect_matches_reference(single, isa, "single " + std::string(kv_layout_name(layout)));
    }
  }
}

// Query lengths below, at, above and twice the tokens of a tile, key lengths likewise around the
// KV tile (each kernel's own tile policy), for several GQA group sizes (which change the tokens per
// tile).
TEST(CpuPrefillTiles, LengthsAroundEveryTileSize) {
  struct Heads {
    int qo, kv;
  };
  const Heads head_sets[] = {{4, 2}, {2, 2}, {6, 2}, {8, 1}, {80, 1}};
  for (const KernelLevel& isa : available_levels()) {
    for (Heads h : head_sets) {
      const int group = h.qo / h.kv;
      const prefill::PrefillTile tile =
          prefill::prefill_tile(group, 64, 64, find_cpu_kernel(isa.kernel)->tile);
      const int64_t t = tile.tokens, n = tile.kv_tile;
      const std::vector<int64_t> qo_lens = {1, t - 1, t, t + 1, 2 * t};
      const std::vector<int64_t> kv_lens = {n - 1, n, n + 1, 2 * n};
      for (int64_t qo : qo_lens) {
        if (qo < 1) continue;
        for (int64_t kv : kv_lens) {
          // Causal with the queries at the end of the keys, and with more queries than keys.
          testing::CaseSpec spec =
              small_spec(Op::kBatchPrefillPaged, {qo, qo + 3}, {kv, qo + 3 > kv ? kv : qo + 3});
          spec.problem.num_qo_heads = h.qo;
          spec.problem.num_kv_heads = h.kv;
          spec.problem.mask_mode = MaskMode::kCausal;
          spec.return_lse = true;
          expect_matches_reference(spec, isa,
                                   "heads " + std::to_string(h.qo) + "/" + std::to_string(h.kv) +
                                       " qo " + std::to_string(qo) + " kv " + std::to_string(kv));
        }
      }
      if (group > 8) continue;  // the long case once per small group keeps the suite quick
      testing::CaseSpec longer = small_spec(Op::kBatchPrefillPaged, {3 * t + 5}, {5 * n + 3});
      longer.problem.num_qo_heads = h.qo;
      longer.problem.num_kv_heads = h.kv;
      longer.problem.mask_mode = MaskMode::kCausal;
      longer.problem.window_left = n + 5;
      expect_matches_reference(longer, isa, "long window heads " + std::to_string(h.qo));
    }
  }
}

// ALiBi with a causal mask puts each row's max in its last KV tiles; the bf16 kernels then move
// their running max on any rise (bf16_pairs.h), so their P rounds as a plain kernel's does and
// their error stays at the baseline's (with the lazy slack it reached 1.08-1.74x of it, against
// the 2x bound). Two and three KV tiles, six seeds, f32 output; checked at 1.25x.
TEST(CpuPrefillSoftmax, AlibiErrorsStayAtTheBaselines) {
  for (const KernelLevel& isa : available_levels()) {
    for (int64_t kv : {77, 130}) {
      for (uint64_t seed = 1; seed <= 6; ++seed) {
        testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {7, 7}, {kv, kv});
        Problem& p = spec.problem;
        p.num_qo_heads = 16;
        p.num_kv_heads = 4;
        p.head_dim_qk = 40;
        p.head_dim_vo = 24;
        p.page_size = 5;
        p.kv_dtype = DType::kE4M3;
        p.o_dtype = DType::kF32;
        p.mask_mode = MaskMode::kCausal;
        p.pos_encoding_mode = PosEncoding::kAlibi;
        spec.seed = seed;
        testing::Case c = testing::Case::make(spec);
        LevelGuard guard(isa);
        const testing::CheckResult r = testing::check_against_reference(
            c, [](const Problem& pr, const AttentionArgs& a) { return run_cpu_prefill(pr, a); });
        EXPECT_LE(r.out.max_err, 1.25 * r.out.baseline_err + r.out.atol)
            << isa.name() << " kv " << kv << " seed " << seed << "\n"
            << r.message;
      }
    }
  }
}

// Scores whose running max creeps up by less than the bf16 kernels' rescale slack over several KV
// tiles, then jumps past it, at a different pace per row (the query of head h is h + 1 times
// that of head 0): the lazily moved max (bf16_pairs.h) must give the reference's output and LSE.
TEST(CpuPrefillSoftmax, RunningMaxThatCreepsThenJumps) {
  for (const KernelLevel& isa : available_levels()) {
    testing::CaseSpec spec = small_spec(Op::kSinglePrefill, {5}, {1100});
    spec.return_lse = true;
    testing::Case c = testing::Case::make(spec);
    const Problem& p = spec.problem;
    const int64_t dim = p.head_dim_qk;
    std::vector<float> q(5 * p.num_qo_heads * dim), k(1100 * p.num_kv_heads * dim);
    for (int64_t i = 0; i < 5; ++i) {
      for (int h = 0; h < p.num_qo_heads; ++h) {
        for (int64_t d = 0; d < dim; ++d) {
          q[(i * p.num_qo_heads + h) * dim + d] = 0.25f * static_cast<float>(h + 1);
        }
      }
    }
    // Score of key j for head h: (h + 1) * 0.25 * dim * t_j * sm_scale = 2 (h + 1) t_j at d 64,
    // up to 11.5 (h + 1) t_j in log2 units: t_j climbs 0.0015 a key (0.6 to 2.2 log2 units every
    // 64 keys), then jumps by 3 at key 700.
    for (int64_t j = 0; j < 1100; ++j) {
      const float t = 0.0015f * static_cast<float>(j) + (j >= 700 ? 3.0f : 0.0f);
      for (int h = 0; h < p.num_kv_heads; ++h) {
        for (int64_t d = 0; d < dim; ++d) {
          k[(j * p.num_kv_heads + h) * dim + d] = d % 2 == 0 ? t : t * (1.0f + 1.0f / 64);
        }
      }
    }
    testing::from_f32(q.data(), static_cast<int64_t>(q.size()), p.q_dtype, c.q.data());
    testing::from_f32(k.data(), static_cast<int64_t>(k.size()), p.kv_dtype, c.k.data());
    expect_matches_reference(c, isa, "creeping, then jumping scores");
  }
}

TEST(CpuPrefillEmptyRows, RowsThatSeeNoKeyGiveZeroAndMinusInfinity) {
  for (const KernelLevel& isa : available_levels()) {
    // More queries than keys, causal: the first qo_len - kv_len rows see nothing.
    testing::CaseSpec more_queries = small_spec(Op::kBatchPrefillPaged, {40}, {9});
    more_queries.problem.mask_mode = MaskMode::kCausal;
    more_queries.return_lse = true;
    expect_matches_reference(more_queries, isa, "qo > kv causal");
    // A custom mask that hides everything from every row.
    testing::CaseSpec hidden = small_spec(Op::kBatchPrefillPaged, {20}, {30});
    hidden.problem.mask_mode = MaskMode::kCustom;
    hidden.custom_mask_density = 0.0;
    hidden.return_lse = true;
    expect_matches_reference(hidden, isa, "mask of zeros");
    // A sparse custom mask: some rows see nothing, some one key.
    testing::CaseSpec sparse = small_spec(Op::kBatchPrefillPaged, {20}, {30});
    sparse.problem.mask_mode = MaskMode::kCustom;
    sparse.custom_mask_density = 0.03;
    sparse.packed_custom_mask = true;
    sparse.return_lse = true;
    expect_matches_reference(sparse, isa, "sparse packed mask");
    // A request without keys next to one with keys.
    testing::CaseSpec no_keys = small_spec(Op::kBatchPrefillRagged, {5, 6}, {0, 12});
    no_keys.return_lse = true;
    expect_matches_reference(no_keys, isa, "request without keys");
  }
}

TEST(CpuPrefillPlan, CoversEveryQueryRowOnceCostliestFirst) {
  testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {100, 3, 0, 64}, {300, 3, 10, 64});
  spec.problem.mask_mode = MaskMode::kCausal;
  testing::Case c = testing::Case::make(spec);
  const AttentionArgs args = c.args();
  Plan plan;
  plan.problem = spec.problem;
  const CpuKernel* kernel = nullptr;
  ASSERT_TRUE(choose_cpu_kernel(spec.problem, plan_isa(Device::cpu()), &kernel).ok());
  plan.kernel = std::string(kernel->name);
  PlanOptions options;
  options.num_threads = 2;
  ASSERT_TRUE(plan_prefill(spec.problem, args, options, &plan).ok());
  EXPECT_GT(plan.workspace_bytes, 0u);
  EXPECT_GE(plan.num_threads, 1);
  EXPECT_LE(plan.num_threads, 2);
  std::map<std::tuple<int, int, int>, int> covered;
  int64_t previous_cost = -1;
  for (const WorkItem& w : plan.work) {
    for (int t = w.qo_begin; t < w.qo_end; ++t) ++covered[{w.request, w.kv_head, t}];
    // Cost order: query tokens x visible keys (+ a constant per token) never increases.
    const int64_t cost = int64_t{w.qo_end - w.qo_begin} * (w.kv_end - w.kv_begin + 8);
    if (previous_cost >= 0) {
      EXPECT_LE(cost, previous_cost);
    }
    previous_cost = cost;
  }
  int64_t expected = 0;
  for (int b = 0; b < 4; ++b) expected += spec.qo_lens[b] * spec.problem.num_kv_heads;
  EXPECT_EQ(static_cast<int64_t>(covered.size()), expected);
  for (const auto& [key, count] : covered) EXPECT_EQ(count, 1);
}

TEST(CpuPrefillThreads, ResultIsTheSameOnOneAndTwoThreads) {
  testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {70, 20}, {90, 20});
  spec.problem.mask_mode = MaskMode::kCausal;
  spec.return_lse = true;
  testing::Case c = testing::Case::make(spec);
  AttentionArgs one = c.args();
  ASSERT_TRUE(run_cpu_prefill(spec.problem, one, 1).ok());
  const std::vector<float> out_one = c.out_f32(), lse_one = c.lse_f32();
  AttentionArgs two = c.args_with_fresh_outputs(spec.problem.o_dtype);
  ASSERT_TRUE(run_cpu_prefill(spec.problem, two, 2).ok());
  const std::vector<float> out_two = c.fresh_out_f32(), lse_two = c.fresh_lse_f32();
  ASSERT_EQ(out_one.size(), out_two.size());
  EXPECT_EQ(std::memcmp(out_one.data(), out_two.data(), out_one.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(lse_one.data(), lse_two.data(), lse_one.size() * sizeof(float)), 0);
}

// Elements apart in memory (innermost stride 2) go through the gathering loads and scattering
// stores, and give the same bits as the contiguous tensors.
TEST(CpuPrefillStrides, InnermostStrideTwoMatchesContiguous) {
  for (const KernelLevel& level : available_levels()) {
    LevelGuard guard(level);
    testing::CaseSpec spec = small_spec(Op::kSinglePrefill, {23}, {41});
    spec.problem.q_dtype = DType::kF16;
    spec.problem.kv_dtype = DType::kE5M2;
    spec.problem.o_dtype = DType::kF16;
    spec.problem.mask_mode = MaskMode::kCausal;
    testing::Case c = testing::Case::make(spec);
    AttentionArgs contiguous = c.args();
    ASSERT_TRUE(run_cpu_prefill(spec.problem, contiguous).ok());
    const std::vector<float> expected = c.out_f32();

    AttentionArgs strided = c.args_with_fresh_outputs(spec.problem.o_dtype);
    cputest::StridedCopy q = cputest::strided_copy(strided.q), k = cputest::strided_copy(strided.k),
                         v = cputest::strided_copy(strided.v),
                         out = cputest::strided_copy(strided.out);
    strided.q = q.view;
    strided.k = k.view;
    strided.v = v.view;
    strided.out = out.view;
    ASSERT_TRUE(run_cpu_prefill(spec.problem, strided).ok());
    const std::vector<float> got = testing::view_to_f32(out.view);
    ASSERT_EQ(got.size(), expected.size());
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << level.name();
  }
}

// Through the public API with backend "cpu": selection, validation, plan, workspace and run.
TEST(CpuPrefillApi, PlanAndRunThroughTheBackend) {
  for (Op op : {Op::kSinglePrefill, Op::kBatchPrefillPaged, Op::kBatchPrefillRagged}) {
    testing::CaseSpec spec =
        op == Op::kSinglePrefill ? small_spec(op, {45}, {60}) : small_spec(op, {45, 8}, {60, 8});
    spec.problem.mask_mode = MaskMode::kCausal;
    spec.return_lse = true;
    testing::Case c = testing::Case::make(spec);
    const testing::CheckResult result =
        testing::check_against_reference(c, testing::run_with_backend("cpu", 2));
    EXPECT_TRUE(result.ok) << spec.problem.to_string() << "\n" << result.message;
  }
}

// An fp8 output is refused before the cpu planner runs (validation; plan_prefill no longer
// repeats the check).
TEST(CpuPrefillPlan, RejectsAnFp8Output) {
  testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {4}, {4});
  spec.problem.o_dtype = DType::kE4M3;
  testing::Case c = testing::Case::make(spec);
  PlanOptions options;
  options.backend = "cpu";
  Plan plan;
  const Status st = kvattn::plan(spec.problem, c.args(), options, &plan);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidDType) << st.to_string();
  EXPECT_NE(st.message().find("o dtype e4m3"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace kvattn::cpu::test
