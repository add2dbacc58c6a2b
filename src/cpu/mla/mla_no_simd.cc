// Builds without x86 vector kernels: MLA runs on the portable kernel.
#include "cpu/mla/mla.h"

namespace kvattn::cpu {

MlaItemFn find_mla_kernel_avx512_bf16(const MlaParams&) { return nullptr; }
MlaItemFn find_mla_kernel_amx(const MlaParams&) { return nullptr; }
MlaItemFn find_mla_kernel_avx2(const MlaParams&) { return nullptr; }
bool mla_e4m3_to_bf16(const uint8_t*, int, uint16_t*) { return false; }

}  // namespace kvattn::cpu
