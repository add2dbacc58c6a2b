// What the AMX-BF16 kernels share (prefill/prefill_amx.cc, mla/mla_amx.cc): the tile
// configuration they run with (their 16 x 16 transpose of 32-bit words in registers is
// simd_avx512.h's transpose16, which the bf16-dot prefill kernel takes too). Include only
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

}  // namespace kvattn::cpu::amx
