// What the AMX-BF16 kernels share (prefill/prefill_amx.cc, mla/mla_amx.cc): the tile
// configuration they run with and a 16 x 16 transpose of 32-bit words in registers. Include only
// from files built with the amx ISA flags (src/cpu/CMakeLists.txt), like the kernels themselves.
//
// Or built a second time with KVATTN_AMX_EMULATED and the AVX512_BF16 flags only: then the tile
// instructions the kernels use (_tile_loadconfig, _tile_release, _tile_loadd, _tile_stored,
// _tile_zero, _tile_dpbf16ps) are emulated below, on a per-thread tile file, so that the same
// kernel bodies run, and are tested against the reference, on CPUs without AMX (the kernel
// table's "-emulated" entries, named only by the override: they are slow).
#pragma once

#include <immintrin.h>

#include <cstdint>

#if defined(KVATTN_AMX_EMULATED)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
// The file's exported entry points get their own names in the emulated build.
#define KVATTN_AMX_ENTRY(name) name##_emulated
#else
#define KVATTN_AMX_ENTRY(name) name
#endif

namespace kvattn::cpu::amx {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace kvattn::cpu::amx

#if defined(KVATTN_AMX_EMULATED)
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

// The intrinsics' names, bound to the emulation (immintrin.h defines them whatever the flags).
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) ::kvattn::cpu::amx::emulated::loadconfig(config)
#define _tile_release() ::kvattn::cpu::amx::emulated::release()
#define _tile_loadd(t, base, stride) ::kvattn::cpu::amx::emulated::loadd(t, base, stride)
#define _tile_stored(t, base, stride) ::kvattn::cpu::amx::emulated::stored(t, base, stride)
#define _tile_zero(t) ::kvattn::cpu::amx::emulated::zero(t)
#define _tile_dpbf16ps(c, a, b) ::kvattn::cpu::amx::emulated::dpbf16ps(c, a, b)
#endif

namespace kvattn::cpu::amx {

// Every tile 16 rows x 64 bytes: 0-3 accumulate (C), 4-5 hold A, 6-7 B.
inline void load_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// r[i] becomes column i of the 16 x 16 matrix of 32-bit words whose row i was r[i]: unpacks of
// words, then of word pairs, then two rounds of 128-bit lane shuffles.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // r[4g + c], 128-bit lane k: column 4k + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);           // lanes 0, 2
    t[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);       // lanes 1, 3
    t[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);  // lanes 0, 2
    t[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
  }
}

}  // namespace kvattn::cpu::amx

