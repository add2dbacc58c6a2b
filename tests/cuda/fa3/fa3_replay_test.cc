// fa3's kernel body (src/cuda/fa3/kernels/prefill_cta.h) run on the CPU: the exact code the GPU
// runs, over the SM90 CTA emulator (sm90_emulator.h: three warpgroups as fibers; wgmma with its
// descriptors and fence / commit / wait rules, mbarrier phases, TMA boxes through tensor maps
// checked against cuTensorMapEncodeTiled's rules, cp.async, per-byte proxy fences, named
// barriers, setmaxnreg; fa3_emu_ops.h binds the body's operations to it), with the plan of fa3's
// own plan() and the parameters of the same host function as run() (kernel_params.h), against
// the fp64 reference with the precision-following tolerance of testing/tolerance.h
// (fa3_replay.h). The split-KV merge runs the merge kernel's body (cuda/common/split_merge.h, fa2's
// too) over its grid on the host.
//
// CI runs a reduced grid; KVATTN_FA3_REPLAY_FULL=1 runs the full one (every declared key through
// every test, both TMA landing schedules).
#include "cuda/fa3/fa3_replay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/capability.h"
#include "core/numeric.h"
#include "cuda/common/case_spec.h"
#include "cuda/common/fast_div.h"
#include "cuda/fa3/capability.h"
#include "cuda/fa3/fa3_emu_ops.h"
#include "cuda/fa3/fa3_replay_test_util.h"
#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/kernel_keys.h"
#include "cuda/fa3/kernels/prefill_cta.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"
#include "testing/variants.h"

namespace kvattn::fa3 {
namespace {

// Every operation and every variant of the shared list fa3 declares, on the CI keys (every key
// with the full grid), the TMA boxes landing late and (full grid) early.
TEST(Fa3Replay, EveryOperationEveryVariant) {
  for (const KernelKey& key : grid_keys()) {
    for (Op op : kOps) {
      for (const testing::AttentionVariant& v : testing::attention_variants()) {
        const bool single = !is_batch(op);
        testing::CaseSpec s = single ? spec_for(key, op, {37}, {150})
                                     : spec_for(key, op, {1, 17, 130}, {40, 17, 200});
        v.apply(s);
        if (!testing::variant_applies(v, s.problem) || !declared(s.problem)) continue;
        for (bool early : {false, true}) {
          if (early && !full_grid() && std::string(v.name) != "causal") continue;
          ReplayOptions o;
          o.tma_lands_early = early;
          expect_matches(s,
                         std::string(op_name(op)) + "/" + v.name + "/" + kernel_key_string(key) +
                             (early ? "/TMA early" : ""),
                         o);
        }
      }
    }
  }
}

// One case of every other declared key: paged and ragged prefill (TMA for 16-bit) and decode,
// causal with LSE.
TEST(Fa3Replay, EveryDeclaredKey) {
  for (const KernelKey& key : all_keys()) {
    for (Op op : {Op::kBatchPrefillRagged, Op::kBatchDecode}) {
      testing::CaseSpec s = spec_for(key, op, {70, 1}, {130, 65});
      s.problem.mask_mode = MaskMode::kCausal;
      s.return_lse = true;
      expect_matches(s, std::string(op_name(op)) + "/" + kernel_key_string(key));
    }
  }
}

// Lengths below, at and above the 128-row tile and the 128-key block (64 at d256), GQA groups
// 1, 5 and 8 (decode packs a group's rows into a tile: 5 and 8 rows per token).
TEST(Fa3Replay, LengthsAroundTheTilesAndGroups) {
  struct Heads {
    int qo, kv;
  };
  for (const KernelKey& key : grid_keys()) {
    for (Heads h : {Heads{2, 2}, Heads{5, 1}, Heads{8, 1}}) {
      for (Op op : {Op::kBatchPrefillRagged, Op::kBatchDecode}) {
        const std::vector<int64_t> kvs = {127, 128, 129, 257};
        const std::vector<int64_t> qos =
            op == Op::kBatchDecode ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 64, 129};
        for (int64_t qo : qos) {
          testing::CaseSpec s =
              spec_for(key, op, std::vector<int64_t>(kvs.size(), qo), kvs, h.qo, h.kv);
          s.problem.mask_mode = MaskMode::kCausal;
          s.return_lse = true;
          expect_matches(s, std::string(op_name(op)) + " qo=" + std::to_string(qo) + " heads " +
                                std::to_string(h.qo) + "/" + std::to_string(h.kv) + " " +
                                kernel_key_string(key));
        }
      }
    }
  }
}

TEST(Fa3Replay, LayoutsPageSizesAndCombinedCaches) {
  for (const KernelKey& key : grid_keys()) {
    for (Op op : {Op::kBatchDecode, Op::kBatchPrefillPaged}) {
      for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
        // 128: a multiple of every K/V block, the TMA path over pages (combined caches too).
        for (int page_size : {1, 7, 16, 128}) {
          for (bool combined : {false, true}) {
            testing::CaseSpec s = spec_for(key, op, {3, 1}, {50, 129});
            s.problem.kv_layout = layout;
            s.problem.page_size = page_size;
            s.problem.mask_mode = MaskMode::kCausal;
            s.combined_kv_cache = combined;
            expect_matches(s, std::string(op_name(op)) + " " + std::string(kv_layout_name(layout)) +
                                  " page " + std::to_string(page_size) +
                                  (combined ? " combined" : "") + " " + kernel_key_string(key));
          }
        }
      }
    }
    // Dense single prefill (TMA for 16-bit) in both layouts.
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      testing::CaseSpec s = spec_for(key, Op::kSinglePrefill, {20}, {140});
      s.problem.kv_layout = layout;
      expect_matches(s, std::string("single ") + std::string(kv_layout_name(layout)));
    }
  }
}

// Causal and sliding windows (with and without causal) across block edges.
TEST(Fa3Replay, CausalAndWindows) {
  for (const KernelKey& key : grid_keys()) {
    for (int window : {0, 9, 127, 200}) {
      for (bool causal : {false, true}) {
        testing::CaseSpec s = spec_for(key, Op::kBatchPrefillRagged, {17, 140}, {40, 300});
        s.problem.window_left = window;
        s.problem.mask_mode = causal ? MaskMode::kCausal : MaskMode::kNone;
        s.return_lse = true;
        expect_matches(s, "window " + std::to_string(window) + (causal ? " causal" : "") + " " +
                              kernel_key_string(key));
      }
    }
  }
}

// Split-KV: forced chunks (rounded up to whole K/V blocks by fa3's plan) over decode and paged /
// ragged prefill, the partial states merged by split_merge.h's kernel body; and the planner's own split of a
// long decode.
TEST(Fa3Replay, SplitKv) {
  for (const KernelKey& key : grid_keys()) {
    for (Op op : {Op::kBatchDecode, Op::kBatchPrefillPaged, Op::kBatchPrefillRagged}) {
      for (int64_t chunk : {int64_t(64), int64_t(200)}) {
        testing::CaseSpec s = spec_for(key, op, {1, 5}, {300, 129}, 8, 2);
        s.return_lse = true;
        s.scalars.lse_base = chunk == 200 ? LseBase::k2 : LseBase::kE;  // merged states' base
        s.problem.mask_mode = MaskMode::kCausal;
        ReplayOptions o;
        o.kv_chunk_size = chunk;
        expect_matches(s,
                       std::string(op_name(op)) + " chunk " + std::to_string(chunk) + " " +
                           kernel_key_string(key),
                       o);
      }
    }
    testing::CaseSpec s = spec_for(key, Op::kBatchDecode, {1}, {1500}, 8, 8);
    s.return_lse = true;
    s.scalars.lse_base = LseBase::k2;
    expect_matches(s, "planner's split " + kernel_key_string(key));
  }
}

}  // namespace
}  // namespace kvattn::fa3
