// Element reads and writes for the reference: any storage dtype <-> double, through the strided
// views of kvattn::TensorView. Header-only so that the test-support baseline reads tensors the
// same way.
#pragma once

#include <cstdint>

#include "core/element_io.h"
#include "kvattn/tensor.h"

namespace kvattn::ref {

// The stored value of element `offset` (in elements) of a buffer of `dtype`, exactly.
inline double load_element(const void* data, DType dtype, int64_t offset) {
  return io::load_f64(data, dtype, offset);
}

// Writes `value` into element `offset` of a buffer of `dtype`, rounded once to nearest even
// (core/element_io.h): 16-bit floats overflow to inf as IEEE says; fp8 saturates (satfinite).
inline void store_element(void* data, DType dtype, int64_t offset, double value) {
  io::store_f64(data, dtype, offset, value);
}

// `value` rounded to `dtype` (RNE, fp8 saturating) and back, as a double.
inline double round_to_dtype(double value, DType dtype) {
  unsigned char scratch[8] = {};
  store_element(scratch, dtype, 0, value);
  return load_element(scratch, dtype, 0);
}

// Element offset of index (i0, i1, ...) of a view, in elements.
inline int64_t offset_of(const TensorView& t, int64_t i0) { return i0 * t.strides[0]; }
inline int64_t offset_of(const TensorView& t, int64_t i0, int64_t i1) {
  return i0 * t.strides[0] + i1 * t.strides[1];
}
inline int64_t offset_of(const TensorView& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2];
}
inline int64_t offset_of(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

template <class... I>
double load(const TensorView& t, I... index) {
  return load_element(t.data, t.dtype, offset_of(t, index...));
}
template <class... I>
void store(const TensorView& t, double value, I... index) {
  store_element(t.data, t.dtype, offset_of(t, index...), value);
}
inline int32_t load_i32(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

}  // namespace kvattn::ref
