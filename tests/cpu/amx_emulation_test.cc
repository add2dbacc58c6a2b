// The AMX emulation (src/cpu/common/amx_emulation.h) against the instruction set's definition,
// apart from the kernels that run on it: if the emulation and a kernel were wrong the same way,
// the kernels' tests on emulated tiles would pass and the kernel would fail on an AMX CPU.
#include "cpu/common/amx_emulation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace kvattn::cpu::amx {
namespace {

namespace emu = emulated;

uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>(u >> 16);  // truncation: the test's values are exact in bf16
}
double bf16_value(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Tiles 0 (C: m rows x n f32), 1 (A: m rows x k pairs), 2 (B: k rows x n pairs).
void configure(int m, int n, int k) {
  TileConfig cfg;
  cfg.rows[0] = static_cast<uint8_t>(m);
  cfg.colsb[0] = static_cast<uint16_t>(4 * n);
  cfg.rows[1] = static_cast<uint8_t>(m);
  cfg.colsb[1] = static_cast<uint16_t>(4 * k);
  cfg.rows[2] = static_cast<uint8_t>(k);
  cfg.colsb[2] = static_cast<uint16_t>(4 * n);
  emu::loadconfig(&cfg);
}

// One TDPBF16PS on 1 x 1 tiles: c + a[0] b[0] + a[1] b[1], the emulation's way.
float dot_one_pair(const uint16_t a[2], const uint16_t b[2], float c) {
  configure(1, 1, 1);
  emu::loadd(0, &c, 4);
  emu::loadd(1, a, 4);
  emu::loadd(2, b, 4);
  emu::dpbf16ps(0, 1, 2);
  float got;
  emu::stored(0, &got, 4);
  emu::release();
  return got;
}

// TDPBF16PS, the SDM's loops: C[m][n] += sum over k of A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1]
// (A's rows: k pairs of bf16; B's rows: n pairs), in doubles.
TEST(CpuAmxEmulation, DpBf16PsIsTheSdmsPairedProductOnEveryShapeTheKernelsUse) {
  std::mt19937 rng(3);
  // Small integers times powers of two: every product and sum below is exact in f32.
  std::uniform_int_distribution<int> small(-8, 8);
  const int shapes[][3] = {{16, 16, 16}, {4, 16, 16}, {16, 4, 16},
                           {1, 16, 16},  {16, 16, 8}, {8, 2, 16}};
  for (const auto& [m, n, k] : shapes) {
    configure(m, n, k);
    std::vector<uint16_t> a(m * 2 * k), b(k * 2 * n);
    std::vector<float> c(m * n);
    for (auto& x : a) x = bf16_bits(std::ldexp(float(small(rng)), small(rng) / 4));
    for (auto& x : b) x = bf16_bits(std::ldexp(float(small(rng)), small(rng) / 4));
    for (auto& x : c) x = float(small(rng));
    // Strided rows, as the kernels load them.
    std::vector<uint8_t> a_mem(m * 96), b_mem(k * 80), c_mem(m * 72);
    for (int r = 0; r < m; ++r) std::memcpy(&a_mem[r * 96], &a[r * 2 * k], 4 * k);
    for (int r = 0; r < k; ++r) std::memcpy(&b_mem[r * 80], &b[r * 2 * n], 4 * n);
    for (int r = 0; r < m; ++r) std::memcpy(&c_mem[r * 72], &c[r * n], 4 * n);
    emu::loadd(0, c_mem.data(), 72);
    emu::loadd(1, a_mem.data(), 96);
    emu::loadd(2, b_mem.data(), 80);
    emu::dpbf16ps(0, 1, 2);
    std::vector<uint8_t> out(m * 68, 0xAB);
    emu::stored(0, out.data(), 68);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double want = c[i * n + j];
        for (int p = 0; p < k; ++p) {
          want += bf16_value(a[i * 2 * k + 2 * p]) * bf16_value(b[p * 2 * n + 2 * j]) +
                  bf16_value(a[i * 2 * k + 2 * p + 1]) * bf16_value(b[p * 2 * n + 2 * j + 1]);
        }
        float got;
        std::memcpy(&got, &out[i * 68 + 4 * j], 4);
        EXPECT_EQ(got, want) << "shape " << m << "x" << n << "x" << k << " at " << i << "," << j;
      }
      // The store writes the configured bytes of each row and nothing past them.
      for (int byte = 4 * n; byte < 68; ++byte) ASSERT_EQ(out[i * 68 + byte], 0xAB);
    }
    emu::release();
  }
}

// The even pair's product is added first, each rounded: (-2^30 + 2^30) + 1 is 1, where the other
// order, (-2^30 + 1) + 2^30, rounds the 1 away.
TEST(CpuAmxEmulation, DpBf16PsAddsTheEvenProductFirstRoundingEach) {
  const uint16_t a[2] = {bf16_bits(1.0f), bf16_bits(1.0f)};
  const uint16_t b[2] = {bf16_bits(0x1p30f), bf16_bits(1.0f)};
  EXPECT_EQ(dot_one_pair(a, b, -0x1p30f), 1.0f);
}

// Denormal bf16 inputs read as zero, denormal f32 results are flushed to zero.
TEST(CpuAmxEmulation, DpBf16PsFlushesDenormalInputsAndResults) {
  // The smallest bf16 denormal times 2^100: about 2^-33 without DAZ.
  const uint16_t denormal[2] = {0x0001, 0x0000}, big[2] = {bf16_bits(0x1p100f), 0x0000};
  EXPECT_EQ(dot_one_pair(denormal, big, 0.0f), 0.0f);
  // 2^-70 squared: 2^-140, an f32 denormal.
  const uint16_t tiny[2] = {bf16_bits(0x1p-70f), 0x0000};
  EXPECT_EQ(dot_one_pair(tiny, tiny, 0.0f), 0.0f);
}

TEST(CpuAmxEmulation, ZeroAndLoadConfigClearTiles) {
  configure(2, 2, 2);
  const float ones[4] = {1, 1, 1, 1};
  emu::loadd(0, ones, 8);
  emu::zero(0);
  float got[4] = {5, 5, 5, 5};
  emu::stored(0, got, 8);
  for (float x : got) EXPECT_EQ(x, 0.0f);
  emu::loadd(0, ones, 8);
  configure(2, 2, 2);  // LDTILECFG zeroes every tile
  emu::stored(0, got, 8);
  for (float x : got) EXPECT_EQ(x, 0.0f);
  emu::release();
}

TEST(CpuAmxEmulationDeathTest, ATileUsedWithoutAConfigurationOrWithShapesThatDoNotMultiply) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float buf[256] = {};
  EXPECT_DEATH(
      {
        emu::release();
        emu::loadd(0, buf, 64);
      },
      "tile used without a configuration");
  EXPECT_DEATH(
      {
        configure(4, 16, 16);
        TileConfig cfg;
        cfg.rows[0] = 4;
        cfg.colsb[0] = 64;
        cfg.rows[1] = 16;  // A's rows must be C's
        cfg.colsb[1] = 64;
        cfg.rows[2] = 16;
        cfg.colsb[2] = 64;
        emu::loadconfig(&cfg);
        emu::dpbf16ps(0, 1, 2);
      },
      "tile shapes that do not multiply");
}

}  // namespace
}  // namespace kvattn::cpu::amx
