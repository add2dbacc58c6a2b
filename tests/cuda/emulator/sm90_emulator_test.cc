// The SM90 CTA emulator (sm90_emulator.h) against the definitions of what it emulates, and one
// test per rule it enforces (the violation caught, the message naming the warp and the
// instruction): launch limits, shared-memory bounds, collectives, wgmma's rules (the fence /
// in-flight rules; proxy fences; writes to operands in flight). wgmma's products over every
// descriptor layout, register and FP8 forms are in sm90_wgmma_products_test.cc; the mbarrier /
// TMA / cp.async / named-barrier / setmaxnreg rules in sm90_async_test.cc, a fa3-shaped pipeline
// in sm90_pipeline_test.cc.
#include "cuda/emulator/sm90_emulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/fa3/kernels/pipeline_state.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/emulator/sm90_emulator_test_util.h"
#include "testing/fp8_accumulation.h"

namespace kvattn::fa3::emu {
namespace {
using namespace test;  // NOLINT(google-build-using-namespace): the tests' helpers

TEST(Sm90Emulator, LaunchLimitsAreRefused) {
  EXPECT_NO_THROW(Sm90Cta(launch(384, kMaxSmemBytes)));
  try {
    Sm90Cta cta(launch(384, kMaxSmemBytes + 1));
    ADD_FAILURE() << "over 227 KiB accepted";
  } catch (const EmulatorError& e) {
    EXPECT_FAILS_WITH(e.what(), "227 KiB");
  }
  EXPECT_THROW(Sm90Cta(launch(96, 0)), EmulatorError);  // not whole warpgroups
  Sm90Launch l = launch(384, 0);
  l.regs_per_thread = 200;  // 384 x 200 > 64 K
  EXPECT_THROW(Sm90Cta{l}, EmulatorError);
  Sm90Cta cta(launch(128, 4096));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cta.smem()) % 1024, 0u);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(cta.smem()[i], 0xff);
}

TEST(Sm90Emulator, SharedMemoryAccessesOutsideOrMisalignedFail) {
  Sm90Cta cta(launch(128, 1024));
  EXPECT_EQ(run_error(cta,
                      [](Sm90Ops& ops, unsigned char* s) {
                        ops.st_shared(reinterpret_cast<uint32_t*>(s + 4 * ops.thread()),
                                      uint32_t(1));
                      }),
            "");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                if (ops.thread() == 77) ops.st_shared(s + 1024, uint8_t(1));
                              }),
                    "warp 2", "thread 77", "st.shared", "outside");
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                if (ops.thread() == 5) {
                                  (void)ops.ld_shared(reinterpret_cast<uint32_t*>(s + 2));
                                }
                              }),
                    "warp 0", "ld.shared", "4-byte aligned");
}

TEST(Sm90Emulator, ShuffleAndDivergentCollectives) {
  Sm90Cta cta(launch(128, 0));
  std::vector<float> got(128);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        got[std::size_t(ops.thread())] = ops.shfl_xor(float(ops.thread()), 5);
                      }),
            "");
  for (int t = 0; t < 128; ++t) EXPECT_EQ(got[std::size_t(t)], float(t ^ 5));
  // Half a warpgroup at wgmma.fence, the other half at wgmma.commit_group.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.thread() < 64) {
                                  ops.wgmma_fence();
                                } else {
                                  ops.wgmma_commit();
                                }
                              }),
                    "warp 2", "divergent collective", "wgmma.commit_group", "wgmma.fence");
  // A lane that exits while its warp waits at a shuffle.
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                if (ops.thread() != 3) (void)ops.shfl_xor(1.0f, 1);
                              }),
                    "warp 0", "shfl.sync.bfly");
}

// ---- wgmma's rules

TEST(Sm90Emulator, WgmmaAccumulatorsAreNanAndUntouchableUntilTheirWait) {
  WgmmaRig rig;
  std::vector<int> nan_before(128), zero_after(128);
  EXPECT_EQ(run_error(rig.cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        Acc<64> d;
                        ops.wgmma_fence();
                        WgmmaRig::mma(ops, d, false);
                        ops.wgmma_commit();
                        nan_before[std::size_t(ops.thread())] = std::isnan(d.raw()[7]);
                        ops.wgmma_wait<0>();
                        zero_after[std::size_t(ops.thread())] = d[7] == 0.0f;
                      }),
            "");
  for (int t = 0; t < 128; ++t) {
    EXPECT_TRUE(nan_before[std::size_t(t)]) << t;
    EXPECT_TRUE(zero_after[std::size_t(t)]) << t;
  }
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                Acc<64> d;
                                ops.wgmma_fence();
                                WgmmaRig::mma(ops, d, false);
                                ops.wgmma_commit();
                                const float x = d[3];  // before the wait
                                (void)x;
                                ops.wgmma_wait<0>();
                              }),
                    "(warpgroup 0, thread", "reads accumulator register 3", "in flight");
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                Acc<64> d;
                                ops.wgmma_fence();
                                WgmmaRig::mma(ops, d, false);
                                ops.wgmma_commit();
                                d[0] = 1.0f;
                                ops.wgmma_wait<0>();
                              }),
                    "writes accumulator register 0", "in flight");
  // wait_group 1 retires only the older of two groups.
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                Acc<64> d0, d1;
                                ops.wgmma_fence();
                                WgmmaRig::mma(ops, d0, false);
                                ops.wgmma_commit();
                                WgmmaRig::mma(ops, d1, false);
                                ops.wgmma_commit();
                                ops.wgmma_wait<1>();
                                const float ok = d0[0];
                                const float bad = d1[0];
                                (void)ok;
                                (void)bad;
                              }),
                    "reads accumulator register 0", "in flight");
  // Its registers going out of scope before the wait.
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                {
                                  Acc<64> d;
                                  ops.wgmma_fence();
                                  WgmmaRig::mma(ops, d, false);
                                  ops.wgmma_commit();
                                }
                                ops.wgmma_wait<0>();
                              }),
                    "(warpgroup 0, thread", "accumulator registers go out of scope");
  // Exiting with a wgmma in flight (registers that outlive the thread).
  std::unique_ptr<Acc<64>[]> outliving(new Acc<64>[128]);
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [&](Sm90Ops& ops, unsigned char*) {
                                Acc<64>& d = outliving[std::size_t(ops.thread())];
                                ops.wgmma_fence();
                                WgmmaRig::mma(ops, d, false);
                                ops.wgmma_commit();
                              }),
                    "exit", "not retired");
}

TEST(Sm90Emulator, WgmmaNeedsAFenceAfterRegisterWrites) {
  WgmmaRig rig;
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                Acc<64> d;
                                WgmmaRig::mma(ops, d, false);  // no wgmma.fence at all
                              }),
                    "warp 0", "wgmma.mma_async.m64n128k16.f32.bf16.bf16", "first wgmma");
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                Acc<64> d;
                                ops.wgmma_fence();
                                for (int i = 0; i < 64; ++i) d[i] = 0.0f;  // after the fence
                                WgmmaRig::mma(ops, d, true);
                                ops.wgmma_commit();
                                ops.wgmma_wait<0>();
                              }),
                    "accumulator registers written since", "wgmma.fence");
  // The same with the fence after the writes, and chained accumulation without one: clean.
  EXPECT_EQ(run_error(rig.cta,
                      [](Sm90Ops& ops, unsigned char*) {
                        Acc<64> d;
                        for (int i = 0; i < 64; ++i) d[i] = 0.0f;
                        ops.wgmma_fence();
                        WgmmaRig::mma(ops, d, true);
                        WgmmaRig::mma(ops, d, true);
                        ops.wgmma_commit();
                        ops.wgmma_wait<0>();
                        d[0] *= 2.0f;
                      }),
            "");
  // The A fragment of the register form, written after the fence.
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                Acc<64> d;
                                AFrag a;
                                ops.wgmma_fence();
                                for (int r = 0; r < 4; ++r) a[r] = 0u;
                                ops.wgmma_rs(d, WgmmaType::kBf16, WgmmaType::kBf16, a,
                                             smem::encode(smem::mn_major(8192, 64, 0)), true,
                                             false);
                              }),
                    "A-fragment registers written since");
}

TEST(Sm90Emulator, WgmmaOperandsOutsideSharedMemoryFail) {
  Sm90Cta cta(launch(128, 8192));
  EXPECT_FAILS_WITH(run_error(cta,
                              [](Sm90Ops& ops, unsigned char*) {
                                Acc<64> d;
                                ops.wgmma_fence();
                                ops.wgmma_ss(d, WgmmaType::kBf16, WgmmaType::kBf16, WgmmaRig::a(),
                                             false, WgmmaRig::b(), false, false);
                                ops.wgmma_commit();
                                ops.wgmma_wait<0>();
                              }),
                    "operand B", "outside");
}

// A generic-proxy write (st.shared, or a landed cp.async) read by wgmma without
// fence.proxy.async in between fails, naming the writer; with the fence it is clean.
TEST(Sm90Emulator, AsyncProxyReadOfAnUnfencedGenericWriteFails) {
  for (int variant = 0; variant < 3; ++variant) {
    WgmmaRig rig;
    std::vector<uint16_t> src(8, bf16(1.0f));
    const std::string err = run_error(rig.cta, [&](Sm90Ops& ops, unsigned char* s) {
      if (ops.thread() == 40) {
        if (variant == 1) {
          ops.cp_async_16_zfill(s + 8192 + 16, src.data(), true);
          ops.cp_async_wait_all();
        } else {
          ops.st_shared(reinterpret_cast<uint16_t*>(s + 8192 + 16), bf16(1.0f));
        }
        if (variant == 2) ops.fence_proxy_async();
      }
      ops.sync_threads();
      Acc<64> d;
      ops.wgmma_fence();
      WgmmaRig::mma(ops, d, false);
      ops.wgmma_commit();
      ops.wgmma_wait<0>();
    });
    if (variant == 2) {
      EXPECT_EQ(err, "");
    } else {
      EXPECT_FAILS_WITH(err, "wgmma.mma_async", "operand B", "async-proxy read",
                        "warp 1 (warpgroup 0, thread 40)", "fence.proxy.async");
    }
  }
}

// cp.async.mbarrier.arrive.noinc: the copier goes on at once; its copies land late, then arrive
// on the barrier (one of its count), so a waiter sees the bytes. Their writer cannot fence them
// for wgmma (it never saw them complete): a thread that waited for the phase must, and its
// fence.proxy.async is what lets the wgmma read them (variant 2); with no fence (0) or only the
// copier's (1) the read fails naming the copy. A CTA exiting with such copies unlanded, with
// nobody waiting, fails too.
TEST(Sm90Emulator, CpAsyncArrivalsLandLateAndNeedTheWaitersProxyFence) {
  for (int variant = 0; variant < 3; ++variant) {
    WgmmaRig rig;
    std::vector<uint16_t> src(8, bf16(1.0f));
    uint16_t seen_before = 0, seen_after = 0;
    const std::string err = run_error(rig.cta, [&](Sm90Ops& ops, unsigned char* s) {
      uint64_t* bar = reinterpret_cast<uint64_t*>(s + 96);  // not an operand byte
      if (ops.thread() == 0) {
        ops.mbarrier_init(bar, 1);
        ops.fence_barrier_init();
      }
      ops.sync_threads();
      if (ops.thread() == 40) {
        ops.cp_async_16_zfill(s + 8192 + 16, src.data(), true);
        ops.cp_async_mbarrier_arrive_noinc(bar);
        seen_before = ops.ld_shared(reinterpret_cast<uint16_t*>(s + 8192 + 16));
        if (variant == 1) ops.fence_proxy_async();
      }
      ops.mbarrier_wait(bar, 0);
      if (ops.thread() == 41)
        seen_after = ops.ld_shared(reinterpret_cast<uint16_t*>(s + 8192 + 16));
      if (variant == 2) ops.fence_proxy_async();
      Acc<64> d;
      ops.wgmma_fence();
      WgmmaRig::mma(ops, d, false);
      ops.wgmma_commit();
      ops.wgmma_wait<0>();
    });
    EXPECT_EQ(seen_before, 0) << variant << ": landed before the copier went on";
    if (variant == 2) {
      EXPECT_EQ(err, "");
      EXPECT_EQ(seen_after, bf16(1.0f));
    } else {
      EXPECT_FAILS_WITH(err, "wgmma.mma_async", "async-proxy read",
                        "warp 1 (warpgroup 0, thread 40)", "arrived on an mbarrier",
                        "fence.proxy.async");
    }
  }
  WgmmaRig rig;
  std::vector<uint16_t> src(8, bf16(1.0f));
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [&](Sm90Ops& ops, unsigned char* s) {
                                uint64_t* bar = reinterpret_cast<uint64_t*>(s + 96);
                                if (ops.thread() != 0) return;
                                ops.mbarrier_init(bar, 1);
                                ops.cp_async_16_zfill(s + 8192, src.data(), true);
                                ops.cp_async_mbarrier_arrive_noinc(bar);
                              }),
                    "exits with 1 cp.async.mbarrier.arrive.noinc group");
}

// Shared memory a wgmma in flight reads may not be written until its wait: a store, and a TMA
// load landing there, both fail naming the writer.
TEST(Sm90Emulator, WritingAnOperandOfAWgmmaInFlightFails) {
  WgmmaRig rig;
  EXPECT_FAILS_WITH(run_error(rig.cta,
                              [](Sm90Ops& ops, unsigned char* s) {
                                Acc<64> d;
                                ops.wgmma_fence();
                                WgmmaRig::mma(ops, d, false);
                                ops.wgmma_commit();
                                if (ops.thread() == 70) {
                                  ops.st_shared(reinterpret_cast<uint32_t*>(s + 8192 + 16), 0u);
                                }
                                ops.wgmma_wait<0>();
                              }),
                    "warp 2 (warpgroup 0, thread 70) (st.shared)", "operand of a wgmma.mma_async",
                    "in flight");
  // After the wait the same store is fine.
  EXPECT_EQ(run_error(rig.cta,
                      [](Sm90Ops& ops, unsigned char* s) {
                        Acc<64> d;
                        ops.wgmma_fence();
                        WgmmaRig::mma(ops, d, false);
                        ops.wgmma_commit();
                        ops.wgmma_wait<0>();
                        if (ops.thread() == 70) {
                          ops.st_shared(reinterpret_cast<uint32_t*>(s + 8192 + 16), 0u);
                        }
                      }),
            "");
}
}  // namespace
}  // namespace kvattn::fa3::emu
