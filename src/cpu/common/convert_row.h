// A row of stored elements, its dtype a run-time value, as f32 through an ISA's row conversion
// (S::convert_row<T> of simd_<isa>.h): the prefill kernels' staging of K/V rows and the decode
// kernels' query rows. S is always a file-local type (internal linkage), so each ISA's file
// instantiates its own copy.
#pragma once

#include "kvattn/dtype.h"

namespace kvattn::cpu {

// n contiguous stored elements of `dtype` at src as real f32 times `scale`, into dst; other
// dtypes (not stored K/V/Q types) write nothing.
template <class S>
void convert_row_as_f32(const void* src, DType dtype, int n, float scale, float* dst) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  switch (dtype) {
    case DType::kF32:
      return S::template convert_row<DType::kF32>(bytes, n, scale, dst);
    case DType::kF16:
      return S::template convert_row<DType::kF16>(bytes, n, scale, dst);
    case DType::kBF16:
      return S::template convert_row<DType::kBF16>(bytes, n, scale, dst);
    case DType::kE4M3:
      return S::template convert_row<DType::kE4M3>(bytes, n, scale, dst);
    case DType::kE5M2:
      return S::template convert_row<DType::kE5M2>(bytes, n, scale, dst);
    default:
      return;
  }
}

}  // namespace kvattn::cpu
