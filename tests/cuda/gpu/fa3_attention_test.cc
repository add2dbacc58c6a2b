// fa3 on an SM90 GPU against the fp64 reference, with the precision-following tolerance of
// testing/tolerance.h, on the grids fa2's GPU tests use for what fa3's kernels cover: batch
// prefill over paged and ragged KV and single prefill, batch and single decode (GQA rows packed),
// no mask and causal, sliding window, soft cap, LSE, lengths around the 128-row / 128-key (64 at
// d256) tiles, GQA groups, layouts and page sizes, output dtypes, rows that see no key, and
// split-KV (forced chunks and the planner's own) with its merge. Only the kernel keys this build
// compiled are run; every test skips with the reason when there is no SM90 device (never passes
// empty).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "cuda/fa3/kernel_keys.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/gpu/device_mirror.h"
#include "cuda/common/case_spec.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::fa3::test {
namespace {

using fa2::test::DeviceMirror;
using fa2::test::gpu_or_reason;
using fa2::test::key_shard;
using fa2::test::log_case_time;
using fa2::test::mirror_args;
using fa2::test::run_backend;

class Fa3Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kBuiltKernelCount == 0) GTEST_SKIP() << "fa3's kernels are not built here";
    std::string why;
    std::optional<Device> d = gpu_or_reason(&why, 90, 90);
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
    testing::CheckResult r = testing::check_against_reference(c, run_backend("fa3", device_, kv_chunk_size));
    EXPECT_TRUE(r.ok) << what << " [" << spec.problem.to_string() << "]: " << r.message;
    log_case_time(what, t0);
  }

  Device device_;
};

testing::CaseSpec spec_for(const KernelKey& key, Op op, std::vector<int64_t> qo,
                           std::vector<int64_t> kv, int qo_heads = 8, int kv_heads = 2) {
  return cuda::kernel_case_spec(key, op, std::move(qo), std::move(kv), qo_heads, kv_heads);
}

TEST_F(Fa3Gpu, EveryPrefillOperationMaskAndLse) {
  for (const KernelKey& key : keys_under_test()) {
    for (Op op : {Op::kBatchPrefillPaged, Op::kBatchPrefillRagged, Op::kSinglePrefill}) {
      for (MaskMode mask : {MaskMode::kNone, MaskMode::kCausal}) {
        for (bool lse : {false, true}) {
          const bool single = !is_batch(op);
          testing::CaseSpec s = single ? spec_for(key, op, {137}, {283})
                                       : spec_for(key, op, {1, 17, 130, 5}, {40, 17, 300, 300});
          s.problem.mask_mode = mask;
          s.return_lse = lse;
          if (lse) s.problem.sm_scale = 0.3f;
          expect_matches(s, std::string(op_name(op)) +
                                (mask == MaskMode::kCausal ? "/causal" : "") + (lse ? "/lse" : "") +
                                "/" + kernel_key_string(key));
        }
      }
    }
  }
}

TEST_F(Fa3Gpu, SlidingWindowAndSoftCap) {
  for (const KernelKey& key : keys_under_test()) {
    for (Op op : {Op::kBatchPrefillPaged, Op::kBatchPrefillRagged}) {
      for (int window : {0, 9, 127, 200}) {
        for (bool causal : {false, true}) {
          testing::CaseSpec s = spec_for(key, op, {1, 17, 300, 129}, {40, 17, 300, 700});
          s.problem.window_left = window;
          s.problem.mask_mode = causal ? MaskMode::kCausal : MaskMode::kNone;
          s.return_lse = true;
          expect_matches(s, std::string(op_name(op)) + " window " + std::to_string(window) +
                                (causal ? " causal" : ""));
        }
      }
      if (is_fp8(key.q)) continue;  // no soft cap with FP8 (fa3's declaration)
      testing::CaseSpec s = spec_for(key, op, {5, 260}, {300, 260});
      s.problem.logits_soft_cap = 0.5f;
      s.value_range = 2.0f;
      s.problem.mask_mode = MaskMode::kCausal;
      s.problem.window_left = 30;
      s.return_lse = true;
      expect_matches(s, std::string(op_name(op)) + " soft cap + window");
    }
  }
}

TEST_F(Fa3Gpu, LengthsAroundTheTilesAndGroups) {
  struct Heads {
    int qo, kv;
  };
  const int64_t m = sched::kBlockM;
  for (const KernelKey& key : keys_under_test()) {
    const int64_t n =
        tile_shape(key.head_dim_qk, key.head_dim_vo, is_fp8(key.kv) ? 1 : 2).block_n;
    for (Heads h : {Heads{4, 4}, Heads{8, 2}, Heads{32, 8}, Heads{20, 4}}) {
      for (int64_t qo : {int64_t(1), m - 1, m, m + 1, 2 * m + 5}) {
        for (int64_t kv : {n - 1, n, n + 1, 2 * n + 3}) {
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

TEST_F(Fa3Gpu, LayoutsPageSizesAndCombinedCaches) {
  for (const KernelKey& key : keys_under_test()) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (int page_size : {1, 16, 7}) {
        for (bool combined : {false, true}) {
          testing::CaseSpec s = spec_for(key, Op::kBatchPrefillPaged, {3, 200, 1}, {50, 200, 129});
          s.problem.kv_layout = layout;
          s.problem.page_size = page_size;
          s.problem.mask_mode = MaskMode::kCausal;
          s.combined_kv_cache = combined;
          expect_matches(s, std::string(kv_layout_name(layout)) + " page " +
                                std::to_string(page_size) + (combined ? " combined" : ""));
        }
      }
    }
    testing::CaseSpec s = spec_for(key, Op::kSinglePrefill, {133}, {297});
    s.problem.kv_layout = KVLayout::kHND;
    expect_matches(s, "single prefill HND");
  }
}

TEST_F(Fa3Gpu, OutputDTypesEmptyRowsAndManyTiles) {
  for (const KernelKey& key : keys_under_test()) {
    for (DType o : {DType::kF32, DType::kF16, DType::kBF16}) {
      testing::CaseSpec s = spec_for(key, Op::kBatchPrefillRagged, {7, 300}, {7, 12});
      s.problem.o_dtype = o;
      s.problem.mask_mode = MaskMode::kCausal;  // 300 queries over 12 keys: 288 rows see nothing
      s.return_lse = true;
      expect_matches(s, std::string("o ") + std::string(dtype_name(o)));
    }
    testing::CaseSpec s = spec_for(key, Op::kBatchPrefillPaged, {4, 3}, {0, 5});
    s.return_lse = true;
    expect_matches(s, "a request without keys");
    // More tiles than SMs: every persistent CTA walks several tiles of the longest-first list.
    testing::CaseSpec big =
        spec_for(key, Op::kBatchPrefillRagged, {2048, 700, 1}, {2048, 900, 5}, 32, 8);
    big.problem.mask_mode = MaskMode::kCausal;
    big.return_lse = true;
    expect_matches(big, "many tiles");
  }
}

// Decode packs the query rows of a GQA group into one tile: groups of 1 (no packing gain), 4, 5
// (rows of a token straddle no 64-row boundary evenly), 8 and 16, lengths around the K/V block.
TEST_F(Fa3Gpu, DecodeGroupsLengthsMasksAndLse) {
  struct Heads {
    int qo, kv;
  };
  for (const KernelKey& key : keys_under_test()) {
    const int64_t n =
        tile_shape(key.head_dim_qk, key.head_dim_vo, is_fp8(key.kv) ? 1 : 2).block_n;
    for (Op op : {Op::kBatchDecode, Op::kSingleDecode}) {
      for (Heads h : {Heads{4, 4}, Heads{8, 2}, Heads{20, 4}, Heads{32, 8}, Heads{64, 4}}) {
        for (int64_t kv : {int64_t(1), n - 1, n, n + 1, 2 * n + 3, int64_t(1000)}) {
          const bool single = op == Op::kSingleDecode;
          testing::CaseSpec s = single ? spec_for(key, op, {1}, {kv}, h.qo, h.kv)
                                       : spec_for(key, op, {1, 1, 1}, {kv, 3, kv + 40}, h.qo, h.kv);
          s.return_lse = true;
          s.problem.mask_mode = kv % 2 ? MaskMode::kCausal : MaskMode::kNone;
          expect_matches(s, std::string(op_name(op)) + " kv=" + std::to_string(kv) +
                                " heads=" + std::to_string(h.qo) + "/" + std::to_string(h.kv));
        }
      }
      testing::CaseSpec s = spec_for(key, op, {1}, {700}, 32, 8);
      s.problem.window_left = 100;
      s.return_lse = true;
      expect_matches(s, std::string(op_name(op)) + " window");
      if (is_fp8(key.q)) continue;  // no soft cap with FP8 (fa3's declaration)
      s.problem.logits_soft_cap = 0.5f;
      s.value_range = 2.0f;
      expect_matches(s, std::string(op_name(op)) + " window + soft cap");
    }
  }
}

TEST_F(Fa3Gpu, DecodeLayoutsPageSizesAndCombinedCaches) {
  for (const KernelKey& key : keys_under_test()) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (int page_size : {1, 16, 7}) {
        for (bool combined : {false, true}) {
          testing::CaseSpec s = spec_for(key, Op::kBatchDecode, {1, 1, 1}, {50, 20, 129});
          s.problem.kv_layout = layout;
          s.problem.page_size = page_size;
          s.combined_kv_cache = combined;
          expect_matches(s, std::string(kv_layout_name(layout)) + " page " +
                                std::to_string(page_size) + (combined ? " combined" : ""));
        }
      }
    }
    testing::CaseSpec s = spec_for(key, Op::kSingleDecode, {1}, {297});
    s.problem.kv_layout = KVLayout::kHND;
    expect_matches(s, "single decode HND");
  }
}

// Split-KV: forced chunks (rounded up to whole K/V blocks by fa3's plan), decode and prefill,
// requests shorter than a chunk and without keys beside split ones; then the planner's own split
// of a long decode and of a short prefill over a long cache (few tiles, idle SMs).
TEST_F(Fa3Gpu, SplitKvMatchesTheReference) {
  for (const KernelKey& key : keys_under_test()) {
    for (int64_t chunk : {int64_t(64), int64_t(100), int64_t(1000)}) {
      for (Op op : {Op::kBatchDecode, Op::kBatchPrefillPaged, Op::kBatchPrefillRagged}) {
        for (bool causal : {false, true}) {
          testing::CaseSpec s = spec_for(key, op, {1, 9, 2, 150}, {1500, 10, 0, 900});
          s.problem.mask_mode = causal ? MaskMode::kCausal : MaskMode::kNone;
          s.return_lse = true;
          expect_matches(s,
                         std::string(op_name(op)) + " chunk " + std::to_string(chunk) +
                             (causal ? " causal" : ""),
                         chunk);
        }
      }
      testing::CaseSpec w = spec_for(key, Op::kBatchPrefillPaged, {200}, {2000});
      w.problem.mask_mode = MaskMode::kCausal;
      w.problem.window_left = 300;
      w.return_lse = true;
      expect_matches(w, "window, chunk " + std::to_string(chunk), chunk);
    }
    testing::CaseSpec d = spec_for(key, Op::kBatchDecode, {1}, {20000}, 32, 8);
    d.return_lse = true;
    expect_matches(d, "long decode, planner's split");
    testing::CaseSpec sd = spec_for(key, Op::kSingleDecode, {1}, {9000}, 64, 8);
    expect_matches(sd, "long single decode, planner's split");
    testing::CaseSpec p = spec_for(key, Op::kSinglePrefill, {16}, {6000});
    p.problem.mask_mode = MaskMode::kCausal;
    p.return_lse = true;
    expect_matches(p, "short prefill over a long cache, planner's split");
  }
}

}  // namespace
}  // namespace kvattn::fa3::test
