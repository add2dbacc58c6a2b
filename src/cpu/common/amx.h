// What the AMX-BF16 kernels share (prefill/prefill_amx.cc, mla/mla_amx.cc): the tile
// configuration they run with and a 16 x 16 transpose of 32-bit words in registers. Include only
// from files built with the amx ISA flags (src/cpu/CMakeLists.txt), like the kernels themselves.
//
// Or built a second time with KVATTN_AMX_EMULATED, without the AMX flags: then the tile
// instructions the kernels use (_tile_loadconfig, _tile_release, _tile_loadd, _tile_stored,
// _tile_zero, _tile_dpbf16ps) are common/amx_emulation.h's, on a per-thread tile file, so that
// the same kernel bodies run, and are tested against the reference, on CPUs without AMX (the
// kernel table's "-emulated" entries, named only by the override: they are slow).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/common/amx_emulation.h"

#if defined(KVATTN_AMX_EMULATED)
// The file's exported entry points get their own names in the emulated build.
#define KVATTN_AMX_ENTRY(name) name##_emulated
#else
#define KVATTN_AMX_ENTRY(name) name
#endif

#if defined(KVATTN_AMX_EMULATED)
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
