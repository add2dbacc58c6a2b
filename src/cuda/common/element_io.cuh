// Reading and writing one element of any float dtype as f32 on the device, with the same
// rounding as the host (core/numeric.h): for the elementwise operations, where the dtype is a
// run-time value.
#pragma once

#include <cstdint>

#include "core/numeric.h"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

__device__ __forceinline__ float load_f32(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[offset];
    case DType::kF16:
      return num::f16_to_f32(static_cast<const uint16_t*>(base)[offset]);
    case DType::kBF16:
      return num::bf16_to_f32(static_cast<const uint16_t*>(base)[offset]);
    case DType::kE4M3:
      return num::e4m3_to_f32(static_cast<const uint8_t*>(base)[offset]);
    case DType::kE5M2:
      return num::e5m2_to_f32(static_cast<const uint8_t*>(base)[offset]);
    default:
      return 0.0f;
  }
}

// FP8 saturates (satfinite), like every quantization in kvattn.
__device__ __forceinline__ void store_f32(void* base, DType dtype, int64_t offset, float x) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[offset] = x;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[offset] = num::f32_to_f16(x);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[offset] = num::f32_to_bf16(x);
      break;
    case DType::kE4M3:
      static_cast<uint8_t*>(base)[offset] = num::f32_to_e4m3(x);
      break;
    case DType::kE5M2:
      static_cast<uint8_t*>(base)[offset] = num::f32_to_e5m2(x);
      break;
    default:
      break;
  }
}

// Element offset of index (i0, i1, ...) of a view with the given strides.
struct Strides4 {
  int64_t s[4] = {0, 0, 0, 0};
  __host__ __device__ int64_t at(int64_t i0, int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3];
  }
};

}  // namespace kvattn::cuda
