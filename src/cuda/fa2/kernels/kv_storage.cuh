// How a K/V cache element is stored and read back as f32 inside a kernel. FP8 (and the other
// 16-bit type) is decoded here, in shared memory, before the 16-bit MMA; the per-tensor scales
// are not applied per element but folded into the score scale (K) and the output (V).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/numeric.h"

namespace kvattn::fa2 {

struct KvBf16 {
  using Raw = uint16_t;
  static __device__ __forceinline__ float to_float(Raw x) { return num::bf16_to_f32(x); }
};
struct KvF16 {
  using Raw = uint16_t;
  static __device__ __forceinline__ float to_float(Raw x) {
    return __half2float(__ushort_as_half(x));
  }
};
// FP8 decodes are exact in f16/bf16 (and f32); the hardware conversion exists from SM89 and is
// emulated on SM80.
struct KvE4M3 {
  using Raw = uint8_t;
  static __device__ __forceinline__ float to_float(Raw x) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(x), __NV_E4M3);
    return __half2float(__half(h));
  }
};
struct KvE5M2 {
  using Raw = uint8_t;
  static __device__ __forceinline__ float to_float(Raw x) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(x), __NV_E5M2);
    return __half2float(__half(h));
  }
};

}  // namespace kvattn::fa2
