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
  CpuIsa best = CpuIsa::kScalar;  // what the hardware and OS allow
  std::string to_string() const;
};
const CpuFeatures& cpu_features();

// The ISA level kernels use: the hardware's best, lowered by KVATTN_CPU_ISA (scalar|avx2|avx512)
// or set_cpu_isa_limit. KVATTN_CPU_ISA=reference makes `auto` on the CPU pick the reference.
CpuIsa effective_cpu_isa();
bool cpu_forced_reference();
void set_cpu_isa_limit(CpuIsa isa);  // for tests and debugging
void clear_cpu_isa_limit();

}  // namespace kvattn::detail
