// The CTA emulator (cta_emulator.h) against the definitions of what it emulates: ldmatrix plain
// and .trans on known matrices, mma.m16n8k16 on small-integer bf16 and f16 operands against a
// plain product, the shuffles, the barriers, cp.async's groups (a read before the wait sees the
// old bytes); and the rules it enforces: lanes at different collectives, a barrier some threads
// never reach, copies left in flight, addresses outside shared memory, a stalled thread (the
// watchdog).
#include "cuda/emulator/cta_emulator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda/fa2/kernels/formats.h"

namespace kvattn::fa2::emu {
namespace {

// The EmulatorError message of a run ("" when it ran clean).
template <class Body>
std::string run_error(Cta& cta, Body&& body) {
  try {
    cta.run(std::forward<Body>(body));
  } catch (const EmulatorError& e) {
    return e.what();
  }
  return "";
}

TEST(CtaEmulatorTest, SharedMemoryStartsAsNanBitsAndIsAligned) {
  Cta cta(32, 256);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cta.smem()) % 128, 0u);
  for (std::size_t i = 0; i < 256; ++i) ASSERT_EQ(cta.smem()[i], 0xff) << i;
  uint16_t bits;
  std::memcpy(&bits, cta.smem(), sizeof bits);
  EXPECT_TRUE(std::isnan(Bf16Format::to_float(bits)));
  EXPECT_TRUE(std::isnan(F16Format::to_float(bits)));
  EXPECT_THROW(Cta(48, 0), std::invalid_argument);
}

TEST(CtaEmulatorTest, SyncOrdersSharedMemoryAndSyncOrReducesOverTheCta) {
  constexpr int kThreads = 128, kRounds = 3;
  Cta cta(kThreads, kThreads * sizeof(int));
  std::vector<int> ids(kThreads, -1), seen(kThreads * kRounds), any(kThreads * 3);
  cta.run([&](const EmuOps& ops, unsigned char* smem) {
    int* s = reinterpret_cast<int*>(smem);
    const int t = ops.thread();
    ids[std::size_t(t)] = t;
    for (int round = 0; round < kRounds; ++round) {
      s[t] = 1000 * round + t;
      ops.sync();
      seen[std::size_t(t * kRounds + round)] = s[(t + 1) % kThreads];
      ops.sync();
    }
    any[std::size_t(3 * t)] = ops.sync_or(false);
    any[std::size_t(3 * t + 1)] = ops.sync_or(t == 77);
    any[std::size_t(3 * t + 2)] = ops.sync_or(true);
  });
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(ids[std::size_t(t)], t);
    for (int round = 0; round < kRounds; ++round) {
      EXPECT_EQ(seen[std::size_t(t * kRounds + round)], 1000 * round + (t + 1) % kThreads);
    }
    EXPECT_EQ(any[std::size_t(3 * t)], 0) << t;
    EXPECT_EQ(any[std::size_t(3 * t + 1)], 1) << t;
    EXPECT_EQ(any[std::size_t(3 * t + 2)], 1) << t;
  }
}

// __shfl_xor_sync / __shfl_sync over the full warp: each warp on its own.
TEST(CtaEmulatorTest, ShuffleReadsTheSourceLaneOfTheSameWarp) {
  constexpr int kThreads = 64;
  const int masks[] = {1, 2, 4, 8, 16, 31, 32};
  constexpr int kMasks = 7, kIdx = 3;
  Cta cta(kThreads, 0);
  std::vector<float> by_xor(kThreads * kMasks), by_idx(kThreads * kIdx);
  cta.run([&](const EmuOps& ops, unsigned char*) {
    const int t = ops.thread(), lane = t % 32;
    const float v = float(100 * t);
    for (int m = 0; m < kMasks; ++m)
      by_xor[std::size_t(t * kMasks + m)] = ops.shfl_xor(v, masks[m]);
    by_idx[std::size_t(t * kIdx)] = ops.shfl(v, (7 * lane + 3) % 32);  // a different source each
    by_idx[std::size_t(t * kIdx + 1)] = ops.shfl(v, 35);               // 35 mod 32 = 3
    by_idx[std::size_t(t * kIdx + 2)] = ops.shfl(v, -1);               // lane 31
  });
  for (int t = 0; t < kThreads; ++t) {
    const int base = t / 32 * 32, lane = t % 32;
    for (int m = 0; m < kMasks; ++m) {
      // A source lane past 31 (mask 32) leaves the lane its own value.
      const int src = (lane ^ masks[m]) < 32 ? base + (lane ^ masks[m]) : t;
      EXPECT_EQ(by_xor[std::size_t(t * kMasks + m)], float(100 * src)) << t << " ^ " << masks[m];
    }
    EXPECT_EQ(by_idx[std::size_t(t * kIdx)], float(100 * (base + (7 * lane + 3) % 32))) << t;
    EXPECT_EQ(by_idx[std::size_t(t * kIdx + 1)], float(100 * (base + 3))) << t;
    EXPECT_EQ(by_idx[std::size_t(t * kIdx + 2)], float(100 * (base + 31))) << t;
  }
}

// Two warps, each loading its own four 8x8 matrices whose rows lie in shared memory out of
// order (every lane's address is honoured), 48 bytes apart (not packed).
TEST(CtaEmulatorTest, LdmatrixLoadsTheFragmentsOfItsDefinition) {
  constexpr int kThreads = 64, kStride = 24;  // elements between stored rows
  auto value = [](int warp, int m, int r, int c) {
    return uint16_t(warp << 12 | m << 8 | r << 4 | c);
  };
  auto stored_row = [](int warp, int m, int r) { return (warp * 4 + m) * 8 + (5 * r + 3) % 8; };
  Cta cta(kThreads, std::size_t(2 * 4 * 8 * kStride) * sizeof(uint16_t));
  uint16_t* mem = reinterpret_cast<uint16_t*>(cta.smem());
  for (int w = 0; w < 2; ++w) {
    for (int m = 0; m < 4; ++m) {
      for (int r = 0; r < 8; ++r) {
        for (int c = 0; c < 8; ++c) mem[stored_row(w, m, r) * kStride + c] = value(w, m, r, c);
      }
    }
  }
  std::vector<std::array<uint32_t, 4>> plain(kThreads), trans(kThreads);
  cta.run([&](const EmuOps& ops, unsigned char* smem) {
    const int t = ops.thread(), lane = t % 32;
    const uint16_t* row =
        reinterpret_cast<const uint16_t*>(smem) + stored_row(t / 32, lane / 8, lane % 8) * kStride;
    uint32_t r[4];
    ops.ldmatrix_x4(r, row);
    std::memcpy(plain[std::size_t(t)].data(), r, sizeof r);
    ops.ldmatrix_x4_trans(r, row);
    std::memcpy(trans[std::size_t(t)].data(), r, sizeof r);
  });
  for (int t = 0; t < kThreads; ++t) {
    const int w = t / 32, l = t % 32;
    for (int m = 0; m < 4; ++m) {
      const uint32_t want_plain =
          value(w, m, l / 4, 2 * (l % 4)) | uint32_t(value(w, m, l / 4, 2 * (l % 4) + 1)) << 16;
      const uint32_t want_trans =
          value(w, m, 2 * (l % 4), l / 4) | uint32_t(value(w, m, 2 * (l % 4) + 1, l / 4)) << 16;
      EXPECT_EQ(plain[std::size_t(t)][std::size_t(m)], want_plain)
          << "thread " << t << " reg " << m;
      EXPECT_EQ(trans[std::size_t(t)][std::size_t(m)], want_trans)
          << "thread " << t << " reg " << m;
    }
  }
}

// D = A B + C for a 16x16 A, 16x8 B (k x n) and 16x8 C of small integers (exact), each warp its
// own, the lanes building their fragments from the PTX layouts.
template <class F>
void check_mma(uint32_t seed) {
  constexpr int kThreads = 64;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-8, 8);
  float A[2][16][16], B[2][16][8], C[2][16][8];
  for (auto& m : A)
    for (auto& row : m)
      for (float& x : row) x = float(small(rng));
  for (auto& m : B)
    for (auto& row : m)
      for (float& x : row) x = float(small(rng));
  for (auto& m : C)
    for (auto& row : m)
      for (float& x : row) x = float(small(rng)) * 0.5f;
  std::vector<std::array<float, 4>> out(kThreads);
  Cta cta(kThreads, 0);
  cta.run([&](const EmuOps& ops, unsigned char*) {
    const int t = ops.thread(), w = t / 32, g = t % 32 / 4, q = t % 4;
    const auto& a = A[w];
    const auto& b = B[w];
    const uint32_t af[4] = {F::pack(a[g][2 * q], a[g][2 * q + 1]),
                            F::pack(a[g + 8][2 * q], a[g + 8][2 * q + 1]),
                            F::pack(a[g][2 * q + 8], a[g][2 * q + 9]),
                            F::pack(a[g + 8][2 * q + 8], a[g + 8][2 * q + 9])};
    const uint32_t b0 = F::pack(b[2 * q][g], b[2 * q + 1][g]);
    const uint32_t b1 = F::pack(b[2 * q + 8][g], b[2 * q + 9][g]);
    float d[4];
    for (int e = 0; e < 4; ++e) d[e] = C[w][g + 8 * (e / 2)][2 * q + e % 2];
    ops.mma<F>(d, af, b0, b1);
    std::memcpy(out[std::size_t(t)].data(), d, sizeof d);
  });
  for (int t = 0; t < kThreads; ++t) {
    const int w = t / 32, g = t % 32 / 4, q = t % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * q + e % 2;
      double want = C[w][row][col];
      for (int k = 0; k < 16; ++k) want += double(A[w][row][k]) * B[w][k][col];
      EXPECT_EQ(out[std::size_t(t)][std::size_t(e)], float(want))
          << "thread " << t << " row " << row << " col " << col;
    }
  }
}

TEST(CtaEmulatorTest, MmaBf16IsThePlainProduct) { check_mma<Bf16Format>(1); }
TEST(CtaEmulatorTest, MmaF16IsThePlainProduct) { check_mma<F16Format>(2); }

// One 16-byte chunk per copy; each thread owns four chunks of shared memory.
struct CpAsyncFixture {
  static constexpr int kThreads = 32, kChunks = 4;
  CpAsyncFixture() : cta(kThreads, kThreads * kChunks * 16) {
    std::memset(cta.smem(), 0xab, cta.smem_bytes());  // the old bytes
    for (int t = 0; t < kThreads; ++t) {
      for (int c = 0; c < kChunks; ++c) {
        for (int i = 0; i < 16; ++i) global[t][c][i] = uint8_t(t * 64 + c * 16 + i);
      }
    }
  }
  static bool all(const unsigned char* p, unsigned char byte) {
    for (int i = 0; i < 16; ++i) {
      if (p[i] != byte) return false;
    }
    return true;
  }
  bool is_global(const unsigned char* p, int t, int c) const {
    return std::memcmp(p, global[t][c], 16) == 0;
  }
  Cta cta;
  alignas(16) unsigned char global[kThreads][kChunks][16];
};

TEST(CtaEmulatorTest, CpAsyncLandsAtTheWaitNotBefore) {
  CpAsyncFixture f;
  std::vector<int> ok(f.kThreads * 4, 0);
  f.cta.run([&](const EmuOps& ops, unsigned char* smem) {
    const int t = ops.thread();
    unsigned char* mine = smem + t * f.kChunks * 16;
    int* r = &ok[std::size_t(4 * t)];
    ops.cp_async_16(mine, f.global[t][0], true);
    ops.cp_async_commit();
    r[0] = f.all(mine, 0xab);  // read before the wait: the old bytes
    ops.cp_async_wait<0>();
    r[1] = f.is_global(mine, t, 0);
    // Another thread's copy is visible after its wait and a barrier.
    ops.sync();
    const int next = (t + 1) % f.kThreads;
    r[2] = f.is_global(smem + next * f.kChunks * 16, next, 0);
    r[3] = 1;
  });
  for (int i = 0; i < f.kThreads * 4; ++i)
    EXPECT_EQ(ok[std::size_t(i)], 1) << "thread " << i / 4 << " check " << i % 4;
}

TEST(CtaEmulatorTest, CpAsyncWaitOneLeavesTheNewestGroupPending) {
  CpAsyncFixture f;
  std::vector<int> ok(f.kThreads * 5, 0);
  f.cta.run([&](const EmuOps& ops, unsigned char* smem) {
    const int t = ops.thread();
    unsigned char* mine = smem + t * f.kChunks * 16;
    int* r = &ok[std::size_t(5 * t)];
    ops.cp_async_16(mine, f.global[t][0], true);  // group 1: chunks 0 and 1
    ops.cp_async_16(mine + 16, f.global[t][1], true);
    ops.cp_async_commit();
    ops.cp_async_16(mine + 32, f.global[t][2], true);  // group 2: chunk 2
    ops.cp_async_commit();
    ops.cp_async_wait<1>();
    r[0] = f.is_global(mine, t, 0) && f.is_global(mine + 16, t, 1);
    r[1] = f.all(mine + 32, 0xab);
    // A copy not yet committed belongs to no group: wait<0> does not wait for it.
    ops.cp_async_16(mine + 48, f.global[t][3], true);
    ops.cp_async_wait<0>();
    r[2] = f.is_global(mine + 32, t, 2);
    r[3] = f.all(mine + 48, 0xab);
    ops.cp_async_commit();
    ops.cp_async_wait<0>();
    r[4] = f.is_global(mine + 48, t, 3);
  });
  for (int i = 0; i < f.kThreads * 5; ++i)
    EXPECT_EQ(ok[std::size_t(i)], 1) << "thread " << i / 5 << " check " << i % 5;
}

// src-size 0: 16 zero bytes land and the source is never read (a null source would fault).
TEST(CtaEmulatorTest, CpAsyncInvalidZeroFillsWithoutReadingTheSource) {
  Cta cta(32, 32 * 16);  // starts as 0xff
  std::vector<int> zero(32, 0);
  cta.run([&](const EmuOps& ops, unsigned char* smem) {
    const int t = ops.thread();
    ops.cp_async_16(smem + 16 * t, nullptr, false);
    ops.cp_async_commit();
    ops.cp_async_wait<0>();
    zero[std::size_t(t)] = CpAsyncFixture::all(smem + 16 * t, 0);
  });
  for (int t = 0; t < 32; ++t) EXPECT_EQ(zero[std::size_t(t)], 1) << t;
}

TEST(CtaEmulatorTest, CopiesLeftInFlightAreReported) {
  CpAsyncFixture f;
  const std::string uncommitted = run_error(f.cta, [&](const EmuOps& ops, unsigned char* smem) {
    if (ops.thread() == 3) ops.cp_async_16(smem + 48 * 16, f.global[3][0], true);
  });
  EXPECT_NE(uncommitted.find("thread 3: 1 uncommitted, 0 committed"), std::string::npos)
      << uncommitted;
  const std::string unwaited = run_error(f.cta, [&](const EmuOps& ops, unsigned char* smem) {
    ops.cp_async_16(smem + 16 * ops.thread(), f.global[ops.thread()][0], true);
    ops.cp_async_commit();
    if (ops.thread() != 5) ops.cp_async_wait<0>();
  });
  EXPECT_NE(unwaited.find("thread 5: 0 uncommitted, 1 committed group(s) not waited for"),
            std::string::npos)
      << unwaited;
}

TEST(CtaEmulatorTest, LanesAtDifferentCollectivesAreReported) {
  Cta cta(64, 256);
  const std::string shuffles = run_error(cta, [](const EmuOps& ops, unsigned char*) {
    ops.sync();
    if (ops.thread() < 32) return;
    if (ops.thread() < 48) {
      ops.shfl_xor(1.0f, 1);
    } else {
      ops.shfl(1.0f, 0);
    }
  });
  EXPECT_NE(shuffles.find("warp 1 (threads 32-63): the participants are at different "
                          "collectives: shfl_xor by threads 32-47 (lanes 0-15), shfl by threads "
                          "48-63 (lanes 16-31)"),
            std::string::npos)
      << shuffles;

  const std::string formats = run_error(cta, [](const EmuOps& ops, unsigned char*) {
    float d[4] = {};
    const uint32_t a[4] = {};
    if (ops.thread() == 7) {
      ops.mma<F16Format>(d, a, 0, 0);
    } else {
      ops.mma<Bf16Format>(d, a, 0, 0);
    }
  });
  EXPECT_NE(formats.find("mma<F16Format> by threads 7 (lanes 7)"), std::string::npos) << formats;

  // The CTA runs again after a failure.
  EXPECT_EQ(run_error(cta, [](const EmuOps& ops, unsigned char*) { ops.sync(); }), "");
}

// Half a warp at a shuffle, the other half at the barrier: every thread waits and none can go
// on; reported at once (no watchdog wait).
TEST(CtaEmulatorTest, ADivergentBarrierIsReportedAsADeadlock) {
  Cta cta(32, 0);
  const std::string deadlock = run_error(cta, [](const EmuOps& ops, unsigned char*) {
    if (ops.thread() < 16) {
      ops.shfl_xor(1.0f, 1);
    } else {
      ops.sync();
    }
  });
  EXPECT_NE(deadlock.find("emulator deadlock"), std::string::npos) << deadlock;
  EXPECT_NE(deadlock.find("CTA barrier: sync by threads 16-31; not arrived: threads 0-15"),
            std::string::npos)
      << deadlock;
  EXPECT_NE(deadlock.find("shfl_xor by threads 0-15 (lanes 0-15); not arrived: threads 16-31"),
            std::string::npos)
      << deadlock;
}

TEST(CtaEmulatorTest, AThreadThatExitsBeforeABarrierIsReported) {
  Cta cta(64, 0);
  const std::string at_sync = run_error(cta, [](const EmuOps& ops, unsigned char*) {
    if (ops.thread() == 40) return;
    ops.sync();
  });
  // Thread 40 exits before or after the others arrive: either way it is named.
  EXPECT_TRUE(at_sync.find("thread 40 exited while others wait for it at the CTA barrier") !=
                  std::string::npos ||
              at_sync.find("after threads 40 exited") != std::string::npos)
      << at_sync;
  const std::string at_shfl = run_error(cta, [](const EmuOps& ops, unsigned char*) {
    if (ops.thread() == 9) return;
    ops.shfl(1.0f, 0);
  });
  EXPECT_TRUE(at_shfl.find("thread 9 exited while others wait for it at warp 0") !=
                  std::string::npos ||
              at_shfl.find("after threads 9 (lanes 9) exited") != std::string::npos)
      << at_shfl;
}

TEST(CtaEmulatorTest, AddressesOutsideSharedMemoryAreReported) {
  Cta cta(32, 512);
  const std::string outside = run_error(cta, [](const EmuOps& ops, unsigned char* smem) {
    uint32_t r[4];
    ops.ldmatrix_x4(r, reinterpret_cast<const uint16_t*>(smem) + 8 * ops.thread() + 8);
  });
  EXPECT_NE(outside.find("thread 31: ldmatrix_x4 at shared-memory offset 512 of 512 bytes"),
            std::string::npos)
      << outside;
  const std::string misaligned = run_error(cta, [](const EmuOps& ops, unsigned char* smem) {
    alignas(16) static const unsigned char src[16] = {};
    ops.cp_async_16(smem + 8, src, true);
  });
  EXPECT_NE(misaligned.find("offset 8 (not 16-byte aligned)"), std::string::npos) << misaligned;
}

TEST(CtaEmulatorTest, ABodyExceptionIsRethrown) {
  Cta cta(64, 0);
  EXPECT_THROW(cta.run([](const EmuOps& ops, unsigned char*) {
    if (ops.thread() == 5) throw std::out_of_range("thread 5's own error");
    ops.sync();
  }),
               std::out_of_range);
}

// A thread that stops arriving without exiting (here: asleep) leaves the rest waiting; the
// watchdog names the threads and aborts.
TEST(CtaEmulatorDeathTest, TheWatchdogAbortsAStalledCta) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Cta cta(64, 0);
        cta.set_watchdog(std::chrono::milliseconds(200));
        cta.run([](const EmuOps& ops, unsigned char*) {
          if (ops.thread() == 33) std::this_thread::sleep_for(std::chrono::seconds(5));
          ops.sync();
        });
      },
      "emulator deadlock: no collective completed for 200 ms: the CTA barrier: sync by threads "
      "0-32,34-63; not arrived: threads 33.*Running \\(not in the emulator\\): threads 33");
}

// Many collectives back to back (the double-buffered slots): butterfly sums stay exact.
TEST(CtaEmulatorTest, BackToBackCollectivesStayInStep) {
  constexpr int kThreads = 128, kRounds = 200;
  Cta cta(kThreads, 0);
  std::vector<int> ok(kThreads, 0);
  cta.run([&](const EmuOps& ops, unsigned char*) {
    const int t = ops.thread();
    bool good = true;
    for (int round = 0; round < kRounds; ++round) {
      float v = float(t % 32 + round);
      for (int m = 1; m < 32; m *= 2) v += ops.shfl_xor(v, m);
      good = good && v == float(31 * 32 / 2 + 32 * round);
      if (round % 50 == 0) ops.sync();
    }
    ok[std::size_t(t)] = good;
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(ok[std::size_t(t)], 1) << t;
}

}  // namespace
}  // namespace kvattn::fa2::emu
