// Reading and writing one element of any float dtype as f32 on the device, with the same
// rounding as the host (core/element_io.h): for the elementwise operations, where the dtype is a
// run-time value; and the strided addressing they use.
#pragma once

#include <cstdint>

#include "core/element_io.h"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// One element of a run-time dtype as f32 and back (FP8 saturating, like every quantization in
// kvattn): core/element_io.h, the same functions as the host's.
using io::load_f32;
using io::store_f32;

// Element offset of index (i0, i1, ...) of a view with the given strides.
struct Strides4 {
  int64_t s[4] = {0, 0, 0, 0};
  __host__ __device__ int64_t at(int64_t i0, int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3];
  }
};

}  // namespace kvattn::cuda
