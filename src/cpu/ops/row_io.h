// The row helpers of the cpu backend's operations that are not attention (ops.h): element load
// and store of every DType through fp64 (core/element_io.h: values rounded once to the output
// dtype, as the reference does), strided addressing, and the pool's parallel-for over rows.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/element_io.h"
#include "cpu/common/thread_pool.h"
#include "kvattn/attention.h"

namespace kvattn::cpu::ops {

// Rows handed to a thread at a time: enough to amortize the hand-out, few enough to balance.
constexpr int64_t kRowsPerItem = 16;

inline double load(const TensorView& t, int64_t offset) {
  return io::load_f64(t.data, t.dtype, offset);
}
inline void store(const TensorView& t, int64_t offset, double value) {
  io::store_f64(t.data, t.dtype, offset, value);
}

inline int64_t at(const TensorView& t, int64_t i0) { return i0 * t.strides[0]; }
inline int64_t at(const TensorView& t, int64_t i0, int64_t i1) {
  return i0 * t.strides[0] + i1 * t.strides[1];
}
inline int64_t at(const TensorView& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2];
}
inline int64_t at(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

inline int32_t load_i32(const TensorView& t, int64_t i) { return t.as<const int32_t>()[at(t, i)]; }

// Runs fn(row) for rows [0, rows) in items of kRowsPerItem rows.
template <class Fn>
void for_rows(int num_threads, int64_t rows, Fn&& fn) {
  const int64_t items = (rows + kRowsPerItem - 1) / kRowsPerItem;
  ThreadPool::global().parallel_for(num_threads, items, [&](int64_t item, int) {
    const int64_t end = std::min(rows, (item + 1) * kRowsPerItem);
    for (int64_t row = item * kRowsPerItem; row < end; ++row) fn(row);
  });
}

}  // namespace kvattn::cpu::ops
