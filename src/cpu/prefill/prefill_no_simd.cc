// Builds without the x86 kernels (another architecture or compiler): only the scalar level.
#include "cpu/prefill/params.h"

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_avx2() { return nullptr; }
PrefillItemFn prefill_item_fn_avx512() { return nullptr; }
PrefillItemFn prefill_item_fn_avx512_bf16() { return nullptr; }
PrefillItemFn prefill_item_fn_amx() { return nullptr; }
}  // namespace kvattn::cpu::prefill
