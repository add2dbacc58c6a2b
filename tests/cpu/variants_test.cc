// The cpu backend against the reference on the variants of issue 11: attention sinks, FP8 K/V
// scales per head and per (token, head), head dims 96 and 512, for every operation, at every ISA
// level this machine has; decode also split over KV chunks (the sink joins once, at the merge).
// The cross-backend variant list (testing/variants.h) runs on the cpu backend in the conformance
// suite (tests/conformance) and on every cpu kernel of every level in
// CpuKernelTable.EveryRunnableKernelOnTheVariantGrid.
#include <gtest/gtest.h>

#include <random>

#include "cpu/decode/decode.h"
#include "cpu_test_util.h"

namespace kvattn::cputest {
namespace {

using testing::CaseSpec;

// Problem i of the grid: cycles through op, granularity, sinks and head dims so that every
// combination of two of them appears within a few dozen problems.
CaseSpec variant_spec(int i, std::mt19937& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  CaseSpec spec;
  spec.seed = 1000 + i;
  Problem& p = spec.problem;
  const Op ops[] = {Op::kSingleDecode, Op::kBatchDecode, Op::kSinglePrefill, Op::kBatchPrefillPaged,
                    Op::kBatchPrefillRagged};
  p.op = ops[i % 5];
  p.batch_size = is_batch(p.op) ? 1 + pick(3) : 1;
  p.num_kv_heads = 1 + pick(2);
  p.num_qo_heads = p.num_kv_heads * (1 + pick(4));
  const int dims[][2] = {{96, 96}, {128, 128}, {512, 512}, {64, 64}, {40, 24}};
  p.head_dim_qk = dims[(i / 3) % 5][0];
  p.head_dim_vo = dims[(i / 3) % 5][1];
  p.page_size = (i / 2) % 2 ? 16 : 5;
  p.kv_layout = (i / 4) % 2 ? KVLayout::kHND : KVLayout::kNHD;
  const KVScaleGranularity granularities[] = {KVScaleGranularity::kPerTokenHead,
                                              KVScaleGranularity::kPerHead,
                                              KVScaleGranularity::kPerTensor};
  p.kv_scale_granularity = granularities[(i / 5) % 3];
  p.use_sinks = (i / 2) % 3 != 2;
  p.kv_dtype = (i / 7) % 2 ? DType::kE5M2 : DType::kE4M3;
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTensor) {
    if (i % 4 == 0) p.kv_dtype = DType::kBF16;
    spec.scalars.k_scale = 0.75f;
    spec.scalars.v_scale = 1.5f;
  }
  p.q_dtype = (i / 11) % 2 ? DType::kF16 : DType::kBF16;
  p.o_dtype = (i / 13) % 2 ? DType::kF32 : DType::kBF16;
  spec.return_lse = true;
  if (!is_decode(p.op) && i % 3 == 0) p.mask_mode = MaskMode::kCausal;
  if (i % 7 == 3) p.window_left = pick(20);
  if (i % 9 == 4) p.logits_soft_cap = 8.0f;
  const int64_t lens[] = {1, 31, 33, 70, 130};
  for (int b = 0; b < (is_batch(p.op) ? p.batch_size : 1); ++b) {
    spec.kv_lens.push_back(lens[(i + b) % 5]);
    // Prefill: more queries than keys sometimes, so that causal rows see no key at all.
    if (!is_decode(p.op))
      spec.qo_lens.push_back(1 + pick(static_cast<int>(spec.kv_lens.back()) + 3));
  }
  return spec;
}

TEST(CpuVariants, MatchReferenceOnTheGrid) {
  for (CpuIsa isa : isa_levels()) {
    std::mt19937 rng(11);
    for (int i = 0; i < 60; ++i) expect_matches_reference(variant_spec(i, rng), isa);
  }
}

TEST(CpuVariants, SplitDecodeAddsTheSinkOnceAtTheMerge) {
  for (CpuIsa isa : isa_levels()) {
    for (KVScaleGranularity g :
         {KVScaleGranularity::kPerTensor, KVScaleGranularity::kPerTokenHead}) {
      CaseSpec spec;
      Problem& p = spec.problem;
      p.op = Op::kBatchDecode;
      p.batch_size = 3;
      p.num_qo_heads = 8;
      p.num_kv_heads = 2;
      p.head_dim_qk = p.head_dim_vo = 96;
      p.kv_dtype = DType::kE4M3;
      p.kv_scale_granularity = g;
      p.use_sinks = true;
      spec.return_lse = true;
      p.window_left = 40;  // request 2's first chunks see no key: their partials are empty
      spec.kv_lens = {300, 97, 260};
      expect_matches_reference(spec, isa, {.num_threads = 2, .kv_chunk_size = 64});
    }
  }
}

TEST(CpuVariants, SinkOnRowsWithNoVisibleKey) {
  // Causal prefill with more queries than keys: the first rows see nothing (o = 0, lse = sink).
  for (Op op : {Op::kSinglePrefill, Op::kBatchPrefillPaged, Op::kBatchPrefillRagged}) {
    CaseSpec spec;
    Problem& p = spec.problem;
    p.op = op;
    p.batch_size = 1;
    p.num_qo_heads = 4;
    p.num_kv_heads = 1;
    p.head_dim_qk = p.head_dim_vo = 96;
    p.mask_mode = MaskMode::kCausal;
    p.use_sinks = true;
    spec.return_lse = true;
    spec.kv_lens = {3};
    spec.qo_lens = {9};
    for (CpuIsa isa : isa_levels()) expect_matches_reference(spec, isa);
  }
}

}  // namespace
}  // namespace kvattn::cputest
