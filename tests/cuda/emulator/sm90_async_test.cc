// The SM90 emulator's asynchronous machinery (sm90_emulator.h): mbarrier phases and their rules,
// TMA tensor maps (cuTensorMapEncodeTiled's rules) and boxes, cp.async with zero fill, named
// barriers, setmaxnreg's register pool; each rule's violation caught and named.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/fa3/kernels/pipeline_state.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/emulator/sm90_emulator.h"
#include "cuda/emulator/sm90_emulator_test_util.h"

namespace kvattn::fa3::emu {
namespace {
using namespace test;  // NOLINT(google-build-using-namespace): the tests' helpers

// ---- mbarrier

TEST(Sm90Emulator, MbarrierPhasesCountArrivalsAndTransactionBytes) {
  Sm90Cta cta(launch(256, 1024));
  std::vector<int> order;
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char* s) {
                        auto* bar = reinterpret_cast<uint64_t*>(s);
                        const int t = ops.thread();
                        if (t == 0) {
                          ops.mbarrier_init(bar, 2);
                          ops.fence_barrier_init();
                        }
                        ops.sync_threads();
                        // A fresh barrier: "phase of parity 1 completed" holds at once.
                        if (t == 200) ops.mbarrier_wait(bar, 1);
                        if (t == 0) {
                          ops.mbarrier_arrive_expect_tx(bar, 64);
                          order.push_back(0);
                          ops.mbarrier_arrive(bar);  // 2 of 2, but 64 bytes still due
                          order.push_back(1);
                        }
                        if (t == 130) {
                          ops.mbarrier_wait(bar, 0);
                          order.push_back(3);
                        }
                        if (t == 1) {  // a spinning waiter passes too, once the bytes land
                          while (!ops.mbarrier_try_wait(bar, 0)) {
                          }
                          order.push_back(4);
                        }
                        if (t == 0) {
                          // Complete the transaction bytes with a 64-byte TMA box.
                          static const uint16_t g[32] = {};
                          static const uint64_t dims[1] = {32};
                          static const uint32_t box[1] = {32}, es[1] = {1};
                          static const TensorMap m = encode_tensor_map_tiled(
                              WgmmaType::kBf16, 1, g, dims, nullptr, box, es, Swizzle::kNone);
                          const int c0 = 0;
                          ops.tma_load(s + 128, &m, &c0, bar);
                          order.push_back(2);
                        }
                      }),
            "");
  // The waiters passed only after the bytes landed (after the issue).
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order[0], 0);
  EXPECT_EQ(order[1], 1);
  EXPECT_EQ(order[2], 2);
}

TEST(Sm90Emulator, MbarrierRulesAreEnforced) {
  Sm90Cta cta(launch(256, 1024));
  // Never initialised.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                if (ops.thread() == 33)
                                  ops.mbarrier_arrive(reinterpret_cast<uint64_t*>(s));
                              }),
                    "warp 1", "mbarrier.arrive", "never initialised");
  // Count 0, misaligned.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                if (ops.thread() == 0)
                                  ops.mbarrier_init(reinterpret_cast<uint64_t*>(s), 0);
                              }),
                    "mbarrier.init", "count 0");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                if (ops.thread() == 0)
                                  ops.mbarrier_init(reinterpret_cast<uint64_t*>(s + 4), 1);
                              }),
                    "mbarrier.init", "8-byte aligned");
  // Used by another thread with no barrier after the init.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) ops.mbarrier_init(bar, 1);
                                if (ops.thread() == 64) ops.mbarrier_arrive(bar);
                              }),
                    "warp 2", "no barrier");
  // A missed arrive: the waiters deadlock, reported with their warps and the wait.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) ops.mbarrier_init(bar, 2);
                                ops.sync_threads();
                                if (ops.thread() == 0) ops.mbarrier_arrive(bar);  // 1 of 2
                                if (ops.thread() >= 128) ops.mbarrier_wait(bar, 0);
                              }),
                    "deadlock", "mbarrier.try_wait.parity 0", "1 of 2 arrivals pending", "warp 4",
                    "warp 7");
  // A phase reused early: the producer arrives twice (two phases) before the consumer waits for
  // the first; its parity 0 now names phase 2, not the phase 0 it means.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) ops.mbarrier_init(bar, 1);
                                ops.sync_threads();
                                if (ops.thread() == 0) {
                                  ops.mbarrier_arrive(bar);
                                  ops.mbarrier_arrive(bar);
                                }
                                ops.sync_threads();
                                if (ops.thread() == 128) ops.mbarrier_wait(bar, 0);
                              }),
                    "warp 4", "mbarrier.try_wait.parity 0", "phase reused early");
  // The same waits in step with the phases: clean (a ring of one slot, 3 rounds).
  EXPECT_EQ(run_error(cta,
                      [](Sm90Ops& ops, unsigned char* s) {
                        auto* full = reinterpret_cast<uint64_t*>(s);
                        auto* empty = full + 1;
                        if (ops.thread() == 0) {
                          ops.mbarrier_init(full, 1);
                          ops.mbarrier_init(empty, 128);
                        }
                        ops.sync_threads();
                        for (int round = 0; round < 3; ++round) {
                          const uint32_t parity = uint32_t(round & 1);
                          if (ops.thread() == 0) {
                            ops.mbarrier_wait(empty, parity ^ 1u);
                            ops.mbarrier_arrive(full);
                          }
                          if (ops.thread() >= 128) {
                            ops.mbarrier_wait(full, parity);
                            ops.mbarrier_arrive(empty);
                          }
                        }
                      }),
            "");
  // Re-initialised with a phase in progress.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) {
                                  ops.mbarrier_init(bar, 2);
                                  ops.mbarrier_arrive(bar);
                                  ops.mbarrier_init(bar, 2);
                                }
                              }),
                    "mbarrier.init", "phase in progress");
  // tx-count past 2^20 - 1.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) {
                                  ops.mbarrier_init(bar, 1);
                                  ops.mbarrier_expect_tx(bar, 1u << 20);
                                }
                              }),
                    "mbarrier.expect_tx", "tx-count");
}

// ---- TMA

TEST(Sm90Emulator, TensorMapEncodingFollowsCuTensorMapEncodeTiledsRules) {
  alignas(1024) static uint16_t g[64 * 256];
  const uint32_t es[3] = {1, 1, 1};
  auto encode = [&](const void* base, uint64_t stride1, uint32_t box0, uint32_t box1, Swizzle sw) {
    const uint64_t dims[2] = {256, 64};
    const uint64_t strides[1] = {stride1};
    const uint32_t box[2] = {box0, box1};
    return encode_tensor_map_tiled(WgmmaType::kBf16, 2, base, dims, strides, box, es, sw);
  };
  auto error = [&](auto&& f) {
    try {
      f();
    } catch (const EmulatorError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error([&] { encode(g, 512, 64, 64, Swizzle::k128B); }), "");
  EXPECT_FAILS_WITH(error([&] { encode(g, 512, 64, 257, Swizzle::kNone); }), "boxDim[1] = 257",
                    "1..256");
  EXPECT_FAILS_WITH(error([&] { encode(g, 512, 128, 8, Swizzle::k128B); }),
                    "256 bytes exceeds the 128-byte swizzle span");
  EXPECT_FAILS_WITH(error([&] { encode(g, 512, 64, 8, Swizzle::k64B); }),
                    "exceeds the 64-byte swizzle span");
  EXPECT_FAILS_WITH(error([&] { encode(g, 520, 64, 8, Swizzle::kNone); }), "globalStrides[0] = 520",
                    "multiple of 16");
  EXPECT_FAILS_WITH(error([&] { encode(g, uint64_t(1) << 40, 64, 8, Swizzle::kNone); }), "2^40");
  EXPECT_FAILS_WITH(
      error([&] { encode(reinterpret_cast<const char*>(g) + 8, 512, 64, 8, Swizzle::kNone); }),
      "globalAddress", "16-byte aligned");
  EXPECT_FAILS_WITH(error([&] { encode(g, 512, 4, 8, Swizzle::kNone); }), "8 bytes",
                    "multiple of 16");
  const uint32_t es2[2] = {2, 1};
  const uint64_t dims[2] = {256, 64};
  const uint64_t strides[1] = {512};
  const uint32_t box[2] = {64, 8};
  EXPECT_FAILS_WITH(error([&] {
                      encode_tensor_map_tiled(WgmmaType::kBf16, 2, g, dims, strides, box, es2,
                                              Swizzle::kNone);
                    }),
                    "elementStrides");
  const uint64_t zero_dims[2] = {0, 64};
  EXPECT_FAILS_WITH(error([&] {
                      encode_tensor_map_tiled(WgmmaType::kBf16, 2, g, zero_dims, strides, box, es,
                                              Swizzle::kNone);
                    }),
                    "globalDim[0] = 0");
}

// A 3-d box of K's layout ([token][head][dim], 64 dims x 64 tokens) lands later, through the
// mbarrier, swizzled where fa3's tile layout says, with rows past the tensor zero-filled; read
// before the wait it is still the old bytes.
TEST(Sm90Emulator, TmaBoxesLandLateSwizzledAndZeroFilled) {
  constexpr int kTokens = 40, kHeads = 2, kDim = 64, kBox = 64;
  alignas(64) static uint16_t g[kTokens * kHeads * kDim];
  for (int t = 0; t < kTokens; ++t)
    for (int h = 0; h < kHeads; ++h)
      for (int d = 0; d < kDim; ++d)
        g[(t * kHeads + h) * kDim + d] = bf16(float(t * 100 + h * 64 + d));
  const uint64_t dims[3] = {kDim, kHeads, kTokens};
  const uint64_t strides[2] = {kDim * 2, kHeads * kDim * 2};
  const uint32_t box[3] = {kDim, 1, kBox}, es[3] = {1, 1, 1};
  const TensorMap m =
      encode_tensor_map_tiled(WgmmaType::kBf16, 3, g, dims, strides, box, es, Swizzle::k128B);
  EXPECT_EQ(m.box_bytes(), uint32_t(kBox * kDim * 2));
  Sm90Cta cta(launch(128, 2048 + kBox * kDim * 2));
  uint16_t before = 0;
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char* s) {
                        auto* bar = reinterpret_cast<uint64_t*>(s);
                        if (ops.thread() == 0) {
                          ops.mbarrier_init(bar, 1);
                          ops.fence_barrier_init();
                        }
                        ops.sync_threads();
                        if (ops.thread() == 0) {
                          ops.mbarrier_arrive_expect_tx(bar, m.box_bytes());
                          ops.tma_load_3d(s + 1024, &m, 0, 1, 0, bar);
                          before = ops.ld_shared(reinterpret_cast<uint16_t*>(s + 1024));
                        }
                        ops.mbarrier_wait(bar, 0);
                      }),
            "");
  EXPECT_EQ(before, 0xffff);  // not landed at issue
  for (int t = 0; t < kBox; ++t)
    for (int d = 0; d < kDim; ++d) {
      uint16_t v;
      std::memcpy(&v, cta.smem() + 1024 + smem::tile_offset(t, d, kBox), 2);
      const float want = t < kTokens ? num::bf16_to_f32(bf16(float(t * 100 + 64 + d))) : 0.0f;
      ASSERT_EQ(num::bf16_to_f32(v), want) << t << " " << d;
    }
  // 128B swizzle needs a 1024-byte aligned destination; the mbarrier's init must be fenced.
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) {
                                  ops.mbarrier_init(bar, 1);
                                  ops.fence_barrier_init();
                                  ops.tma_load_3d(s + 512, &m, 0, 0, 0, bar);
                                }
                              }),
                    "warp 0", "cp.async.bulk.tensor.3d", "1024-byte aligned");
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) {
                                  ops.mbarrier_init(bar, 1);
                                  ops.tma_load_3d(s + 1024, &m, 0, 0, 0, bar);
                                }
                              }),
                    "cp.async.bulk.tensor.3d", "not fenced");
  // A box past the end of shared memory.
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) {
                                  ops.mbarrier_init(bar, 1);
                                  ops.fence_barrier_init();
                                  ops.tma_load_3d(s + 3072, &m, 0, 0, 0, bar);
                                }
                              }),
                    "cp.async.bulk.tensor.3d", "outside");
  // A load nobody waits for, still in flight when the CTA exits.
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) {
                                  ops.mbarrier_init(bar, 1);
                                  ops.fence_barrier_init();
                                  ops.tma_load_3d(s + 1024, &m, 0, 0, 0, bar);
                                }
                              }),
                    "exits with 1 TMA load", "thread 0");
  // Waiting for bytes nobody loads: deadlock once nothing is in flight.
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                auto* bar = reinterpret_cast<uint64_t*>(s);
                                if (ops.thread() == 0) {
                                  ops.mbarrier_init(bar, 1);
                                  ops.fence_barrier_init();
                                  ops.mbarrier_arrive_expect_tx(bar, m.box_bytes());
                                }
                                ops.sync_threads();
                                ops.mbarrier_wait(bar, 0);
                              }),
                    "deadlock", "tx 8192");
}

// ---- cp.async

TEST(Sm90Emulator, CpAsyncLandsAtItsWaitWithZeroFill) {
  Sm90Cta cta(launch(128, 4096));
  alignas(16) static uint32_t src[4] = {1, 2, 3, 4};
  std::vector<uint32_t> seen(8);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char* s) {
                        if (ops.thread() != 9) return;
                        ops.cp_async(s + 256, src, 16, 16);
                        ops.cp_async(s + 272, src, 16, 8);  // the upper 8 bytes zeroed
                        ops.cp_async_commit();
                        seen[0] = ops.ld_shared(reinterpret_cast<uint32_t*>(s + 256));
                        ops.cp_async_wait<0>();
                        for (int i = 0; i < 4; ++i)
                          seen[std::size_t(4 + i)] =
                              ops.ld_shared(reinterpret_cast<uint32_t*>(s + 272) + i);
                        seen[1] = ops.ld_shared(reinterpret_cast<uint32_t*>(s + 256));
                      }),
            "");
  EXPECT_EQ(seen[0], 0xffffffffu);  // before its wait: the old bytes
  EXPECT_EQ(seen[1], 1u);
  EXPECT_EQ(seen[4], 1u);
  EXPECT_EQ(seen[5], 2u);
  EXPECT_EQ(seen[6], 0u);
  EXPECT_EQ(seen[7], 0u);
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                if (ops.thread() == 9) {
                                  ops.cp_async(s + 256, src, 16, 16);
                                  ops.cp_async_commit();
                                }
                              }),
                    "warp 0", "exit", "cp.async copies not waited for");
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                if (ops.thread() == 9) ops.cp_async(s + 8, src, 16, 16);
                              }),
                    "cp.async", "16-byte aligned");
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                if (ops.thread() == 9) ops.cp_async(s + 4096, src, 16, 16);
                              }),
                    "cp.async", "outside");
}

// ---- named barriers

TEST(Sm90Emulator, NamedBarriersCountThreadsAndCatchMismatches) {
  Sm90Cta cta(launch(384, 64));
  // The producer warp arrives, the 256 consumers sync on barrier 1 with 288 threads.
  std::vector<int> after(384);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        const int t = ops.thread();
                        if (t < 32) ops.named_barrier_arrive(1, 288);
                        if (t >= 128) {
                          ops.named_barrier_sync(1, 288);
                          after[std::size_t(t)] = 1;
                        }
                      }),
            "");
  EXPECT_EQ(after[200], 1);
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.thread() >= 128)
                                  ops.named_barrier_sync(2, ops.thread() < 256 ? 256 : 128);
                              }),
                    "bar.sync 2, 128", "differs");
  EXPECT_FAILS_WITH(
      run_error(cta, [](Sm90Ops& ops, unsigned char*) { ops.named_barrier_sync(3, 100); }),
      "bar.sync 3, 100", "multiple of 32");
  EXPECT_FAILS_WITH(
      run_error(cta, [](Sm90Ops& ops, unsigned char*) { ops.named_barrier_sync(16, 384); }),
      "barrier id 16");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.thread() >= 128)
                                  ops.named_barrier_sync(1, 384);  // 128 short
                              }),
                    "deadlock", "bar.sync 1, 384 (256 of 384 arrived)", "warp 4");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.thread() < 32) {
                                  ops.named_barrier_arrive(4, 96);
                                  ops.named_barrier_arrive(4, 96);
                                }
                              }),
                    "bar.arrive 4, 96", "twice");
}

// Two warpgroups taking turns through a pair of named barriers (fa3's consumer ping-pong,
// kernels/consumer_pingpong.h): each waits on its own barrier (bar.sync, 256 threads) and ends its
// turn with bar.arrive on the other's; warpgroup 2 gives the first turn. The turns alternate,
// with one arrival left over at exit (nobody waits for it). A warpgroup that leaves while the
// other still waits for its turn is a deadlock, reported by name, not a hang; so is a warpgroup
// taking one turn too many.
TEST(Sm90Emulator, NamedBarrierPingPongAlternatesAndAPartnerThatLeftIsADeadlock) {
  Sm90Cta cta(launch(384, 64));
  const auto body = [](std::vector<int>* order, int turns1, int turns2) {
    return [order, turns1, turns2](Sm90Ops& ops, unsigned char*) {
      const int wg = ops.warpgroup();
      if (wg == 0) return;
      if (wg == 2) ops.named_barrier_arrive(3, 256);
      for (int k = 0; k < (wg == 1 ? turns1 : turns2); ++k) {
        ops.named_barrier_sync(2 + wg, 256);
        if (ops.thread() % 128 == 0) order->push_back(wg);
        ops.named_barrier_arrive(wg == 1 ? 4 : 3, 256);
      }
    };
  };
  std::vector<int> order;
  EXPECT_EQ(run_error(cta, body(&order, 3, 3)), "");
  EXPECT_EQ(order, (std::vector<int>{1, 2, 1, 2, 1, 2}));
  std::vector<int> ignored;
  EXPECT_FAILS_WITH(run_error(cta, body(&ignored, 3, 1)), "deadlock",
                    "bar.sync 3, 256 (128 of 256 arrived)", "warp 4");
  EXPECT_FAILS_WITH(run_error(cta, body(&ignored, 1, 2)), "deadlock",
                    "bar.sync 4, 256 (128 of 256 arrived)", "warp 8");
}

// The order of the warpgroups' wgmma issues and commits (Sm90Cta::wgmma_log): one entry per
// completed collective, in CTA order; two warpgroups issuing freely interleave.
TEST(Sm90Emulator, WgmmaLogRecordsIssuesAndCommitsInCtaOrder) {
  Sm90Cta cta(launch(256, 3 * 8192));
  std::memset(cta.smem(), 0, 3 * 8192);
  EXPECT_EQ(run_error(cta,
                      [](Sm90Ops& ops, unsigned char*) {
                        Acc<64> d;
                        ops.wgmma_fence();
                        for (int ks = 0; ks < 2; ++ks) {
                          ops.wgmma_ss(d, WgmmaType::kBf16, WgmmaType::kBf16, WgmmaRig::a(),
                                       false, WgmmaRig::b(), false, ks > 0);
                        }
                        ops.wgmma_commit();
                        ops.wgmma_wait<0>();
                      }),
            "");
  std::string order;
  for (const WgmmaEvent& e : cta.wgmma_log()) {
    order += e.kind == WgmmaEvent::kCommit ? 'c' : e.kind == WgmmaEvent::kIssueSs ? 's' : 'r';
    order += char('0' + e.warpgroup);
  }
  EXPECT_EQ(order, "s0s1s0s1c0c1");
}

// bar.red.or.pred: every participant gets the OR of the predicates of its phase, and only of its
// phase; it blocks like bar.sync; the bar.sync rules hold; and it is not mixed with bar.sync in
// one phase (PTX ISA).
TEST(Sm90Emulator, NamedBarrierRedOrReducesEachPhase) {
  Sm90Cta cta(launch(384, 64));
  // Consumers (threads 128..383) on barrier 1, three phases: nobody true; thread 300 true; thread
  // 128 true in warpgroup 1 while the producer warpgroup reduces its own on barrier 2.
  std::vector<std::array<int, 3>> got(384, {-1, -1, -1});
  std::vector<int> producer(128, -1);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        const int t = ops.thread();
                        if (t < 128) {
                          producer[std::size_t(t)] = ops.named_barrier_red_or(2, 128, t == 127);
                          return;
                        }
                        auto& g = got[std::size_t(t)];
                        g[0] = ops.named_barrier_red_or(1, 256, false);
                        g[1] = ops.named_barrier_red_or(1, 256, t == 300);
                        g[2] = ops.named_barrier_red_or(1, 256, t == 128);
                      }),
            "");
  for (int t = 128; t < 384; ++t) {
    EXPECT_EQ(got[std::size_t(t)][0], 0) << "thread " << t;
    EXPECT_EQ(got[std::size_t(t)][1], 1) << "thread " << t;
    EXPECT_EQ(got[std::size_t(t)][2], 1) << "thread " << t;
  }
  for (int t = 0; t < 128; ++t) EXPECT_EQ(producer[std::size_t(t)], 1) << "thread " << t;
  // A phase whose true predicate comes late: the threads that arrived first still get true.
  std::vector<int> late(128, -1);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        const int t = ops.thread();
                        if (t >= 128) return;
                        late[std::size_t(t)] = ops.named_barrier_red_or(3, 128, t == 127);
                        late[std::size_t(t)] += 2 * ops.named_barrier_red_or(3, 128, false);
                      }),
            "");
  for (int t = 0; t < 128; ++t) EXPECT_EQ(late[std::size_t(t)], 1) << "thread " << t;
  // It waits for every participant, like bar.sync: one warp short is a deadlock.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.thread() >= 32 && ops.thread() < 128)
                                  ops.named_barrier_red_or(1, 128, true);
                              }),
                    "deadlock", "bar.red.or.pred 1, 128 (96 of 128 arrived)");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.thread() < 128)
                                  ops.named_barrier_red_or(1, ops.thread() < 64 ? 128 : 64, true);
                              }),
                    "bar.red.or.pred 1, 64", "differs");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.thread() >= 128) return;
                                if (ops.thread() < 64) {
                                  ops.named_barrier_red_or(4, 128, true);
                                } else {
                                  ops.named_barrier_sync(4, 128);
                                }
                              }),
                    "mixes bar.red with bar.sync / bar.arrive in one phase of barrier 4");
}

// ---- setmaxnreg

TEST(Sm90Emulator, SetmaxnregBoundsAndTheRegisterPool) {
  // fa3's split: launched at 168, the producer drops to 40, the consumers rise to 232.
  Sm90Cta cta(launch(384, 0));
  auto split = [](bool producer_releases) {
    return [producer_releases](Sm90Ops& ops, unsigned char*) {
      if (ops.warpgroup() == 0) {
        if (producer_releases) ops.setmaxnreg_dec<40>();
      } else {
        ops.setmaxnreg_inc<232>();
      }
    };
  };
  EXPECT_EQ(run_error(cta, split(true)), "");
  EXPECT_FAILS_WITH(run_error(cta, split(false)), "deadlock", "setmaxnreg.inc.sync.aligned.u32 232",
                    "waits for registers");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.warpgroup() == 1) ops.setmaxnreg_inc<260>();
                              }),
                    "(warpgroup 1, thread", "setmaxnreg.inc.sync.aligned.u32 260", "24..256");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.warpgroup() == 1) ops.setmaxnreg_inc<100>();
                              }),
                    "setmaxnreg.inc", "in steps of 8");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.warpgroup() == 2) ops.setmaxnreg_inc<96>();
                              }),
                    "(warpgroup 2, thread", ".inc below the warpgroup's current 168");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.warpgroup() == 0) ops.setmaxnreg_dec<200>();
                              }),
                    ".dec above");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.warpgroup() != 0) return;
                                if (ops.warp() == 1) {
                                  ops.setmaxnreg_dec<40>();
                                } else {
                                  ops.setmaxnreg_dec<48>();
                                }
                              }),
                    "divergent collective", "setmaxnreg.dec");
}

TEST(Sm90Emulator, ABodysOwnExceptionIsRethrown) {
  Sm90Cta cta(launch(128, 0));
  EXPECT_THROW(cta.run([](Sm90Ops& ops, unsigned char*) {
    ops.sync_threads();
    if (ops.thread() == 100) throw std::logic_error("body");
    ops.sync_threads();
  }),
               std::logic_error);
  // And the CTA runs again afterwards.
  EXPECT_EQ(run_error(cta, [](Sm90Ops& ops, unsigned char*) { ops.sync_threads(); }), "");
}
}  // namespace
}  // namespace kvattn::fa3::emu
