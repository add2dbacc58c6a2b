// The dtype names kernel_set.cmake spells (f16, bf16, e4m3, e5m2) as kernel template arguments.
#pragma once

#include "cuda/fa2/kernels/formats.h"

namespace kvattn::fa2 {

using QType_f16 = F16Format;
using QType_bf16 = Bf16Format;
using KVType_f16 = KvF16;
using KVType_bf16 = KvBf16;
using KVType_e4m3 = KvE4M3;
using KVType_e5m2 = KvE5M2;

}  // namespace kvattn::fa2
