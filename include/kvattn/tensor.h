// A non-owning view of a tensor: pointer, dtype, shape and strides (in elements), device, and the
// size of the buffer it lives in so that validation can prove every access stays inside it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kvattn/dtype.h"

namespace kvattn {

inline constexpr int kMaxRank = 6;

enum class MemoryKind { kHost, kCuda };

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};  // in elements, each >= 0
  MemoryKind memory = MemoryKind::kHost;
  int device_index = 0;
  // Bytes of the buffer starting at `data` that the view may touch. Validation rejects a view
  // whose largest reachable offset does not fit. Set by the factories to the exact extent.
  int64_t buffer_bytes = 0;

  // An empty view means "not given" (optional arguments such as lse or custom_mask).
  bool empty() const { return data == nullptr && rank == 0; }

  int64_t dim(int i) const { return shape[i]; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Largest element offset + 1 that the view reaches (0 when any dim is 0).
  int64_t extent_elements() const;
  std::string shape_string() const;  // "[2, 8, 128]"

  template <class T>
  T* as() const { return static_cast<T*>(data); }

  // Row-major contiguous view; buffer_bytes = numel * dtype_size.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape);
  static TensorView contiguous(void* data, DType dtype, const int64_t* shape, int rank);
  // Explicit strides; buffer_bytes defaults to the exact extent the strides reach.
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, int64_t buffer_bytes = -1);
  static TensorView strided(void* data, DType dtype, const int64_t* shape, const int64_t* strides,
                            int rank, int64_t buffer_bytes = -1);
};

}  // namespace kvattn
