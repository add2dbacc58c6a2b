// The prefill kernel for AVX-512 (F, BW, VL, DQ): 16 f32 lanes, 32 registers. Built with only
// this ISA's flags; reached through prefill_item_fn_avx512() when the CPU has it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/prefill/params.h"
#include "cpu/common/simd_avx512.h"

namespace kvattn::cpu::prefill::avx512 {
namespace {

#include "cpu/prefill/avx512_vec.h"  // before the kernel body, which uses Vec
#include "cpu/prefill/kernel.h"

}  // namespace
}  // namespace kvattn::cpu::prefill::avx512

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_avx512() { return &avx512::run_item; }
}  // namespace kvattn::cpu::prefill
