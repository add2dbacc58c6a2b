// The AMX tile configuration (palette 1) and an emulation of the tile instructions the kernels
// use, in plain C++: each thread's tile file in memory, TDPBF16PS as the SDM defines it. Included
// by common/amx.h, which binds the intrinsics' names to it in the emulated build
// (KVATTN_AMX_EMULATED), and by its own test (tests/cpu/amx_emulation_test.cc), on any CPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace kvattn::cpu::amx {

// LDTILECFG's 64-byte operand, palette 1: bytes per row and rows of each of the 8 tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace kvattn::cpu::amx

namespace kvattn::cpu::amx::emulated {

// The tile file of one thread: palette 1's 8 tiles of up to 16 rows x 64 bytes, and the shape
// each was configured with (0 rows: not configured).
struct TileFile {
  alignas(64) uint8_t data[8][16][64];
  int rows[8];
  int colsb[8];
};
inline thread_local TileFile tiles{};

[[noreturn]] inline void fault(const char* what, int tile) {
  std::fprintf(stderr, "kvattn: emulated AMX: %s (tile %d)\n", what, tile);
  std::abort();
}
inline void check(int t) {
  if (t < 0 || t >= 8 || tiles.rows[t] == 0) fault("tile used without a configuration", t);
}

inline void loadconfig(const void* config) {
  const auto* cfg = static_cast<const TileConfig*>(config);
  if (cfg->palette != 1) fault("palette other than 1", -1);
  for (int t = 0; t < 8; ++t) {
    if (cfg->rows[t] > 16 || cfg->colsb[t] > 64 || cfg->colsb[t] % 4 != 0) fault("tile shape", t);
    tiles.rows[t] = cfg->rows[t];
    tiles.colsb[t] = cfg->colsb[t];
  }
  std::memset(tiles.data, 0, sizeof(tiles.data));
}
inline void release() {
  for (int t = 0; t < 8; ++t) tiles.rows[t] = tiles.colsb[t] = 0;
}
inline void loadd(int t, const void* base, long stride) {
  check(t);
  for (int r = 0; r < tiles.rows[t]; ++r) {
    std::memcpy(tiles.data[t][r], static_cast<const uint8_t*>(base) + r * stride, tiles.colsb[t]);
  }
}
inline void stored(int t, void* base, long stride) {
  check(t);
  for (int r = 0; r < tiles.rows[t]; ++r) {
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, tiles.data[t][r], tiles.colsb[t]);
  }
}
inline void zero(int t) {
  check(t);
  std::memset(tiles.data[t], 0, sizeof(tiles.data[t]));
}

// A bf16 word as f32, a denormal read as zero (TDPBF16PS's DAZ).
inline float bf16_daz(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  if ((h & 0x7F80) == 0) h &= 0x8000;
  const uint32_t bits = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}
// TDPBF16PS as the SDM writes it: C[m][n] (f32) += A[m][2k] * B[k][2n] + A[m][2k + 1] *
// B[k][2n + 1] over k = 0 .. colsb(A) / 4 - 1, one rounding per product added (the even pair
// first), denormal inputs read as zero and denormal results flushed to zero.
inline void dpbf16ps(int c, int a, int b) {
  check(c);
  check(a);
  check(b);
  const int m_rows = tiles.rows[c], n_cols = tiles.colsb[c] / 4, k_pairs = tiles.colsb[a] / 4;
  if (tiles.rows[a] != m_rows || tiles.rows[b] != k_pairs || tiles.colsb[b] != tiles.colsb[c]) {
    fault("tile shapes that do not multiply", c);
  }
  for (int m = 0; m < m_rows; ++m) {
    float acc[16];
    std::memcpy(acc, tiles.data[c][m], sizeof(float) * n_cols);
    for (int k = 0; k < k_pairs; ++k) {
      const float a0 = bf16_daz(&tiles.data[a][m][4 * k]);
      const float a1 = bf16_daz(&tiles.data[a][m][4 * k + 2]);
      for (int n = 0; n < n_cols; ++n) {
        float x = std::fma(a0, bf16_daz(&tiles.data[b][k][4 * n]), acc[n]);
        if (std::fabs(x) < std::numeric_limits<float>::min()) x = std::copysign(0.0f, x);
        x = std::fma(a1, bf16_daz(&tiles.data[b][k][4 * n + 2]), x);
        if (std::fabs(x) < std::numeric_limits<float>::min()) x = std::copysign(0.0f, x);
        acc[n] = x;
      }
    }
    std::memcpy(tiles.data[c][m], acc, sizeof(float) * n_cols);
  }
}

}  // namespace kvattn::cpu::amx::emulated
