// The SM90 CTA emulator's wgmma against a plain product (sm90_emulator_test.cc has the rest of
// its rules): SS and RS forms, bf16 and FP8 (with the reduced-precision FP8 accumulation), and
// every descriptor layout type reading its canonical layout. The operand tiles are laid out by
// fa3's own layout code (src/cuda/fa3/kernels/smem_layout.h, wgmma_fragment.h), which the
// emulator does not use: the kernel's index math against the emulator's reading of the PTX ISA.
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

// One warpgroup's D = A B^T over `steps` k-steps of `type`, A and B K-major tiles of kM and kN
// rows at a_base and b_base (fa3's QK): every thread's 64 accumulators, thread by thread.
std::vector<float> ss_product(Sm90Cta& cta, WgmmaType type, uint32_t a_base, uint32_t b_base,
                              int steps) {
  std::vector<float> out(128 * 64);
  EXPECT_EQ(run_error(cta,
                      [&](Sm90Ops& ops, unsigned char*) {
                        Acc<64> d;
                        ops.wgmma_fence();
                        for (int ks = 0; ks < steps; ++ks) {
                          ops.wgmma_ss(d, type, type,
                                       smem::encode(smem::k_major(a_base, kM, 0, ks)), false,
                                       smem::encode(smem::k_major(b_base, kN, 0, ks)), false,
                                       ks > 0);
                        }
                        ops.wgmma_commit();
                        ops.wgmma_wait<0>();
                        for (int i = 0; i < 64; ++i) out[std::size_t(ops.thread() * 64 + i)] = d[i];
                      }),
            "");
  return out;
}

// ss_product's accumulators against the plain product: element (row, col) of D is the sum over
// k < depth of small_value(row, k, seed_a) * small_value(col, k, seed_b).
void expect_small_value_products(const std::vector<float>& out, int depth, int seed_a,
                                 int seed_b) {
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 64; ++i) {
      const auto rc = frag::acc_element(t, i);
      float want = 0;
      for (int k = 0; k < depth; ++k)
        want += small_value(rc.row, k, seed_a) * small_value(rc.col, k, seed_b);
      ASSERT_EQ(out[std::size_t(t * 64 + i)], want) << t << " " << i;
    }
}

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
  expect_small_value_products(ss_product(cta, WgmmaType::kBf16, a_base, b_base, kSteps),
                              16 * kSteps, 1, 2);
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
  expect_small_value_products(ss_product(cta, WgmmaType::kE4m3, 0, b_base, kSteps), 32 * kSteps,
                              5, 6);
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

// FP8 wgmma's reduced-precision sum (testing/fp8_accumulation.h): the accumulator and the products
// aligned to the largest term, 13 bits below its leading bit kept, truncated toward zero.
TEST(Sm90Emulator, Fp8WgmmaSumsInReducedPrecision) {
  std::vector<float> a(32, 0.0f), b(32, 1.0f);
  // Within the kept bits: exact.
  a[0] = 0.5f;
  a[1] = std::ldexp(1.0f, -13);
  EXPECT_EQ(testing::fp8_mma_sum(1.0f, a.data(), b.data(), 32), 1.5f + std::ldexp(1.0f, -13));
  // Below them: dropped, each term on its own (32 x 2^-15 would add 2^-10 exactly).
  for (float& x : a) x = std::ldexp(1.0f, -15);
  EXPECT_EQ(testing::fp8_mma_sum(1.0f, a.data(), b.data(), 32), 1.0f);
  // Toward zero, on either sign; the accumulator is a term like the products.
  a.assign(32, 0.0f);
  a[0] = 3 * std::ldexp(1.0f, -15);
  EXPECT_EQ(testing::fp8_mma_sum(-1.0f, a.data(), b.data(), 32), -1.0f);  // exact: -1 + 3 x 2^-15
  EXPECT_EQ(testing::fp8_mma_sum(1.0f, a.data(), b.data(), 32), 1.0f);
  a[0] = 64.0f;
  EXPECT_EQ(testing::fp8_mma_sum(std::ldexp(1.0f, -8), a.data(), b.data(), 32), 64.0f);
  // Zeros, inf and NaN as exact arithmetic gives them.
  a.assign(32, 0.0f);
  EXPECT_EQ(testing::fp8_mma_sum(0.0f, a.data(), b.data(), 32), 0.0f);
  a[3] = INFINITY;
  EXPECT_EQ(testing::fp8_mma_sum(1.0f, a.data(), b.data(), 32), INFINITY);
  a[4] = -INFINITY;
  EXPECT_TRUE(std::isnan(testing::fp8_mma_sum(1.0f, a.data(), b.data(), 32)));
}

// The same through a chained e4m3 wgmma: C = 64 from the first k-step swallows the next steps'
// products of 2^-8 (below 64's 2^-7 quantum), where 16-bit operands add them exactly.
TEST(Sm90Emulator, WgmmaE4m3AccumulatorKeepsAbout14Bits) {
  constexpr int kCols = 64;  // two k32 steps of e4m3 in one 128-byte row
  const uint32_t b_base = uint32_t(kM * 128);
  Sm90Cta cta(launch(128, b_base + uint32_t(kN * 128)));
  std::memset(cta.smem(), 0, b_base + kN * 128);
  // k-step 0: A row . B row = 64 (one product 8 x 8); k-step 1: 32 products of 2^-4 x 2^-4.
  for (int r = 0; r < kM; ++r) {
    cta.smem()[smem::tile_offset8(r, 0, kM)] = num::f32_to_e4m3(8.0f);
    for (int c = 32; c < kCols; ++c)
      cta.smem()[smem::tile_offset8(r, c, kM)] = num::f32_to_e4m3(0.0625f);
  }
  for (int r = 0; r < kN; ++r) {
    cta.smem()[b_base + smem::tile_offset8(r, 0, kN)] = num::f32_to_e4m3(8.0f);
    for (int c = 32; c < kCols; ++c)
      cta.smem()[b_base + smem::tile_offset8(r, c, kN)] = num::f32_to_e4m3(0.0625f);
  }
  const std::vector<float> out = ss_product(cta, WgmmaType::kE4m3, 0, b_base, 2);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 64.0f) << i;  // exact: 64.125
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

}  // namespace
}  // namespace kvattn::fa3::emu
