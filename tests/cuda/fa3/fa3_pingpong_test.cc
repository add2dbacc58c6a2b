// fa3's consumer ping-pong (src/cuda/fa3/kernels/consumer_pingpong.h), checked on the replay's
// wgmma order (fa3_pingpong.h): first the check itself on hand-made orders (each rule caught),
// then the kernel body replayed on the CI keys (and d64 / d256) over prefill and decode, causal
// and not, split-KV, and decode tiles on one consumer warpgroup, with the turns counted. Every
// replay asserts the order (fa3_replay_ctas.h); here each case also proves both consumer
// warpgroups took turns, alternately (the runs of the two differ by at most one per CTA).
#include "cuda/fa3/fa3_pingpong.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/common/case_spec.h"
#include "cuda/fa3/fa3_emu_ops.h"
#include "cuda/fa3/fa3_replay.h"
#include "cuda/fa3/fa3_replay_test_util.h"
#include "cuda/fa3/kernel_key.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::fa3 {
namespace {

using E = emu::WgmmaEvent;

// A turn: `s` ss wgmmas then a commit (S = Q K^T), then `pv` rs wgmmas and a commit (P V).
void turn(std::vector<E>& log, int wg, int s, int pv) {
  const auto w = uint8_t(wg);
  if (s > 0) {
    for (int i = 0; i < s; ++i) log.push_back({E::kIssueSs, w});
    log.push_back({E::kCommit, w});
  }
  if (pv > 0) {
    for (int i = 0; i < pv; ++i) log.push_back({E::kIssueRs, w});
    log.push_back({E::kCommit, w});
  }
}

TEST(Fa3ReplayPingPong, TheCheckCatchesInterleavedAndRepeatedTurns) {
  // 16-bit overlap order: S_0, then S_n with P_{n-1} V_{n-1}, then the last P V; alternating.
  std::vector<E> good;
  turn(good, 1, 8, 0);
  turn(good, 2, 8, 0);
  for (int n = 1; n < 3; ++n) {
    turn(good, 1, 8, 8);
    turn(good, 2, 8, 8);
  }
  turn(good, 1, 0, 8);
  turn(good, 2, 0, 8);
  const PingPongCheck ok = check_pingpong(good, 2, 8);
  EXPECT_EQ(ok.error, "");
  EXPECT_EQ(ok.turns[1], 4);
  EXPECT_EQ(ok.turns[2], 4);

  // Two free-running warpgroups: their S k-steps interleave.
  std::vector<E> mixed;
  for (int ks = 0; ks < 8; ++ks) {
    mixed.push_back({E::kIssueSs, 1});
    mixed.push_back({E::kIssueSs, 2});
  }
  mixed.push_back({E::kCommit, 1});
  mixed.push_back({E::kCommit, 2});
  const std::string interleaved = check_pingpong(mixed, 2, 8).error;
  EXPECT_NE(interleaved.find("open"), std::string::npos) << interleaved;
  EXPECT_NE(interleaved.find("event 0"), std::string::npos) << interleaved;

  // Warpgroup 1 takes two steps in a row (a lock without alternation).
  std::vector<E> twice;
  turn(twice, 1, 8, 0);
  turn(twice, 1, 8, 8);
  turn(twice, 2, 8, 0);
  const std::string repeated = check_pingpong(twice, 2, 8).error;
  EXPECT_NE(repeated.find("2 S = Q K^T"), std::string::npos) << repeated;
  std::vector<E> two_pv;
  turn(two_pv, 1, 8, 0);
  turn(two_pv, 2, 8, 0);
  turn(two_pv, 1, 0, 8);
  turn(two_pv, 1, 0, 8);
  EXPECT_NE(check_pingpong(two_pv, 2, 8).error.find("16 P V"), std::string::npos);
  // FP8 d256's P V is two passes (two commit groups) of 4 wgmmas: one step, not two.
  std::vector<E> passes;
  turn(passes, 1, 4, 4);
  passes.push_back({E::kIssueRs, 1});
  passes.push_back({E::kIssueRs, 1});
  passes.push_back({E::kIssueRs, 1});
  passes.push_back({E::kIssueRs, 1});
  passes.push_back({E::kCommit, 1});
  turn(passes, 2, 4, 0);
  EXPECT_NE(check_pingpong(passes, 2, 4).error, "");
  EXPECT_EQ(check_pingpong(passes, 2, 8).error, "");

  // The producer issues none; with one consumer warpgroup, warpgroup 2 none.
  std::vector<E> producer;
  turn(producer, 0, 8, 0);
  EXPECT_NE(check_pingpong(producer, 2, 8).error.find("not a computing consumer"),
            std::string::npos);
  EXPECT_NE(check_pingpong(good, 1, 8).error.find("not a computing consumer"), std::string::npos);
  std::vector<E> alone;
  turn(alone, 1, 8, 0);
  turn(alone, 1, 8, 8);
  EXPECT_EQ(check_pingpong(alone, 1, 8).error, "");
}

const KernelKey kBf16D64{DType::kBF16, DType::kBF16, 64, 64};
const KernelKey kBf16D256{DType::kBF16, DType::kBF16, 256, 256};
const KernelKey kE4m3D256{DType::kE4M3, DType::kE4M3, 256, 256};

struct Case {
  const char* name;
  Op op;
  std::vector<int64_t> qo, kv;
  int qo_heads, kv_heads;
  bool causal;
  int64_t chunk;  // kv_chunk_size (0: the planner's)
  bool two;       // two consumer warpgroups compute
};

// The replay checks the order in every CTA; here every case must also match the reference and,
// with two consumer warpgroups, show both taking turns, alternately: the runs of one warpgroup
// and of the other differ by at most one per CTA. With one, warpgroup 2 issues no wgmma (its
// CTAs take no turn: the ping-pong is off and nothing waits for the warpgroup that left).
TEST(Fa3ReplayPingPong, ConsumerGemmsAlternateOnEveryShape) {
  // clang-format off
  const Case cases[] = {
      {"paged prefill", Op::kBatchPrefillPaged, {1, 17, 130}, {40, 17, 300}, 4, 2, false, 0, true},
      {"paged prefill causal", Op::kBatchPrefillPaged, {1, 17, 130}, {40, 17, 300}, 4, 2, true, 0,
       true},
      {"ragged prefill causal", Op::kBatchPrefillRagged, {70, 1}, {130, 65}, 4, 2, true, 0, true},
      {"single prefill causal", Op::kSinglePrefill, {200}, {260}, 4, 2, true, 0, true},
      {"prefill split 64 causal", Op::kBatchPrefillPaged, {1, 130}, {300, 200}, 4, 2, true, 64,
       true},
      {"decode group 80", Op::kBatchDecode, {1, 1}, {200, 70}, 80, 1, false, 0, true},
      {"decode group 80 split 64", Op::kBatchDecode, {1, 1}, {300, 70}, 80, 1, false, 64, true},
      {"decode group 4 (one warpgroup)", Op::kBatchDecode, {1, 1, 1}, {300, 65, 129}, 8, 2, false,
       0, false},
      {"decode group 4 split 64 (one warpgroup)", Op::kBatchDecode, {1, 1}, {300, 129}, 8, 2, true,
       64, false},
  };
  // clang-format on
  std::vector<KernelKey> keys = {kBf16D128, kE4m3D128, kBf16D64, kBf16D256};
  if (full_grid()) keys.push_back(kE4m3D256);
  emu::ReplayCounters& counters = emu::replay_counters();
  for (const KernelKey& key : keys) {
    for (const Case& k : cases) {
      // d64 and d256: the prefill shapes only (the decode shapes are the CI keys').
      if (key.head_dim_qk != 128 && k.op == Op::kBatchDecode) continue;
      // The CI keys also with TMA boxes landing early (an mbarrier's waiters run right after the
      // arrival that completes it: another interleaving of the two warpgroups).
      for (bool early : {false, true}) {
        if (early && key.head_dim_qk != 128) continue;
        const std::string what =
            std::string(k.name) + " " + kernel_key_string(key) + (early ? " TMA early" : "");
        testing::CaseSpec s = cuda::kernel_case_spec(key, k.op, k.qo, k.kv, k.qo_heads, k.kv_heads);
        if (k.causal) s.problem.mask_mode = MaskMode::kCausal;
        s.return_lse = k.chunk > 0;
        ReplayOptions o;
        o.kv_chunk_size = k.chunk;
        o.tma_lands_early = early;
        counters.reset();
        testing::Case c = testing::Case::make(s);
        const testing::CheckResult r = testing::check_against_reference(c, run_replay(o));
        EXPECT_TRUE(r.ok) << what << ": " << r.message;
        const int64_t t1 = counters.pingpong_turns[1], t2 = counters.pingpong_turns[2];
        std::printf("[ ping-pong ] %s: turns %lld / %lld, wgmma %lld / %lld\n", what.c_str(),
                    static_cast<long long>(t1), static_cast<long long>(t2),
                    static_cast<long long>(counters.wgmma[1].load()),
                    static_cast<long long>(counters.wgmma[2].load()));
        if (k.two) {
          EXPECT_GT(t1, 1) << what;
          EXPECT_GT(t2, 1) << what;
          EXPECT_LE(std::llabs(t1 - t2), o.ctas) << what;
        } else {
          EXPECT_EQ(t1 + t2, 0) << what << ": one consumer warpgroup takes no turn";
          EXPECT_EQ(counters.wgmma[2], 0) << what;
          EXPECT_GT(counters.wgmma[1], 0) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvattn::fa3
