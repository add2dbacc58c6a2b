// The cpu decode kernels against the reference over random problems (every variant, dtype pair,
// head-dim pair, layout and page size, lengths around the tile size), at every ISA level this
// machine has; long contexts that split; bit-identical results across batch compositions.
#include "cpu/decode/decode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cpu/decode/decode_prefetch.h"
#include "cpu_test_util.h"
#include "decode_test_util.h"

namespace kvattn::cputest {

// A random decode problem; `i` cycles through the enumerations so that every value of each
// appears within a few dozen problems whatever the random draws.
testing::CaseSpec random_decode_spec(int i, std::mt19937& rng) {
  using testing::CaseSpec;
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  CaseSpec spec;
  Problem& p = spec.problem;
  p.op = i % 3 == 0 ? Op::kSingleDecode : Op::kBatchDecode;
  p.batch_size = p.op == Op::kSingleDecode ? 1 : 1 + pick(4);
  p.num_kv_heads = 1 + pick(3);
  const int groups[] = {1, 2, 3, 4, 5, 8};
  p.num_qo_heads = p.num_kv_heads * groups[i % 6];
  const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}, {40, 40}, {72, 24}};
  p.head_dim_qk = dims[(i / 2) % 6][0];
  p.head_dim_vo = dims[(i / 2) % 6][1];
  const int page_sizes[] = {1, 16, 5};
  p.page_size = page_sizes[i % 3];
  p.kv_layout = (i / 3) % 2 ? KVLayout::kHND : KVLayout::kNHD;
  const DType kv_types[] = {DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2, DType::kF32};
  const DType q_types[] = {DType::kBF16, DType::kF16, DType::kF32};
  const DType o_types[] = {DType::kBF16, DType::kF32, DType::kF16};
  p.kv_dtype = kv_types[i % 5];
  p.q_dtype = q_types[(i / 5) % 3];
  p.o_dtype = o_types[(i / 7) % 3];
  spec.return_lse = pick(2) == 0;
  if (is_fp8(p.kv_dtype)) {
    spec.scalars.k_scale = 0.5f + pick(4) * 0.25f;
    spec.scalars.v_scale = 0.25f + pick(4) * 0.5f;
  }
  // Variants, one or two at a time.
  switch (i % 8) {
    case 1:
      p.logits_soft_cap = 5.0f + pick(20);
      break;
    case 2:
      p.pos_encoding_mode = PosEncoding::kAlibi;
      break;
    case 3:
      p.pos_encoding_mode = PosEncoding::kRopeLlama;
      p.rope_interleave = pick(2) == 0;
      p.rope_scale = pick(2) ? 1.0f : 2.0f;
      break;
    case 4:
      p.window_left = pick(80);
      break;
    case 5:
      p.mask_mode = MaskMode::kCustom;
      spec.packed_custom_mask = pick(2) == 0;
      break;
    case 6:
      p.mask_mode = MaskMode::kCausal;
      p.sm_scale = 0.3f;
      break;
    case 7:
      p.logits_soft_cap = 30.0f;
      p.pos_encoding_mode = PosEncoding::kAlibi;
      p.use_fp16_qk_reduction = true;
      break;
    default:
      break;
  }
  const int64_t lengths[] = {1,         kTile - 1,     kTile,         kTile + 1, 2 * kTile - 1,
                             2 * kTile, 2 * kTile + 1, 3 * kTile + 7, 0};
  for (int b = 0; b < p.batch_size; ++b) {
    int64_t len = lengths[(i + 3 * b) % 9];
    if (p.op == Op::kSingleDecode && len == 0) len = 17;
    spec.kv_lens.push_back(len);
  }
  // A custom mask of zero bits in all: testing::Case copies it from a null buffer (UBSan).
  if (p.mask_mode == MaskMode::kCustom && spec.kv_lens.back() == 0) spec.kv_lens.back() = 9;
  spec.seed = 1000 + i;
  spec.combined_kv_cache = i % 4 == 1;
  return spec;
}

namespace {

using testing::Case;
using testing::CaseSpec;

class CpuDecodeGrid : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(CpuDecodeGrid, MatchesTheReferenceOnRandomProblems) {
  std::mt19937 rng(42);
  constexpr int kProblems = 72;
  for (int i = 0; i < kProblems; ++i) {
    const CaseSpec spec = random_decode_spec(i, rng);
    expect_matches_reference(spec, GetParam());
    // Every fourth problem again with a forced split in small chunks (merge path).
    if (i % 4 == 0) expect_matches_reference(spec, GetParam(), {.kv_chunk_size = kTile});
  }
}

constexpr DType kFp8Types[] = {DType::kE4M3, DType::kE5M2};
constexpr DType kBf16Type[] = {DType::kBF16};

void check_table_grid(const cpu::CpuKernel& kernel, std::span<const DType> kv_types);

TEST(CpuDecodeFp8Table, FmaTilesMatchTheReferenceOnFp8Caches) {
  std::string why;
  const cpu::CpuKernel* k = runnable(kFp8TableFma, &why);
  if (k == nullptr) GTEST_SKIP() << why;
  check_table_grid(*k, kFp8Types);
}

TEST(CpuDecodeBf16Dot, MatchesTheReferenceOnFp8Caches) {
  std::string why;
  const cpu::CpuKernel* k = runnable(kFp8TableDot, &why);
  if (k == nullptr) GTEST_SKIP() << why;
  check_table_grid(*k, kFp8Types);
}

TEST(CpuDecodeBf16Dot, MatchesTheReferenceOnBf16Caches) {
  std::string why;
  const cpu::CpuKernel* k = runnable(kBf16Dot, &why);
  if (k == nullptr) GTEST_SKIP() << why;
  check_table_grid(*k, kBf16Type);
}

TEST(CpuDecodeAmx, MatchesTheReferenceOnFp8Caches) {
  std::string why;
  const cpu::CpuKernel* k = runnable(kFp8Amx, &why);
  if (k == nullptr) GTEST_SKIP() << why;
  check_table_grid(*k, kFp8Types);
}

TEST(CpuDecodeAmx, EmulatedTilesMatchTheReferenceOnFp8Caches) {
  std::string why;
  const cpu::CpuKernel* k = runnable(kFp8AmxEmulated, &why);
  if (k == nullptr) GTEST_SKIP() << why;
  check_table_grid(*k, kFp8Types);
}

void check_table_grid(const cpu::CpuKernel& kernel, std::span<const DType> kv_types) {
  KernelOverride named(kernel.name);
  const int64_t lengths[] = {1, kTile - 1, kTile, kTile + 1, 2 * kTile + 1, 3 * kTile + 7, 0};
  const int groups[] = {1, 2, 4, 8, 16, 3};
  int i = 0;
  for (DType kv : kv_types) {
    for (int d : {64, 128, 256}) {
      for (int variant = 0; variant < 8; ++variant, ++i) {
        CaseSpec spec;
        Problem& p = spec.problem;
        p.op = i % 3 == 0 ? Op::kSingleDecode : Op::kBatchDecode;
        p.batch_size = p.op == Op::kSingleDecode ? 1 : 3;
        p.num_kv_heads = 1 + i % 3;
        p.num_qo_heads = p.num_kv_heads * groups[i % 6];
        p.head_dim_qk = p.head_dim_vo = d;
        p.page_size = i % 2 ? 16 : 5;
        p.kv_layout = (i / 2) % 2 ? KVLayout::kHND : KVLayout::kNHD;
        p.q_dtype = DType::kBF16;
        p.kv_dtype = kv;
        p.o_dtype = i % 3 == 1 ? DType::kF32 : DType::kBF16;
        spec.scalars.k_scale = 0.75f;
        spec.scalars.v_scale = 1.5f;
        // q stays exact bf16 for the dot products; q_scale folds into the score scale.
        spec.scalars.q_scale = variant % 2 ? 1.25f : 1.0f;
        spec.return_lse = true;
        switch (variant) {
          case 1:
            p.logits_soft_cap = 8.0f;
            break;
          case 2:
            p.pos_encoding_mode = PosEncoding::kAlibi;
            break;
          case 3:
            p.window_left = 40;
            break;
          case 4:
            p.use_sinks = true;
            break;
          case 5:  // scale granularities are for FP8 caches; bf16: pages of one token
            if (is_fp8(kv)) {
              p.kv_scale_granularity = KVScaleGranularity::kPerHead;
              spec.scalars.k_scale = spec.scalars.v_scale = 1.0f;
            } else {
              p.page_size = 1;
            }
            break;
          case 6:
            if (is_fp8(kv)) {
              p.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
              spec.scalars.k_scale = spec.scalars.v_scale = 1.0f;
            } else {
              p.o_dtype = DType::kF16;
            }
            break;
          case 7:
            p.sm_scale = 0.3f;
            break;
          default:
            break;
        }
        for (int b = 0; b < p.batch_size; ++b) {
          int64_t len = lengths[(i + 2 * b) % 7];
          if (p.op == Op::kSingleDecode && len == 0) len = 33;
          spec.kv_lens.push_back(len);
        }
        spec.seed = 500 + i;
        if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead &&
            !kernel.applies(p).ok()) {
          // The AMX FP8 kernel leaves per-token scales to the others (kernel_table.cc: the scale
          // would be rounded into its bf16 weights; the dot-product kernel splits them in two).
          EXPECT_NE(kernel.applies(p).message().find("per-head scales"), std::string::npos);
          continue;
        }
        ASSERT_TRUE(kernel.applies(p).ok()) << p.to_string();
        const cpu::CpuKernel* chosen = nullptr;
        ASSERT_TRUE(cpu::choose_cpu_kernel(p, detail::effective_cpu_isa(), &chosen).ok());
        ASSERT_EQ(chosen, &kernel) << p.to_string();
        expect_matches_reference(spec, CpuIsa::kAvx512);
        if (i % 3 == 0) expect_matches_reference(spec, CpuIsa::kAvx512, {.kv_chunk_size = kTile});
      }
    }
  }
}

// Where the table kernels do not apply, the fp32-FMA kernels (f16 widening) run them (the
// rules: tests/cpu/kernel_table_test.cc); named, the fp32-FMA kernels run FP8 caches too (the
// random grid, FP8 only).
TEST(CpuDecodeFp8Table, FmaKernelsRunFp8CachesWhenNamed) {
  std::string why;
  const cpu::CpuKernel* k = runnable(kFma512, &why);
  if (k == nullptr) GTEST_SKIP() << why;
  KernelOverride named(kFma512);
  std::mt19937 rng(42);
  for (int i = 0; i < 72; ++i) {
    const CaseSpec spec = random_decode_spec(i, rng);
    if (is_fp8(spec.problem.kv_dtype)) expect_matches_reference(spec, CpuIsa::kAvx512);
  }
}

// The comparison these tests rely on notices a small error in one element of a kernel's output.
// Queries and outputs whose elements lie apart (innermost stride 2: the element-wise loads and
// stores) give the same bits as contiguous ones (the vector row conversions), at every ISA level,
// for each query dtype the kernels convert (an e4m3 q through the vector loads' NaN handling).
TEST(CpuDecodeStrides, QueriesAndOutputsOfInnermostStrideTwoMatchContiguous) {
  const DType q_types[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kE4M3};
  const DType o_types[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kBF16};
  for (CpuIsa isa : isa_levels()) {
    for (int i = 0; i < 4; ++i) {
      CaseSpec spec;
      Problem& p = spec.problem;
      p.op = Op::kBatchDecode;
      p.batch_size = 2;
      p.num_qo_heads = 8;
      p.num_kv_heads = 2;
      p.head_dim_qk = p.head_dim_vo = i == 2 ? 72 : 128;  // 72: vector tails
      p.page_size = 16;
      p.q_dtype = q_types[i];
      p.kv_dtype = q_types[i] == DType::kE4M3 ? DType::kE4M3 : DType::kBF16;
      p.o_dtype = o_types[i];
      spec.return_lse = true;
      spec.kv_lens = {kTile + 1, 70};
      spec.seed = 90 + i;
      expect_matches_reference(spec, isa);

      IsaLimit limit(isa);
      Case c = Case::make(spec);
      AttentionArgs contiguous = c.args();
      ASSERT_TRUE(run_cpu()(p, contiguous).ok());
      const std::vector<float> expected = c.out_f32();
      AttentionArgs strided = c.args_with_fresh_outputs(p.o_dtype);
      StridedCopy q = strided_copy(strided.q), out = strided_copy(strided.out);
      strided.q = q.view;
      strided.out = out.view;
      ASSERT_TRUE(run_cpu()(p, strided).ok());
      const std::vector<float> got = testing::view_to_f32(out.view);
      ASSERT_EQ(got.size(), expected.size());
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
          << "isa " << cpu_isa_name(isa) << ": " << p.to_string();
    }
  }
}

TEST(CpuDecodeHarness, AnErrorOfOnePercentInOneElementFails) {
  std::mt19937 rng(7);
  CaseSpec spec = random_decode_spec(1, rng);
  spec.problem.o_dtype = DType::kF32;
  Case c = Case::make(spec);
  const testing::RunBackend corrupt = [](const Problem& problem, const AttentionArgs& args) {
    Status s = run_cpu()(problem, args);
    args.out.as<float>()[3] *= 1.01f;
    return s;
  };
  EXPECT_FALSE(testing::check_against_reference(c, corrupt).ok);
  EXPECT_TRUE(testing::check_against_reference(c, run_cpu()).ok);
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuDecodeGrid, ::testing::ValuesIn(isa_levels()),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

// Long contexts: the automatic split at batch 1 and a forced split, at the best level and scalar.
TEST(CpuDecodeLong, SplitKvAt32kMatchesTheReference) {
  CaseSpec spec;
  spec.problem.op = Op::kBatchDecode;
  spec.problem.batch_size = 1;
  spec.problem.num_qo_heads = 8;
  spec.problem.num_kv_heads = 2;
  spec.problem.page_size = 16;
  spec.problem.kv_dtype = DType::kE4M3;
  spec.scalars.k_scale = 0.5f;
  spec.return_lse = true;
  spec.kv_lens = {32768};
  for (CpuIsa isa : isa_levels()) {
    if (isa == CpuIsa::kAvx2) continue;  // the same code path as avx512 at another width
    expect_matches_reference(spec, isa);
    expect_matches_reference(spec, isa, {.num_threads = 2, .kv_chunk_size = 4096});
  }
  Problem& p = spec.problem;
  p.kv_dtype = DType::kBF16;
  p.kv_layout = KVLayout::kHND;
  p.window_left = 20000;
  expect_matches_reference(spec, isa_levels().back());
}

TEST(CpuDecodePlan, SplitsLongRequestsAtBatchOneAndNotLargeBatches) {
  for (int batch : {1, 64}) {
    CaseSpec spec;
    spec.problem.op = Op::kBatchDecode;
    spec.problem.batch_size = batch;
    spec.problem.num_qo_heads = 8;
    spec.problem.num_kv_heads = 8;
    spec.problem.head_dim_qk = spec.problem.head_dim_vo = 64;
    spec.kv_lens.assign(batch, batch == 1 ? 8192 : 512);
    Case c = Case::make(spec);
    PlanOptions options;
    options.backend = "cpu";
    options.num_threads = 2;
    Plan plan;
    ASSERT_TRUE(kvattn::plan(spec.problem, c.args(), options, &plan).ok());
    if (batch == 1) {
      EXPECT_GT(plan.kv_chunk_size, 0);
      EXPECT_GE(static_cast<int64_t>(plan.work.size()), 16);
      EXPECT_GT(plan.num_partial_states, 0);
    } else {
      EXPECT_EQ(plan.kv_chunk_size, 0);
      EXPECT_EQ(static_cast<int64_t>(plan.work.size()), 64 * 8);
    }
  }
}

// With a fixed chunk size a request's output does not depend on what else is in the batch nor on
// the thread count: request 1 alone (same cache, a page table of its own) gives the same bits.
TEST(CpuDecodeDeterminism, FixedChunkGivesTheSameBitsWhateverTheBatch) {
  CaseSpec spec;
  Problem& p = spec.problem;
  p.op = Op::kBatchDecode;
  p.batch_size = 3;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.page_size = 16;
  p.kv_dtype = DType::kBF16;
  p.o_dtype = DType::kF32;
  spec.return_lse = true;
  spec.kv_lens = {300, 1000, 77};
  Case c = Case::make(spec);
  for (CpuIsa isa : isa_levels()) {
    IsaLimit limit(isa);
    AttentionArgs all = c.args();
    PlanOptions options;
    options.backend = "cpu";
    options.kv_chunk_size = 128;
    options.num_threads = 2;
    ASSERT_TRUE(kvattn::run(p, all, options).ok());
    const std::vector<float> out_all = c.out_f32(), lse_all = c.lse_f32();

    // Request 1 alone: its row of q, its pages.
    Problem alone = p;
    alone.batch_size = 1;
    const int64_t row = int64_t{p.num_qo_heads} * p.head_dim_qk;
    std::vector<int32_t> indptr = {0, c.kv_indptr[2] - c.kv_indptr[1]};
    std::vector<int32_t> indices(c.kv_indices.begin() + c.kv_indptr[1],
                                 c.kv_indices.begin() + c.kv_indptr[2]);
    std::vector<int32_t> last = {c.kv_last_page_len[1]};
    std::vector<float> out(int64_t{p.num_qo_heads} * p.head_dim_vo), lse(p.num_qo_heads);
    AttentionArgs one = all;
    one.q =
        TensorView::contiguous(static_cast<std::byte*>(all.q.data) + row * dtype_size(p.q_dtype),
                               p.q_dtype, {1, p.num_qo_heads, p.head_dim_qk});
    one.kv_indptr = TensorView::contiguous(indptr.data(), DType::kI32, {2});
    one.kv_indices =
        TensorView::contiguous(indices.data(), DType::kI32, {static_cast<int64_t>(indices.size())});
    one.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {1});
    one.out = TensorView::contiguous(out.data(), DType::kF32, {1, p.num_qo_heads, p.head_dim_vo});
    one.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, p.num_qo_heads});
    options.num_threads = 1;
    ASSERT_TRUE(kvattn::run(alone, one, options).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), out_all.data() + out.size(), out.size() * sizeof(float)))
        << "isa " << cpu_isa_name(isa);
    EXPECT_EQ(0, std::memcmp(lse.data(), lse_all.data() + lse.size(), lse.size() * sizeof(float)))
        << "isa " << cpu_isa_name(isa);
  }
}

// With a fixed kv_chunk_size the bits do not depend on the thread count either (1 to 4 threads,
// the same batch), at every ISA level; for a 16-bit and an FP8 cache.
TEST(CpuDecodeDeterminism, FixedChunkGivesTheSameBitsWhateverTheThreadCount) {
  for (DType kv : {DType::kBF16, DType::kE4M3}) {
    CaseSpec spec;
    Problem& p = spec.problem;
    p.op = Op::kBatchDecode;
    p.batch_size = 3;
    p.num_qo_heads = 8;
    p.num_kv_heads = 2;
    p.page_size = 16;
    p.kv_dtype = kv;
    p.o_dtype = DType::kF32;
    spec.return_lse = true;
    spec.kv_lens = {300, 1000, 77};
    Case c = Case::make(spec);
    for (CpuIsa isa : isa_levels()) {
      IsaLimit limit(isa);
      std::vector<float> first_out, first_lse;
      for (int threads = 1; threads <= 4; ++threads) {
        PlanOptions options;
        options.backend = "cpu";
        options.kv_chunk_size = 128;
        options.num_threads = threads;
        ASSERT_TRUE(kvattn::run(p, c.args(), options).ok());
        if (threads == 1) {
          first_out = c.out_f32();
          first_lse = c.lse_f32();
          continue;
        }
        const std::vector<float> out = c.out_f32(), lse = c.lse_f32();
        EXPECT_EQ(0, std::memcmp(out.data(), first_out.data(), out.size() * sizeof(float)))
            << dtype_name(kv) << ", isa " << cpu_isa_name(isa) << ", " << threads << " threads";
        EXPECT_EQ(0, std::memcmp(lse.data(), first_lse.data(), lse.size() * sizeof(float)))
            << dtype_name(kv) << ", isa " << cpu_isa_name(isa) << ", " << threads << " threads";
      }
    }
  }
}

}  // namespace
}  // namespace kvattn::cputest

// The paced prefetch of the next tile (decode_prefetch.h) asks for every line of its streams
// once, whatever the hint and however the head steps split the ticks: a line it forgot would be
// read at DRAM latency by the tile that needs it (every line counts: prefetching every second
// line only took 1.5-1.9x the time on Zen 4).
TEST(CpuDecodePrefetch, EveryLineOfTheNextTileIsAskedForOnce) {
  using kvattn::cpu::decode_detail::PrefetchHint;
  using kvattn::cpu::decode_detail::TilePrefetcher;
  alignas(64) static std::byte buffer[64 * 64];
  for (const PrefetchHint hint : {PrefetchHint::kL2, PrefetchHint::kL1}) {
    for (const int steps : {1, 3, 8}) {
      for (const int calls : {0, 1, 7, 64}) {
        TilePrefetcher prefetch(hint);
        prefetch.reset();
        // Unmerged (a byte after the first stream's end): the same lines, walked as two streams.
        const bool merge = calls % 2 == 0;
        prefetch.add(buffer, 640);                        // 10 lines
        prefetch.add(buffer + (merge ? 640 : 641), 100);  // lines 10 and 11: 12 lines in all
        prefetch.add(buffer + 1000 + 5, 200);    // unaligned: lines 15..18
        prefetch.add(buffer + 4000, 60);         // line 62 and 63
        prefetch.seal();
        ASSERT_EQ(prefetch.total_lines(), 12 + 4 + 2);
        ASSERT_EQ(prefetch.stream_count(), merge ? 3 : 4);
        for (int step = 0; step < steps; ++step) {
          prefetch.begin_step(step, steps, calls);
          for (int c = 0; c < calls; ++c) prefetch.tick();
          // Never more than the steps so far may ask for.
          EXPECT_LE(prefetch.issued_lines(), prefetch.total_lines() * (step + 1) / steps);
          prefetch.finish_step();
        }
        EXPECT_EQ(prefetch.issued_lines(), prefetch.total_lines())
            << "steps " << steps << ", calls " << calls;
        // A step past the last asks for nothing more (its share is capped at the plan's lines:
        // the walk has no per-line bound, and would not stop).
        prefetch.begin_step(steps, steps, 1);
        prefetch.tick();
        prefetch.finish_step();
        EXPECT_EQ(prefetch.issued_lines(), prefetch.total_lines());
      }
    }
  }
}
