// A row of stored elements, its dtype a run-time value, as f32 through an ISA's row conversion
// (S::convert_row<T> of simd_<isa>.h): the prefill kernels' query and K/V rows and the decode
// kernels' query rows. S is always a file-local type (internal linkage), so each ISA's file
// instantiates its own copy.
#pragma once

#include <cstdint>
#include <cstring>

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

// n elements of `dtype` `stride` elements apart at src, as real f32 times `scale`, into dst: a
// unit-stride row converted in place, a strided one gathered 64 elements at a time into a packed
// buffer first (the same conversion, so a strided view gives the contiguous one's bits).
template <class S>
void load_row_as_f32(const void* src, DType dtype, int n, int64_t stride, float scale, float* dst) {
  if (stride == 1) return convert_row_as_f32<S>(src, dtype, n, scale, dst);
  const auto esize = static_cast<int64_t>(dtype_size(dtype));
  constexpr int kChunk = 64;
  alignas(64) unsigned char packed[kChunk * 4];
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (int at = 0; at < n; at += kChunk) {
    const int m = n - at < kChunk ? n - at : kChunk;
    for (int e = 0; e < m; ++e) {
      std::memcpy(packed + e * esize, bytes + (at + e) * stride * esize, esize);
    }
    convert_row_as_f32<S>(packed, dtype, m, scale, dst + at);
  }
}

}  // namespace kvattn::cpu
