// Builds without x86 vector kernels: MLA runs on the portable kernel.
#include "cpu/mla.h"

namespace kvattn::cpu {

MlaItemFn find_mla_kernel_avx512_bf16(const MlaParams&) { return nullptr; }

}  // namespace kvattn::cpu
