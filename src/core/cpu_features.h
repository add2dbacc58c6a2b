// CPU feature detection, once per process.
#pragma once

#include <string>

#include "kvattn/device.h"

namespace kvattn::detail {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false, avx512_vbmi = false;
  // vdpbf16ps retires at about the FMA instruction rate (two products per lane: twice the FMA
  // throughput), as on AMD Zen 4. On the Intel Xeons measured (Sapphire-Rapids class) it retires
  // at a quarter of the FMA rate, and the fp32-FMA kernels are faster there (issue 14 note):
  // set from the vendor (AMD), the kernels' choice between the two.
  bool fast_bf16_dot = false;
  // AMD (Zen): software prefetches of decode's next tile run faster into L1 (prefetcht0) than
  // into L2 (prefetcht1, the Intel Xeons' best): issue 23's Zen 4 note.
  bool amd = false;
  // AMX-BF16 and AMX-TILE (CPUID), with the tile state granted by the OS (Linux hands it out
  // only on request: arch_prctl ARCH_REQ_XCOMP_PERM, asked once here).
  bool amx_bf16 = false;
  CpuIsa best = CpuIsa::kScalar;  // what the hardware and OS allow
  std::string to_string() const;
};
const CpuFeatures& cpu_features();

// The ISA level kernels use: the hardware's best, lowered by set_cpu_isa_limit (tests). Which
// kernel runs is the cpu backend's kernel table's choice (src/cpu/kernel_table.h; its one
// override is KVATTN_CPU_KERNEL).
CpuIsa effective_cpu_isa();
void set_cpu_isa_limit(CpuIsa isa);  // for tests and debugging
void clear_cpu_isa_limit();

}  // namespace kvattn::detail
