// fa2 on a GPU against the fp64 reference, with the precision-following tolerance of
// testing/tolerance.h, on the same kinds of random cases as the CPU backend: every operation,
// every mask / position-encoding variant, lengths around the tile sizes, GQA groups, layouts and
// page sizes, forced split-KV, output dtypes. Only the kernel keys this build compiled are run;
// every test skips with the reason when there is no CUDA device (never passes empty).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "cuda/fa2/capability.h"
#include "cuda/fa2/kernel_key.h"
#include "cuda/fa2/kernel_keys.h"
#include "cuda/fa2/params.h"
#include "cuda/common/case_spec.h"
#include "cuda/gpu/device_mirror.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"
#include "testing/variants.h"

namespace kvattn::fa2::test {
namespace {

class Fa2Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    std::optional<Device> d = gpu_or_reason(&why);
    if (!d) GTEST_SKIP() << why;
    device_ = *d;
  }

  std::vector<KernelKey> built_keys() const {
    return std::vector<KernelKey>(kBuiltKernelKeysStorage,
                                  kBuiltKernelKeysStorage + kBuiltKernelCount);
  }
  // This process's share of them (KVATTN_GPU_KEY_SHARD; all by default).
  std::vector<KernelKey> keys_under_test() const { return key_shard(built_keys()); }

  void expect_matches(const testing::CaseSpec& spec, const std::string& what,
                      int64_t kv_chunk_size = 0) {
    const auto t0 = std::chrono::steady_clock::now();
    testing::Case c = testing::Case::make(spec);
    testing::CheckResult r = testing::check_against_reference(c, run_fa2(device_, kv_chunk_size));
    EXPECT_TRUE(r.ok) << what << " [" << spec.problem.to_string() << "]: " << r.message;
    log_case_time(what, t0);
  }

  Device device_;
};

testing::CaseSpec spec_for(const KernelKey& key, Op op, std::vector<int64_t> qo,
                           std::vector<int64_t> kv, int qo_heads = 8, int kv_heads = 2) {
  return cuda::kernel_case_spec(key, op, std::move(qo), std::move(kv), qo_heads, kv_heads);
}

TEST_F(Fa2Gpu, EveryOperationEveryVariant) {
  const Op ops[] = {Op::kBatchPrefillPaged, Op::kBatchPrefillRagged, Op::kBatchDecode,
                    Op::kSinglePrefill, Op::kSingleDecode};
  for (const KernelKey& key : keys_under_test()) {
    for (Op op : ops) {
      // The cross-backend list (testing/variants.h), which the cpu tests run too.
      for (const testing::AttentionVariant& v : testing::attention_variants()) {
        const bool single = !is_batch(op);
        testing::CaseSpec s = single ? spec_for(key, op, {37}, {83})
                                     : spec_for(key, op, {1, 17, 64, 5}, {40, 17, 130, 300});
        v.apply(s);
        if (!testing::variant_applies(v, s.problem)) continue;
        // A variant fa2's declaration refuses (e.g. fp16 QK reduction) is not fa2's to run.
        if (!check_capability(capability(), s.problem, device_).ok()) continue;
        expect_matches(s, std::string(op_name(op)) + "/" + v.name + "/" + kernel_key_string(key));
      }
    }
  }
}

TEST_F(Fa2Gpu, LengthsAroundTheTilesAndGroups) {
  struct Heads {
    int qo, kv;
  };
  for (const KernelKey& key : keys_under_test()) {
    const int64_t keys = kv_block_keys(key.head_dim_qk);
    for (Heads h : {Heads{4, 4}, Heads{8, 2}, Heads{32, 8}, Heads{20, 4}, Heads{64, 1}}) {
      for (int64_t qo : {int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(65)}) {
        for (int64_t kv : {keys - 1, keys, keys + 1, 2 * keys + 3}) {
          for (MaskMode mask : {MaskMode::kNone, MaskMode::kCausal}) {
            testing::CaseSpec s =
                spec_for(key, Op::kBatchPrefillPaged, {qo, 1}, {std::max(kv, qo), kv}, h.qo, h.kv);
            s.problem.mask_mode = mask;
            s.return_lse = true;
            expect_matches(s, "qo=" + std::to_string(qo) + " kv=" + std::to_string(kv) +
                                  " heads=" + std::to_string(h.qo) + "/" + std::to_string(h.kv));
          }
        }
      }
    }
  }
}

TEST_F(Fa2Gpu, LayoutsPageSizesAndCombinedCaches) {
  for (const KernelKey& key : keys_under_test()) {
    for (Op op : {Op::kBatchDecode, Op::kBatchPrefillPaged}) {
      for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
        for (int page_size : {1, 16, 7}) {
          for (bool combined : {false, true}) {
            testing::CaseSpec s = spec_for(key, op, {3, 20, 1}, {50, 20, 129});
            s.problem.kv_layout = layout;
            s.problem.page_size = page_size;
            s.problem.mask_mode = MaskMode::kCausal;
            s.combined_kv_cache = combined;
            expect_matches(s, std::string(kv_layout_name(layout)) + " page " +
                                  std::to_string(page_size) + (combined ? " combined" : ""));
          }
        }
      }
    }
    // Single ops read K/V directly in either layout.
    for (Op op : {Op::kSingleDecode, Op::kSinglePrefill}) {
      testing::CaseSpec s = spec_for(key, op, {33}, {97});
      s.problem.kv_layout = KVLayout::kHND;
      expect_matches(s, std::string(op_name(op)) + " HND");
    }
  }
}

TEST_F(Fa2Gpu, SplitKVMatchesTheReference) {
  for (const KernelKey& key : keys_under_test()) {
    for (int64_t chunk : {int64_t(64), int64_t(100), int64_t(1000)}) {
      for (Op op : {Op::kBatchDecode, Op::kBatchPrefillPaged}) {
        testing::CaseSpec s = spec_for(key, op, {1, 9, 2}, {1500, 10, 0});
        s.problem.mask_mode = MaskMode::kCausal;
        s.return_lse = true;
        expect_matches(s, "chunk " + std::to_string(chunk), chunk);
      }
    }
    // Decode of one long request: fa2 decides to split by itself.
    testing::CaseSpec s = spec_for(key, Op::kBatchDecode, {1}, {20000}, 32, 8);
    s.return_lse = true;
    expect_matches(s, "long decode, planner's split");
  }
}

TEST_F(Fa2Gpu, OutputDTypesAndEmptyRows) {
  for (const KernelKey& key : keys_under_test()) {
    for (DType o : {DType::kF32, DType::kF16, DType::kBF16}) {
      testing::CaseSpec s = spec_for(key, Op::kBatchPrefillRagged, {7, 30}, {7, 12});
      s.problem.o_dtype = o;
      s.problem.mask_mode = MaskMode::kCausal;  // 30 queries over 12 keys: 18 rows see nothing
      s.return_lse = true;
      expect_matches(s, std::string("o ") + std::string(dtype_name(o)));
    }
    testing::CaseSpec s = spec_for(key, Op::kBatchPrefillPaged, {4, 3}, {0, 5});
    s.return_lse = true;
    expect_matches(s, "a request without keys");
  }
}

// Issue 11: attention sinks (final normalization and split-KV merge) and FP8 scales per head and
// per (token, head), on every operation, with masks that leave rows without a visible key.
TEST_F(Fa2Gpu, SinksAndScaleGranularities) {
  const Op ops[] = {Op::kBatchPrefillPaged, Op::kBatchPrefillRagged, Op::kBatchDecode,
                    Op::kSinglePrefill, Op::kSingleDecode};
  const KVScaleGranularity granularities[] = {KVScaleGranularity::kPerTensor,
                                              KVScaleGranularity::kPerHead,
                                              KVScaleGranularity::kPerTokenHead};
  for (const KernelKey& key : keys_under_test()) {
    for (Op op : ops) {
      for (KVScaleGranularity g : granularities) {
        if (g != KVScaleGranularity::kPerTensor && !is_fp8(key.kv)) continue;
        for (bool sinks : {false, true}) {
          for (int64_t chunk : {int64_t(0), int64_t(64)}) {
            const bool single = !is_batch(op);
            testing::CaseSpec s = single ? spec_for(key, op, {37}, {23})
                                         : spec_for(key, op, {1, 17, 40, 5}, {40, 17, 130, 0});
            s.problem.use_sinks = sinks;
            s.problem.kv_scale_granularity = g;
            if (g != KVScaleGranularity::kPerTensor) s.scalars.k_scale = s.scalars.v_scale = 1.0f;
            s.problem.mask_mode = MaskMode::kCausal;  // prefill rows past the keys see nothing
            s.return_lse = true;
            for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
              if (op == Op::kBatchPrefillRagged && layout == KVLayout::kHND) continue;
              s.problem.kv_layout = layout;
              expect_matches(s,
                             std::string(op_name(op)) + "/" +
                                 std::string(kv_scale_granularity_name(g)) +
                                 (sinks ? "/sinks" : "") + "/" + kernel_key_string(key),
                             chunk);
            }
          }
        }
      }
    }
  }
}

// Issue 13: run on a caller's stream, captured in a CUDA graph and replayed, gives the same
// (correct) result as a direct run: decode split over chunks (attention + merge launches) and
// a causal prefill.
TEST_F(Fa2Gpu, RunCapturedInACudaGraphMatchesTheReference) {
  for (const KernelKey& key : keys_under_test()) {
    const testing::CaseSpec decode = spec_for(key, Op::kBatchDecode, {1, 1, 1}, {1000, 7, 300});
    testing::Case d = testing::Case::make(decode);
    testing::CheckResult r = testing::check_against_reference(d, run_fa2_graph(device_, 256));
    EXPECT_TRUE(r.ok) << "split decode as a graph [" << decode.problem.to_string()
                      << "]: " << r.message;
    testing::CaseSpec prefill = spec_for(key, Op::kBatchPrefillPaged, {77, 130}, {200, 130});
    prefill.problem.mask_mode = MaskMode::kCausal;
    prefill.return_lse = true;
    testing::Case c = testing::Case::make(prefill);
    r = testing::check_against_reference(c, run_fa2_graph(device_));
    EXPECT_TRUE(r.ok) << "causal prefill as a graph [" << prefill.problem.to_string()
                      << "]: " << r.message;
  }
}

TEST_F(Fa2Gpu, AKernelOutsideThisBuildIsReportedNotRun) {
  for (const KernelKey& key : kFullKernelKeys) {
    bool built = false;
    for (const KernelKey& b : built_keys()) built = built || b == key;
    if (built) continue;
    testing::CaseSpec s = spec_for(key, Op::kBatchDecode, {1}, {10});
    testing::Case c = testing::Case::make(s);
    DeviceMirror mirror;
    AttentionArgs args = mirror_args(s.problem, c.args(), &mirror);
    PlanOptions options;
    options.backend = "fa2";
    options.device = device_;
    Plan plan;
    Status st = kvattn::plan(s.problem, args, options, &plan);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(kernel_key_string(key)), std::string::npos) << st.message();
    return;  // one is enough
  }
  // Every declared kernel is built (KVATTN_CUDA_FULL_KERNELS): nothing to refuse, and the built
  // list must then be the whole declared list (a skip here would fail the GPU bundle's step).
  EXPECT_EQ(built_keys().size(), std::size(kFullKernelKeys));
}

}  // namespace
}  // namespace kvattn::fa2::test
