// The SM90 CTA emulator (sm90_emulator.h) against the definitions of what it emulates (wgmma
// products over every descriptor layout, register and FP8 forms; mbarrier phases; TMA boxes with
// their swizzle and zero fill; cp.async zero fill; named barriers; setmaxnreg's register pool),
// and one test per rule it enforces, each showing the violation is caught and the message names
// the warp and the instruction. The operand tiles of the wgmma tests are laid out by fa3's own
// layout code (src/cuda/fa3/kernels/smem_layout.h, wgmma_fragment.h), which the emulator does
// not use: the kernel's index math against the emulator's reading of the PTX ISA.
#include "cuda/sm90_emulator.h"

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

namespace kvattn::fa3::emu {
namespace {

template <class Body>
std::string run_error(Sm90Cta& cta, Body&& body) {
  try {
    cta.run(std::forward<Body>(body));
  } catch (const EmulatorError& e) {
    return e.what();
  }
  return "";
}
#define EXPECT_FAILS_WITH(msg, ...)                      \
  do {                                                   \
    const std::string err_ = (msg);                      \
    for (const char* part_ : {__VA_ARGS__}) {            \
      EXPECT_NE(err_.find(part_), std::string::npos)     \
          << "missing \"" << part_ << "\" in: " << err_; \
    }                                                    \
  } while (0)

Sm90Launch launch(int threads, std::size_t smem) {
  Sm90Launch l;
  l.threads = threads;
  l.smem_bytes = smem;
  return l;
}

uint16_t bf16(float x) { return num::f32_to_bf16(x); }
// Small integers, exact in bf16 and e4m3 and in every partial sum.
float small_value(int a, int b, int salt) { return float((a * 7 + b * 3 + salt) % 9 - 4); }

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

// ---- wgmma

constexpr int kM = 64, kN = 128;

// One warpgroup computes D = A B^T over `ksteps` k-steps from fa3's K-major 128B-swizzled tiles
// (A [64 x 16 ks] of Q's layout, B [128 x 16 ks] of K's), compared with a plain product.
TEST(Sm90Emulator, WgmmaSsBf16OverFa3TilesIsTheProduct) {
  constexpr int kCols = 64, kSteps = 4;
  const uint32_t a_base = 0, b_base = smem::tile_bytes(kM, kCols);
  Sm90Cta cta(launch(128, b_base + smem::tile_bytes(kN, kCols)));
  unsigned char* s = cta.smem();
  for (int r = 0; r < kM; ++r)
    for (int c = 0; c < kCols; ++c) {
      const uint16_t v = bf16(small_value(r, c, 1));
      std::memcpy(s + a_base + smem::tile_offset(r, c, kM), &v, 2);
    }
  for (int r = 0; r < kN; ++r)
    for (int c = 0; c < kCols; ++c) {
      const uint16_t v = bf16(small_value(r, c, 2));
      std::memcpy(s + b_base + smem::tile_offset(r, c, kN), &v, 2);
    }
  std::vector<float> out(128 * 64);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        Acc<64> d;
                        ops.wgmma_fence();
                        for (int ks = 0; ks < kSteps; ++ks) {
                          ops.wgmma_ss(d, WgmmaType::kBf16, WgmmaType::kBf16,
                                       smem::encode(smem::k_major(a_base, kM, 0, ks)), false,
                                       smem::encode(smem::k_major(b_base, kN, 0, ks)), false,
                                       ks > 0);
                        }
                        ops.wgmma_commit();
                        ops.wgmma_wait<0>();
                        for (int i = 0; i < 64; ++i) out[std::size_t(ops.thread() * 64 + i)] = d[i];
                      }),
            "");
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 64; ++i) {
      const auto rc = frag::acc_element(t, i);
      float want = 0;
      for (int k = 0; k < 16 * kSteps; ++k)
        want += small_value(rc.row, k, 1) * small_value(rc.col, k, 2);
      ASSERT_EQ(out[std::size_t(t * 64 + i)], want) << t << " " << i;
    }
}

// O = P V with P from registers (fa3's A fragment map) and V MN-major (fa3's V tile, two panels).
TEST(Sm90Emulator, WgmmaRsBf16WithMnMajorBIsTheProduct) {
  constexpr int kKeys = 64, kD = 128;
  Sm90Cta cta(launch(128, smem::tile_bytes(kKeys, kD)));
  for (int key = 0; key < kKeys; ++key)
    for (int c = 0; c < kD; ++c) {
      const uint16_t v = bf16(small_value(key, c, 3));
      std::memcpy(cta.smem() + smem::tile_offset(key, c, kKeys), &v, 2);
    }
  std::vector<float> out(128 * 64);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        const int t = ops.thread();
                        Acc<64> o;
                        for (int i = 0; i < 64; ++i) o[i] = 0.0f;
                        AFrag p[4];
                        for (int kk = 0; kk < 4; ++kk)
                          for (int r = 0; r < 4; ++r) {
                            uint32_t word = 0;
                            for (int h = 0; h < 2; ++h) {
                              const auto rc = frag::a_element(t, r, h);
                              word |= uint32_t(bf16(small_value(rc.row, 16 * kk + rc.col, 4)))
                                      << (16 * h);
                            }
                            p[kk][r] = word;
                          }
                        ops.wgmma_fence();
                        for (int kk = 0; kk < 4; ++kk) {
                          ops.wgmma_rs(o, WgmmaType::kBf16, WgmmaType::kBf16, p[kk],
                                       smem::encode(smem::mn_major(0, kKeys, kk)), true);
                        }
                        ops.wgmma_commit();
                        ops.wgmma_wait<0>();
                        for (int i = 0; i < 64; ++i) out[std::size_t(t * 64 + i)] = o[i];
                      }),
            "");
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 64; ++i) {
      const auto rc = frag::acc_element(t, i);
      float want = 0;
      for (int key = 0; key < kKeys; ++key)
        want += small_value(rc.row, key, 4) * small_value(key, rc.col, 3);
      ASSERT_EQ(out[std::size_t(t * 64 + i)], want) << t << " " << i;
    }
}

// FP8 (k32): e4m3 Q and K in fa3's 8-bit tiles (128 columns per panel).
TEST(Sm90Emulator, WgmmaSsE4m3IsTheProduct) {
  constexpr int kCols = 128, kSteps = 4;
  const uint32_t b_base = uint32_t(kM * kCols);
  Sm90Cta cta(launch(128, b_base + uint32_t(kN * kCols)));
  for (int r = 0; r < kM; ++r)
    for (int c = 0; c < kCols; ++c)
      cta.smem()[smem::tile_offset8(r, c, kM)] = num::f32_to_e4m3(small_value(r, c, 5));
  for (int r = 0; r < kN; ++r)
    for (int c = 0; c < kCols; ++c)
      cta.smem()[b_base + smem::tile_offset8(r, c, kN)] = num::f32_to_e4m3(small_value(r, c, 6));
  std::vector<float> out(128 * 64);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        Acc<64> d;
                        ops.wgmma_fence();
                        for (int ks = 0; ks < kSteps; ++ks) {
                          ops.wgmma_ss(d, WgmmaType::kE4m3, WgmmaType::kE4m3,
                                       smem::encode(smem::k_major(0, kM, 0, ks)), false,
                                       smem::encode(smem::k_major(b_base, kN, 0, ks)), false,
                                       ks > 0);
                        }
                        ops.wgmma_commit();
                        ops.wgmma_wait<0>();
                        for (int i = 0; i < 64; ++i) out[std::size_t(ops.thread() * 64 + i)] = d[i];
                      }),
            "");
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 64; ++i) {
      const auto rc = frag::acc_element(t, i);
      float want = 0;
      for (int k = 0; k < 32 * kSteps; ++k)
        want += small_value(rc.row, k, 5) * small_value(rc.col, k, 6);
      ASSERT_EQ(out[std::size_t(t * 64 + i)], want) << t << " " << i;
    }
  // FP8 has no transpose.
  EXPECT_FAILS_WITH(run_error(cta,
                              [&](Sm90Ops& ops, unsigned char*) {
                                Acc<64> d;
                                ops.wgmma_fence();
                                ops.wgmma_ss(d, WgmmaType::kE4m3, WgmmaType::kE4m3, 0, false, 0,
                                             true, false);
                              }),
                    "warpgroup 0", "wgmma.mma_async.m64n128k32.f32.e4m3.e4m3", "K-major");
}

// Every layout type, K-major and MN-major: a tile written row by row with the swizzle applied as
// an XOR on the byte address (written here without the emulator's address function), read back
// through a descriptor of that layout, m64n8k16.
TEST(Sm90Emulator, WgmmaDescriptorsOfEveryLayoutTypeReadTheirCanonicalLayout) {
  struct Case {
    Swizzle sw;
    bool mn_major;
  };
  for (const Case c :
       {Case{Swizzle::kNone, false}, Case{Swizzle::k32B, false}, Case{Swizzle::k64B, false},
        Case{Swizzle::k128B, false}, Case{Swizzle::kNone, true}, Case{Swizzle::k32B, true},
        Case{Swizzle::k64B, true}, Case{Swizzle::k128B, true}}) {
    SCOPED_TRACE(::testing::Message() << "layout " << int(c.sw) << " mn_major " << c.mn_major);
    const int span = swizzle_span_bytes(c.sw);
    const int xor_mask = span == 128 ? 7 : span == 64 ? 3 : span == 32 ? 1 : 0;
    auto xr = [&](uint32_t a) { return a ^ (((a >> 7) & uint32_t(xor_mask)) << 4); };
    // B: n = 8 (MN) x k = 16, stored with (for K-major) rows of `span` bytes per mn, the 8-row
    // groups SBO apart, or (none) 8x16-byte core matrices, k halves LBO apart; MN-major: rows
    // of span bytes per k, mn groups of span/2 elements LBO apart, 8-k groups SBO apart.
    constexpr int n = 8, K = 16;
    MatrixDesc b;
    b.layout = c.sw;
    b.start = 8192;                               // after A's 64 x 64 tile
    std::vector<std::pair<int, uint32_t>> where;  // (value index, address)
    auto store = [&](int mn, int k, uint32_t addr) { where.emplace_back(mn * K + k, addr); };
    if (!c.mn_major) {
      if (c.sw == Swizzle::kNone) {
        b.lbo = 128;  // the second 8-element half of k
        b.sbo = 256;
        for (int mn = 0; mn < n; ++mn)
          for (int k = 0; k < K; ++k) store(mn, k, b.start + (k / 8) * 128 + mn * 16 + (k % 8) * 2);
      } else {
        b.sbo = uint32_t(8 * span);
        for (int mn = 0; mn < n; ++mn)
          for (int k = 0; k < K; ++k) store(mn, k, xr(b.start + uint32_t(mn * span + k * 2)));
      }
    } else {
      if (c.sw == Swizzle::kNone) {
        b.sbo = 128;  // (next 8 mn) — unused at n = 8
        b.lbo = 128;  // the second 8 k
        for (int mn = 0; mn < n; ++mn)
          for (int k = 0; k < K; ++k) store(mn, k, b.start + (k / 8) * 128 + (k % 8) * 16 + mn * 2);
      } else {
        b.lbo = 2048;                // next span/2 mn: unused at n = 8
        b.sbo = uint32_t(8 * span);  // the second 8 k
        for (int mn = 0; mn < n; ++mn)
          for (int k = 0; k < K; ++k)
            store(mn, k, xr(b.start + uint32_t((k / 8) * 8 * span + (k % 8) * span + mn * 2)));
      }
    }
    // A: fa3's K-major 128B tile at 0.
    Sm90Cta cta(launch(128, 16384));
    for (int r = 0; r < kM; ++r)
      for (int k = 0; k < 64; ++k) {
        const uint16_t v = bf16(small_value(r, k, 7));
        std::memcpy(cta.smem() + smem::tile_offset(r, k, kM), &v, 2);
      }
    for (auto [idx, addr] : where) {
      const uint16_t v = bf16(small_value(idx / K, idx % K, 8));
      std::memcpy(cta.smem() + addr, &v, 2);
    }
    std::vector<float> out(128 * 4);
    ASSERT_EQ(run_error(cta,
                        [&](Sm90Ops& ops, unsigned char*) {
                          Acc<4> d;
                          ops.wgmma_fence();
                          ops.wgmma_ss(d, WgmmaType::kBf16, WgmmaType::kBf16,
                                       smem::encode(smem::k_major(0, kM, 0, 0)), false,
                                       encode_desc(b), c.mn_major, false);
                          ops.wgmma_commit();
                          ops.wgmma_wait<0>();
                          for (int i = 0; i < 4; ++i) out[std::size_t(ops.thread() * 4 + i)] = d[i];
                        }),
              "");
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < 4; ++i) {
        const auto rc = frag::acc_element(t, i);
        float want = 0;
        for (int k = 0; k < K; ++k) want += small_value(rc.row, k, 7) * small_value(rc.col, k, 8);
        ASSERT_EQ(out[std::size_t(t * 4 + i)], want) << t << " " << i;
      }
  }
  MatrixDesc d;
  d.start = 0x1230;
  d.lbo = 0x40;
  d.sbo = 0x400;
  d.layout = Swizzle::k64B;
  const MatrixDesc r = decode_desc(encode_desc(d));
  EXPECT_EQ(r.start, d.start);
  EXPECT_EQ(r.lbo, d.lbo);
  EXPECT_EQ(r.sbo, d.sbo);
  EXPECT_EQ(r.layout, d.layout);
  // fa3's descriptor encoding agrees with the ISA's bit positions.
  const MatrixDesc f = decode_desc(smem::encode(smem::k_major(2048, 64, 8, 1)));
  EXPECT_EQ(f.layout, Swizzle::k128B);
  EXPECT_EQ(f.start, 2048u + 8u * 128u + 32u);
  EXPECT_EQ(f.sbo, 1024u);
}

// A small wgmma setup for the rule tests: one warpgroup, A and B tiles of zeros.
struct WgmmaRig {
  Sm90Cta cta{launch(128, 3 * 8192)};
  WgmmaRig() { std::memset(cta.smem(), 0, 3 * 8192); }
  static uint64_t a() { return smem::encode(smem::k_major(0, kM, 0, 0)); }
  static uint64_t b() { return smem::encode(smem::k_major(8192, kN, 0, 0)); }
  static void mma(Sm90Ops& ops, Acc<64>& d, bool acc) {
    ops.wgmma_ss(d, WgmmaType::kBf16, WgmmaType::kBf16, a(), false, b(), false, acc);
  }
};

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

namespace kvattn::fa3::emu {
namespace {

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

// ---- A pipeline shaped like fa3's (src/cuda/fa3/kernels/prefill.cuh): a producer warpgroup
// loading K blocks by TMA into a 2-slot ring (full / empty mbarriers, pipeline_state.h's
// parities, one arrival per consumer warp on empty), two consumer warpgroups computing
// S = Q K^T for their 64 rows by wgmma from fa3's swizzled tiles, the setmaxnreg split. The
// kernel's own mistakes, put in one at a time, fail naming the warp and the instruction.

enum class PipeFault { kNone, kReleaseBeforeWait, kQWithoutProxyFence, kProducerParity0 };

constexpr int kPipeD = 128, kPipeBN = 128, kPipeRowsPerWg = 64;
constexpr uint32_t kQTile = smem::tile_bytes(kPipeRowsPerWg, kPipeD);  // 16 KiB
constexpr uint32_t kKTile = smem::tile_bytes(kPipeBN, kPipeD);         // 32 KiB
constexpr uint32_t kPipeQ0 = 0, kPipeK0 = 2 * kQTile, kPipeBars = kPipeK0 + 2 * kKTile;

struct PipeResult {
  std::string error;
  std::vector<float> s;  // [block][row 0..127][key 0..127]
};

PipeResult run_pipeline(int keys, PipeFault fault, bool tma_early) {
  const int blocks = (keys + kPipeBN - 1) / kPipeBN;
  std::vector<uint16_t> k(std::size_t(keys) * kPipeD), q(std::size_t(2 * kPipeRowsPerWg) * kPipeD);
  for (int t = 0; t < keys; ++t)
    for (int d = 0; d < kPipeD; ++d) k[std::size_t(t * kPipeD + d)] = bf16(small_value(t, d, 11));
  for (int r = 0; r < 2 * kPipeRowsPerWg; ++r)
    for (int d = 0; d < kPipeD; ++d) q[std::size_t(r * kPipeD + d)] = bf16(small_value(r, d, 12));
  const uint64_t dims[3] = {kPipeD, 1, uint64_t(keys)};
  const uint64_t strides[2] = {kPipeD * 2, kPipeD * 2};
  const uint32_t box[3] = {64, 1, kPipeBN}, es[3] = {1, 1, 1};
  const TensorMap tma_k = encode_tensor_map_tiled(WgmmaType::kBf16, 3, k.data(), dims, strides, box,
                                                  es, Swizzle::k128B);
  PipeResult res;
  res.s.assign(std::size_t(blocks) * 128 * kPipeBN, std::nanf(""));
  Sm90Launch l = launch(384, kPipeBars + 64);
  l.tma_lands_early = tma_early;
  Sm90Cta cta(l);
  res.error = run_error(cta, [&](Sm90Ops& ops, unsigned char* smem) {
    auto* full = reinterpret_cast<uint64_t*>(smem + kPipeBars);
    uint64_t* empty = full + 2;
    if (ops.thread() == 0) {
      for (int s = 0; s < 2; ++s) {
        ops.mbarrier_init(&full[s], 1);
        ops.mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
      }
      ops.fence_barrier_init();
    }
    ops.sync_threads();
    const int wg = ops.warpgroup();
    if (wg == 0) {
      ops.setmaxnreg_dec<40>();
      if (ops.thread() != 0) return;
      pipe::PipelineState<2> st = pipe::producer_start<2>();
      if (fault == PipeFault::kProducerParity0) st.phase = 0;
      for (int n = 0; n < blocks; ++n) {
        ops.mbarrier_wait(&empty[st.index], st.phase);
        ops.mbarrier_arrive_expect_tx(&full[st.index], kKTile);
        for (int panel = 0; panel < 2; ++panel) {
          ops.tma_load_3d(
              smem + kPipeK0 + uint32_t(st.index) * kKTile + smem::tma_panel_offset(panel, kPipeBN),
              &tma_k, 64 * panel, 0, n * kPipeBN, &full[st.index]);
        }
        st.advance();
      }
      return;
    }
    ops.setmaxnreg_inc<232>();
    const int c = wg - 1, ctid = ops.thread() % 128;
    unsigned char* q_smem = smem + kPipeQ0 + uint32_t(c) * kQTile;
    // Q rows by 16-byte stores into the swizzled tile, then the proxy fence and the
    // warpgroup's barrier (prefill.cuh's order).
    for (int chunk = ctid; chunk < kPipeRowsPerWg * kPipeD / 8; chunk += 128) {
      const int row = chunk / (kPipeD / 8), col = chunk % (kPipeD / 8) * 8;
      struct alignas(16) U4 {
        uint16_t e[8];
      } v;
      std::memcpy(v.e, &q[std::size_t((c * kPipeRowsPerWg + row) * kPipeD + col)], 16);
      ops.st_shared(reinterpret_cast<U4*>(q_smem + smem::tile_offset(row, col, kPipeRowsPerWg)), v);
    }
    if (fault != PipeFault::kQWithoutProxyFence) ops.fence_proxy_async();
    ops.named_barrier_sync(1 + c, 128);
    pipe::PipelineState<2> st = pipe::consumer_start<2>();
    const uint32_t q_addr = ops.smem_addr(q_smem);
    for (int n = 0; n < blocks; ++n) {
      ops.mbarrier_wait(&full[st.index], st.phase);
      const uint32_t k_addr = ops.smem_addr(smem + kPipeK0 + uint32_t(st.index) * kKTile);
      Acc<64> s;
      ops.wgmma_fence();
      for (int ks = 0; ks < kPipeD * 2 / 32; ++ks) {
        ops.wgmma_ss(s, WgmmaType::kBf16, WgmmaType::kBf16,
                     smem::encode(smem::k_major(q_addr, kPipeRowsPerWg, 0, ks)), false,
                     smem::encode(smem::k_major(k_addr, kPipeBN, 0, ks)), false, ks > 0);
      }
      ops.wgmma_commit();
      const bool early = fault == PipeFault::kReleaseBeforeWait;
      if (early && ops.lane() == 0) ops.mbarrier_arrive(&empty[st.index]);
      ops.wgmma_wait<0>();
      for (int i = 0; i < 64; ++i) {
        const auto rc = frag::acc_element(ctid, i);
        res.s[(std::size_t(n) * 128 + std::size_t(c * 64 + rc.row)) * kPipeBN +
              std::size_t(rc.col)] = s[i];
      }
      if (!early && ops.lane() == 0) ops.mbarrier_arrive(&empty[st.index]);
      st.advance();
    }
  });
  return res;
}

TEST(Sm90Emulator, Fa3ShapedPipelineComputesEveryBlockAndCatchesItsFaults) {
  // 4 whole blocks and a partial fifth (the ring wraps twice; keys past the tensor are zeros).
  constexpr int kKeys = 4 * kPipeBN + 37;
  for (const bool early : {false, true}) {
    SCOPED_TRACE(early ? "TMA lands early" : "TMA lands late");
    const PipeResult ok = run_pipeline(kKeys, PipeFault::kNone, early);
    ASSERT_EQ(ok.error, "");
    for (int n = 0; n < 5; ++n)
      for (int r = 0; r < 128; ++r)
        for (int j = 0; j < kPipeBN; ++j) {
          const int key = n * kPipeBN + j;
          float want = 0;
          if (key < kKeys) {
            for (int d = 0; d < kPipeD; ++d)
              want += small_value(r, d, 12) * small_value(key, d, 11);
          }
          ASSERT_EQ(ok.s[(std::size_t(n) * 128 + std::size_t(r)) * kPipeBN + std::size_t(j)], want)
              << n << " " << r << " " << j;
        }
  }
  // The slot released before the wgmma that reads it retired: the producer's next load into it
  // lands while the wgmma is in flight.
  EXPECT_FAILS_WITH(run_pipeline(kKeys, PipeFault::kReleaseBeforeWait, true).error,
                    "a TMA load issued by warp 0", "operand of a wgmma.mma_async",
                    "still in flight");
  EXPECT_FAILS_WITH(run_pipeline(kKeys, PipeFault::kQWithoutProxyFence, false).error,
                    "async-proxy read", "operand A", "fence.proxy.async");
  // The producer's first wait on `empty` with parity 0 (pipeline_state.h starts it at 1): it
  // waits for a release nobody makes before its first load.
  EXPECT_FAILS_WITH(run_pipeline(kKeys, PipeFault::kProducerParity0, false).error, "deadlock",
                    "mbarrier.try_wait.parity 0", "warp 0 (1 threads)");
}

}  // namespace
}  // namespace kvattn::fa3::emu
