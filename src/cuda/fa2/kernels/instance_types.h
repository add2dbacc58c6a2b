// The dtype names kernel_set.cmake spells (f16, bf16, e4m3, e5m2) as kernel template arguments.
#pragma once

#include "cuda/common/ptx.cuh"
#include "cuda/fa2/kernels/kv_storage.cuh"

namespace kvattn::fa2 {

using QType_f16 = cuda::F16Tag;
using QType_bf16 = cuda::Bf16Tag;
using KVType_f16 = KvF16;
using KVType_bf16 = KvBf16;
using KVType_e4m3 = KvE4M3;
using KVType_e5m2 = KvE5M2;

}  // namespace kvattn::fa2
